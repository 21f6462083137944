//! `canald --metrics ADDR`: the Prometheus text exposition over HTTP at /metrics, on a
//! thread of its own. Each scrape asks canald's own control socket for the listing
//! (STAT, format 2), so the pollers never wait on a scraper; one scrape at a time, with
//! a 5 s limit on reading its request.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// `PORT` (on 127.0.0.1), `IP:PORT` or `[IPv6]:PORT`.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("'{s}' is not PORT, IP:PORT or [IPv6]:PORT"))
}

/// Binds `addr` and serves scrapes of the canald at `socket` until the process ends.
/// Returns the bound address (port 0 picks one).
pub fn start(addr: SocketAddr, socket: PathBuf) -> io::Result<SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    std::thread::Builder::new()
        .name("canald-metrics".into())
        .spawn(move || {
            for c in l.incoming().flatten() {
                if let Err(e) = scrape(c, &socket) {
                    log::info!("metrics: {e}");
                }
            }
        })?;
    Ok(bound)
}

fn scrape(mut c: TcpStream, socket: &std::path::Path) -> io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    c.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let mut words = line.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => match crate::client::fetch_metrics(socket) {
            Ok(text) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text),
            Err(e) => (
                "503 Service Unavailable",
                "text/plain",
                format!("canald: {e}\n"),
            ),
        },
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain",
            "canald metrics: GET /metrics (Prometheus text format)\n".into(),
        ),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes())?;
    if method != "HEAD" {
        c.write_all(body.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(parse_addr("0.0.0.0:80").unwrap().to_string(), "0.0.0.0:80");
        assert_eq!(parse_addr("[::1]:9").unwrap().to_string(), "[::1]:9");
        assert!(parse_addr("localhost:9").is_err());
    }
}
