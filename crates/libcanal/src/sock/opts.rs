//! Socket options: timeouts kept in the library, TCP_NODELAY and the keepalive options
//! of a stream in its entry (`kept`); everything else as a request to canald.
use crate::conn::request::request;
use crate::sock::core::dead_err;
use crate::sock::core::Sock;
use crate::sock::kept::Kept;
use canal_abi::op;
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;
use libc::c_int;

// Option names answered by the library (x86-64/aarch64 values; the _NEW variants take
// the same 64-bit timeval).
const SO_RCVTIMEO_OLD: c_int = 20;

const SO_SNDTIMEO_OLD: c_int = 21;

const SO_RCVTIMEO_NEW: c_int = 66;

const SO_SNDTIMEO_NEW: c_int = 67;

/// Timeout option → (is_receive).
fn timeo_opt(level: c_int, name: c_int) -> Option<bool> {
    if level != libc::SOL_SOCKET {
        return None;
    }
    match name {
        SO_RCVTIMEO_OLD | SO_RCVTIMEO_NEW => Some(true),
        SO_SNDTIMEO_OLD | SO_SNDTIMEO_NEW => Some(false),
        _ => None,
    }
}

/// Whether (`level`, `name`) is SO_RCVTIMEO or SO_SNDTIMEO (either variant).
pub(crate) fn is_timeout(level: c_int, name: c_int) -> bool {
    timeo_opt(level, name).is_some()
}

/// timeval bytes → nanoseconds (0 = no timeout), with Linux's rules.
pub(crate) fn timeval_to_ns(b: &[u8]) -> Result<u64, i32> {
    if b.len() < 16 {
        return Err(libc::EINVAL);
    }
    let sec = i64::from_ne_bytes(b[0..8].try_into().unwrap());
    let usec = i64::from_ne_bytes(b[8..16].try_into().unwrap());
    if !(0..1_000_000).contains(&usec) {
        return Err(libc::EDOM);
    }
    if sec < 0 {
        // Linux: a negative timeout means "do not wait".
        return Ok(1);
    }
    Ok((sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(usec as u64 * 1000))
}

pub(crate) fn ns_to_timeval(ns: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&((ns / 1_000_000_000) as i64).to_ne_bytes());
    b[8..16].copy_from_slice(&(((ns % 1_000_000_000) / 1000) as i64).to_ne_bytes());
    b
}

/// Options the library answers itself (timeouts, kept options, SO_ERROR…) of a socket
/// another process passed on (HANDED_OVER) belong to the kernel socket: EBADF, and the
/// hook follows it there (handoff.rs), as for calls that reach canald.
fn not_handed_over(s: &Sock) -> Result<(), i32> {
    if s.handed_over() {
        return Err(libc::EBADF);
    }
    Ok(())
}

pub(crate) fn setsockopt(s: Sock, level: c_int, name: c_int, val: &[u8]) -> Result<(), i32> {
    dead_err(s.g, false)?;
    not_handed_over(&s)?;
    if let Some(rcv) = timeo_opt(level, name) {
        let ns = timeval_to_ns(val)?;
        if rcv {
            s.e.rcvtimeo_ns.store(ns, Ordering::Relaxed);
        } else {
            s.e.sndtimeo_ns.store(ns, Ordering::Relaxed);
        }
        return Ok(());
    }
    let kept = Kept::of(level, name);
    if let Some(k) = kept.filter(|_| s.kind() == sock_kind::STREAM) {
        update_kept(&s, |w| k.set(w, val))?;
        if !s.short_circuited() {
            // canald applies it to the host socket in the round that takes this bit.
            crate::conn::request::attention(s.g, s.idx);
        }
        return Ok(());
    }
    if val.len() > canal_abi::SLOT_PAYLOAD {
        return Err(libc::EINVAL);
    }
    // SO_RCVLOWAT on a stream comes back as the kernel applied it (§3.4 `rcvlowat`).
    let mut applied = [0u8; 4];
    let (_, n) = request(
        s.g,
        op::SETSOCKOPT,
        s.handle,
        [level as u64, name as u64, 0, 0],
        val,
        &mut applied,
    )?;
    if level == libc::SOL_SOCKET && name == libc::SO_LINGER && val.len() >= 8 {
        // canald accepted it (it emulates SO_LINGER): remember it for close.
        let on = i32::from_ne_bytes([val[0], val[1], val[2], val[3]]) != 0;
        let secs = i32::from_ne_bytes([val[4], val[5], val[6], val[7]]);
        let word = if on {
            1u32.saturating_add(if secs < 0 { u32::MAX } else { secs as u32 })
        } else {
            0
        };
        s.e.linger.store(word, Ordering::Relaxed);
    }
    if let Some(k) = kept {
        // The kernel took it: remember it for an accepted connection to inherit, and
        // for this socket once it is short-circuited. Same checks, so no error here.
        let _ = update_kept(&s, |w| k.set(w, val));
    }
    if is_rcvlowat(level, name) && s.kind() != sock_kind::DGRAM && n == 4 {
        // Readiness and blocking receives follow it from now on; a poll asleep for
        // the old mark looks again (the kernel's tcp_set_rcvlowat wakes it too).
        let v = i32::from_ne_bytes(applied).max(1) as u32;
        s.e.rcvlowat.store(v, Ordering::Relaxed);
        crate::conn::sleep::wake_local(s.g, s.idx);
    }
    Ok(())
}

fn is_rcvlowat(level: c_int, name: c_int) -> bool {
    level == libc::SOL_SOCKET && name == libc::SO_RCVLOWAT
}

/// Applies `f` to the entry's kept options atomically (threads may set options at once).
fn update_kept(s: &Sock, f: impl Fn(u64) -> Result<u64, i32>) -> Result<(), i32> {
    let mut err = 0;
    let r =
        s.e.options
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                f(w).map_err(|e| err = e).ok()
            });
    r.map(|_| ()).map_err(|_| err)
}

/// getsockopt: writes up to `out.len()` bytes, returns the option's real length.
pub(crate) fn getsockopt(s: Sock, level: c_int, name: c_int, out: &mut [u8]) -> Result<usize, i32> {
    dead_err(s.g, false)?;
    not_handed_over(&s)?;
    let int = |v: i32, out: &mut [u8]| {
        let b = v.to_ne_bytes();
        let n = out.len().min(4);
        out[..n].copy_from_slice(&b[..n]);
        Ok(n)
    };
    if let Some(rcv) = timeo_opt(level, name) {
        let ns = if rcv {
            &s.e.rcvtimeo_ns
        } else {
            &s.e.sndtimeo_ns
        }
        .load(Ordering::Relaxed);
        let b = ns_to_timeval(ns);
        let n = out.len().min(16);
        out[..n].copy_from_slice(&b[..n]);
        return Ok(n);
    }
    if let Some(v) = Kept::of(level, name)
        .filter(|_| s.kind() == sock_kind::STREAM)
        .and_then(|k| k.get(s.e.options.load(Ordering::Relaxed)))
    {
        return int(v, out);
    }
    if is_rcvlowat(level, name) && s.kind() != sock_kind::DGRAM {
        // The library's own (canald keeps the host socket's at 1).
        return int(s.e.rcvlowat.load(Ordering::Relaxed).max(1) as i32, out);
    }
    if level == libc::SOL_SOCKET {
        let kind = s.kind();
        match name {
            libc::SO_ERROR => return int(s.take_error() as i32, out),
            libc::SO_TYPE => {
                return int(
                    if kind == sock_kind::DGRAM {
                        libc::SOCK_DGRAM
                    } else {
                        libc::SOCK_STREAM
                    },
                    out,
                )
            }
            libc::SO_PROTOCOL => {
                return int(
                    if kind == sock_kind::DGRAM {
                        libc::IPPROTO_UDP
                    } else {
                        libc::IPPROTO_TCP
                    },
                    out,
                )
            }
            libc::SO_DOMAIN => return int(s.e.family.load(Ordering::Relaxed) as i32, out),
            libc::SO_ACCEPTCONN => return int((kind == sock_kind::LISTENER) as i32, out),
            _ => {}
        }
    }
    let mut buf = [0u8; canal_abi::SLOT_PAYLOAD];
    let want = out.len().min(buf.len());
    let (_, n) = request(
        s.g,
        op::GETSOCKOPT,
        s.handle,
        [level as u64, name as u64, want as u64, 0],
        &[],
        &mut buf,
    )?;
    let c = n.min(out.len());
    out[..c].copy_from_slice(&buf[..c]);
    Ok(c)
}

/// Options a program set on a socket that may still change sides — a canal socket
/// CANAL_EXCLUDE may yet hand to the kernel (`policy`), a kernel socket DIRECT may yet
/// make canal's (`direct`) — by its key there, to replay on the socket that takes its
/// place. The latest value of each (level, name) is kept.
pub(crate) struct SavedOpts<K: 'static>(crate::rt::Locked<Vec<SavedOpt<K>>>);

/// (key, level, name, value).
type SavedOpt<K> = (K, c_int, c_int, Vec<u8>);

impl<K: Copy + PartialEq + Send> SavedOpts<K> {
    pub(crate) const fn new() -> SavedOpts<K> {
        SavedOpts(crate::rt::Locked::new(Vec::new()))
    }

    pub(crate) fn record(&self, key: K, level: c_int, name: c_int, v: &[u8]) {
        self.0.with(|o| {
            o.retain(|x| !(x.0 == key && x.1 == level && x.2 == name));
            o.push((key, level, name, v.to_vec()));
        });
    }

    /// The (level, name, value) saved for `key`, in the order set; forgets them.
    pub(crate) fn take(&self, key: K) -> Vec<(c_int, c_int, Vec<u8>)> {
        self.0.with(|o| {
            let mine = o
                .iter()
                .filter(|x| x.0 == key)
                .map(|x| (x.1, x.2, x.3.clone()))
                .collect();
            o.retain(|x| x.0 != key);
            mine
        })
    }

    pub(crate) fn forget(&self, key: K) {
        self.0.with(|o| o.retain(|x| x.0 != key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeval_rules() {
        let tv = |s: i64, u: i64| {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&s.to_ne_bytes());
            b[8..].copy_from_slice(&u.to_ne_bytes());
            b
        };
        assert_eq!(timeval_to_ns(&tv(0, 0)), Ok(0));
        assert_eq!(timeval_to_ns(&tv(1, 500_000)), Ok(1_500_000_000));
        assert_eq!(timeval_to_ns(&tv(0, 1_000_000)), Err(libc::EDOM));
        assert_eq!(timeval_to_ns(&tv(-1, 0)), Ok(1));
        assert_eq!(timeval_to_ns(&tv(1, 0)[..8]), Err(libc::EINVAL));
        assert_eq!(ns_to_timeval(1_500_000_000), tv(1, 500_000));
        assert_eq!(timeo_opt(libc::SOL_SOCKET, libc::SO_RCVTIMEO), Some(true));
        assert_eq!(timeo_opt(libc::SOL_SOCKET, libc::SO_SNDTIMEO), Some(false));
        assert_eq!(timeo_opt(libc::IPPROTO_TCP, libc::SO_RCVTIMEO), None);
    }
}
