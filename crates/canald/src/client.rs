//! The client side of the control protocol (canal stat, canal vm, canal run
//! --isolate): connect and check the daemon, one request and its reply.
#![forbid(unsafe_code)]

use crate::sys;
use canal_abi::control::{self, kind, CTL_MAX};
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

/// Connects to the canald at `path` and checks it is ours (its uid, or root) before
/// anything is sent (docs/threat-model.md).
pub(crate) fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = sys::seqpacket_connect(path)?;
    crate::ctldir::check_daemon(&fd, path)
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
    Ok(fd)
}

/// Sends one request (`k`, `body`, descriptors `fds`) and returns the body of the
/// reply of kind `want`; an ERROR reply is its errno with canald's text.
pub(crate) fn roundtrip(
    fd: &OwnedFd,
    k: u16,
    body: &[u8],
    fds: &[i32],
    want: u16,
) -> io::Result<Vec<u8>> {
    let mut m = control::encode_header(k, body.len() as u32).to_vec();
    m.extend_from_slice(body);
    sys::send_with_fds(fd, &m, fds, false)?;
    let mut buf = vec![0u8; CTL_MAX];
    let (rk, rb, _) = recv_msg(fd, &mut buf)?;
    match rk {
        kind::ERROR => Err(error_reply(&rb)),
        k if k == want => Ok(rb),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "unexpected reply from canald",
        )),
    }
}

fn recv_msg(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(u16, Vec<u8>, Vec<OwnedFd>)> {
    let r =
        sys::recv_with_fds(fd, buf)?.ok_or_else(|| io::Error::from_raw_os_error(libc::EAGAIN))?;
    if r.len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "canald closed the connection",
        ));
    }
    let (k, body) = control::decode(&buf[..r.len])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed reply"))?;
    Ok((k, body.to_vec(), r.fds))
}

fn error_reply(body: &[u8]) -> io::Error {
    if body.len() >= 4 {
        let e = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
        let text = String::from_utf8_lossy(&body[4..]);
        io::Error::new(
            io::Error::from_raw_os_error(e).kind(),
            format!("canald: {text} ({})", io::Error::from_raw_os_error(e)),
        )
    } else {
        io::Error::other("canald: error")
    }
}

/// Asks the canald at `path` for its listing: JSON, or the text table if `text`.
pub fn fetch_stat(path: &Path, text: bool) -> io::Result<String> {
    fetch_listing(path, if text { 1 } else { 0 })
}

/// The listing in the Prometheus text format (`canal stat --prometheus`).
pub fn fetch_metrics(path: &Path) -> io::Result<String> {
    fetch_listing(path, 2)
}

/// STAT with `format` (protocol §2: 0 JSON, 1 text, 2 Prometheus).
fn fetch_listing(path: &Path, format: u32) -> io::Result<String> {
    listing_over(&connect(path)?, format)
}

/// STAT over a connection already made (and checked).
pub(crate) fn listing_over(fd: &OwnedFd, format: u32) -> io::Result<String> {
    let mut m = control::encode_header(kind::STAT, 4).to_vec();
    m.extend_from_slice(&format.to_le_bytes());
    sys::send_with_fds(fd, &m, &[], false)?;
    let mut buf = vec![0u8; CTL_MAX];
    let mut out = Vec::new();
    loop {
        let (k, body, _) = recv_msg(fd, &mut buf)?;
        match k {
            kind::STAT_CHUNK if body.is_empty() => break,
            kind::STAT_CHUNK => out.extend_from_slice(&body),
            kind::ERROR => return Err(error_reply(&body)),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unexpected reply",
                ))
            }
        }
    }
    String::from_utf8(out).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}
