//! Streaming a file into the server over HTTP: the INSERT that chpart exists to replace.
//!
//! The reference row of the build benchmark sends the same Parquet file to the server with
//! `INSERT ... FORMAT Parquet`, the way a batch job without chpart loads ClickHouse, so the
//! server's CPU for that can be set beside chpart's (none: chpart's server work is ATTACH at
//! commit). The file is streamed from disk with a `Content-Length` body rather than read into
//! memory, so the benchmark's own footprint stays small at any row count. The test harness's
//! client only sends SQL text bodies, hence this one function; [`sql`] is that client, with
//! the statement in its errors.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use chpart_testenv::clickhouse::ClickHouse;

/// Runs one statement on `server` (the test harness's HTTP client); an error names the
/// statement (its first 300 characters).
pub fn sql(server: &ClickHouse, statement: &str) -> anyhow::Result<String> {
    server
        .query(statement)
        .map_err(|e| anyhow::anyhow!("{}: {e}", statement.chars().take(300).collect::<String>()))
}

/// POSTs the file at `path` as the body of `query` to the server's HTTP port on 127.0.0.1.
pub fn post_file(port: u16, query: &str, path: &Path) -> anyhow::Result<()> {
    post_file_to(std::net::Ipv4Addr::LOCALHOST, port, query, path)
}

/// [`post_file`] to a server on the loopback address `host` (a node of a test cluster).
pub fn post_file_to(
    host: std::net::Ipv4Addr,
    port: u16,
    query: &str,
    path: &Path,
) -> anyhow::Result<()> {
    let mut file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let length = file.metadata()?.len();
    let mut stream = TcpStream::connect((host, port))
        .with_context(|| format!("connect to the server on {host}:{port}"))?;
    // An INSERT of millions of rows answers only when it is done.
    stream.set_read_timeout(Some(Duration::from_secs(3600)))?;
    write!(
        stream,
        "POST /?query={} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n\
         Connection: close\r\n\r\n",
        percent_encode(query)
    )?;
    std::io::copy(&mut file, &mut stream).context("send the file to the server")?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .context("read the server's answer")?;
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        let body = text.split_once("\r\n\r\n").map_or(&*text, |(_, b)| b);
        bail!("server answered HTTP {status} to {query}: {}", body.trim());
    }
    Ok(())
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            percent_encode("INSERT INTO db.t FORMAT Parquet"),
            "INSERT%20INTO%20db.t%20FORMAT%20Parquet"
        );
        assert_eq!(percent_encode("a&b=c'é"), "a%26b%3Dc%27%C3%A9");
    }
}
