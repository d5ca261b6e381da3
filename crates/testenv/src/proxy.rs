//! A TCP proxy that injects network faults between chpart and a real component (ClickHouse's
//! HTTP port, sshd): connections cut in the middle of a request or an upload, a host that
//! refuses every connection for a while, a host that accepts and never answers. The component
//! behind it is the real one; only the path to it fails.
//!
//! Each accepted connection gets its own upstream connection and two copying threads. A cut
//! shuts both sockets down, so both ends see the connection end mid-stream.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What the proxy does with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward it.
    Pass,
    /// Close it at once (a host that is down, or restarting).
    Refuse,
    /// Accept it and forward nothing, either way (a host that hangs).
    Stall,
    /// Forward it, each chunk after this delay, either way (a slow or distant link: this
    /// machine's kernel has no `netem`).
    Slow(std::time::Duration),
}

struct State {
    target: SocketAddr,
    mode: Mutex<Mode>,
    /// Live connections: (client side, upstream side), for cuts.
    live: Mutex<Vec<(TcpStream, Option<TcpStream>)>>,
    /// Client-to-upstream bytes still to forward before every live connection is cut (one
    /// shot; `u64::MAX`: no cut armed).
    cut_after: AtomicU64,
    cuts: AtomicUsize,
    accepted: AtomicUsize,
    /// Client-to-upstream bytes forwarded so far.
    sent: AtomicU64,
    stop: AtomicBool,
}

impl State {
    fn cut_all(&self) {
        let live = std::mem::take(&mut *self.live.lock().unwrap_or_else(|p| p.into_inner()));
        for (client, upstream) in live {
            let _ = client.shutdown(Shutdown::Both);
            if let Some(upstream) = upstream {
                let _ = upstream.shutdown(Shutdown::Both);
            }
        }
        self.cuts.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts `n` forwarded client bytes; cuts every connection when an armed cut is due.
    fn forwarded(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::SeqCst);
        let mut left = self.cut_after.load(Ordering::SeqCst);
        while left != u64::MAX {
            let next = left.saturating_sub(n);
            let armed = if next == 0 { u64::MAX } else { next };
            match self
                .cut_after
                .compare_exchange(left, armed, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    if next == 0 {
                        self.cut_all();
                    }
                    return;
                }
                Err(now) => left = now,
            }
        }
    }
}

/// A fault-injecting TCP proxy on 127.0.0.1, in front of `target`.
pub struct FaultProxy {
    /// The port chpart connects to instead of the target's.
    pub port: u16,
    state: Arc<State>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy on a free port of 127.0.0.1, forwarding to `target`.
    pub fn start(target: SocketAddr) -> FaultProxy {
        let port = crate::free_port_on(Ipv4Addr::LOCALHOST);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .unwrap_or_else(|e| panic!("fault proxy: bind 127.0.0.1:{port}: {e}"));
        let state = Arc::new(State {
            target,
            mode: Mutex::new(Mode::Pass),
            live: Mutex::new(Vec::new()),
            cut_after: AtomicU64::new(u64::MAX),
            cuts: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let shared = state.clone();
        let acceptor = std::thread::spawn(move || accept_loop(listener, shared));
        FaultProxy {
            port,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// What happens to connections from now on (live ones are not touched).
    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }

    /// Cuts every live connection now.
    pub fn cut_all(&self) {
        self.state.cut_all();
    }

    /// Cuts every live connection once `bytes` more bytes went from clients to the target.
    pub fn cut_after_bytes(&self, bytes: u64) {
        self.state.cut_after.store(bytes.max(1), Ordering::SeqCst);
    }

    /// Whether an armed cut is still to come.
    pub fn cut_pending(&self) -> bool {
        self.state.cut_after.load(Ordering::SeqCst) != u64::MAX
    }

    /// Cuts so far.
    pub fn cuts(&self) -> usize {
        self.state.cuts.load(Ordering::SeqCst)
    }

    /// Bytes forwarded from clients to the target so far (an upload's progress).
    pub fn sent_bytes(&self) -> u64 {
        self.state.sent.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        self.state.cut_all();
    }
}

fn accept_loop(listener: TcpListener, state: Arc<State>) {
    for client in listener.incoming() {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        state.accepted.fetch_add(1, Ordering::SeqCst);
        let mode = *state.mode.lock().unwrap_or_else(|p| p.into_inner());
        match mode {
            Mode::Refuse => drop(client),
            // Held, never read, until cut or the proxy stops.
            Mode::Stall => state
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((client, None)),
            Mode::Pass => {
                let state = state.clone();
                std::thread::spawn(move || forward(client, state, None));
            }
            Mode::Slow(delay) => {
                let state = state.clone();
                std::thread::spawn(move || forward(client, state, Some(delay)));
            }
        }
    }
}

fn forward(client: TcpStream, state: Arc<State>, delay: Option<std::time::Duration>) {
    let Ok(upstream) = TcpStream::connect(state.target) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = (
        client.try_clone(),
        upstream.try_clone(),
        client.try_clone(),
        upstream.try_clone(),
    ) else {
        return;
    };
    state
        .live
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((c3, Some(u3)));
    let up_state = state.clone();
    let up = std::thread::spawn(move || copy(client, upstream, Some(&up_state), delay));
    copy(u2, c2, None, delay);
    let _ = up.join();
}

/// Copies `from` into `to` until either ends, each chunk after `delay`; counts bytes when
/// `state` is given.
fn copy(
    mut from: TcpStream,
    mut to: TcpStream,
    state: Option<&State>,
    delay: Option<std::time::Duration>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(state) = state {
            state.forwarded(n as u64);
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
