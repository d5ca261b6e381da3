//! Host names resolved once per command: the HTTP client's DNS lookups go through a
//! [`Resolver`] that keeps the first answer for each name for the rest of the process (one
//! chpart command), so a command talks to one address per host even if DNS changes or fails
//! meanwhile. A failed lookup is not kept: it fails that request as a transport error, which
//! the caller retries like any transient fault ([`crate::retry::Retrying`]).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

/// Looks a host name up (port 0): the system resolver in production, a test's fault around it.
pub type Lookup = Arc<dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// The system resolver (`getaddrinfo`), on a blocking thread.
pub fn system_lookup() -> Lookup {
    Arc::new(|host: &str| Ok((host, 0).to_socket_addrs()?.collect()))
}

/// A resolver that keeps each name's first successful answer.
#[derive(Clone)]
pub struct Resolver {
    lookup: Lookup,
    known: Arc<Mutex<HashMap<String, Vec<SocketAddr>>>>,
}

impl Resolver {
    /// Resolves with `lookup`, once per name.
    pub fn new(lookup: Lookup) -> Resolver {
        Resolver {
            lookup,
            known: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let (lookup, known) = (self.lookup.clone(), self.known.clone());
        Box::pin(async move {
            let host = name.as_str().to_owned();
            if let Some(addrs) = known.lock().unwrap_or_else(|p| p.into_inner()).get(&host) {
                return Ok(addrs.clone().into_iter());
            }
            let looked = tokio::task::spawn_blocking({
                let host = host.clone();
                move || lookup(&host)
            })
            .await
            .map_err(io::Error::other)?;
            let addrs =
                looked.map_err(|e| io::Error::new(e.kind(), format!("resolving {host}: {e}")))?;
            if addrs.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("resolving {host}: no address"),
                ));
            }
            // A lookup that raced this one may have been kept first: everyone uses that one.
            let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
            Ok(known.entry(host).or_insert(addrs).clone().into_iter())
        })
    }
}
