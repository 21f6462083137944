//! Options the library keeps in a stream's entry (`options`, protocol §3.4, minor 9).
//!
//! TCP_NODELAY, SO_KEEPALIVE and the keepalive timers are set by servers and runtimes
//! on every connection they open or accept (Go's net package four of them, nginx,
//! redis, PostgreSQL and asyncio one or two), and asked of canald each was a round
//! trip — two wake-ups on a small machine, as much as the rest of a short
//! connection's life. On a stream socket the library checks them as the kernel does,
//! answers from the word, and:
//! - on a short-circuited stream that is all: they cannot change a connection whose
//!   bytes never meet TCP (canald notices either end's death itself);
//! - on any other stream it raises the socket's attention bit, and canald applies what
//!   changed to the host socket in the round that takes the bit, before that round's
//!   bytes.
//!
//! Listeners and datagram sockets keep the request (a listener's options are inherited
//! by the kernel's accepted sockets, so they must be on the host listener at once); the
//! word still records what canald accepted for them, so a connection accepted on a
//! listener starts with the listener's, as a kernel socket inherits them. A timer never
//! set is asked of canald (its default is the network namespace's sysctl).
use canal_abi::kept_opt::{self, Timer};
use libc::c_int;

/// Linux's limits (include/net/tcp.h: MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL, MAX_TCP_KEEPCNT).
const MAX_KEEPIDLE: i32 = 32767;
const MAX_KEEPINTVL: i32 = 32767;
const MAX_KEEPCNT: i32 = 127;

/// One of the kept options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    Flag(u64),
    Timer(Timer, i32),
}

impl Kept {
    /// (`level`, `name`) → the kept option it is, if any.
    pub(crate) fn of(level: c_int, name: c_int) -> Option<Kept> {
        match (level, name) {
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => Some(Kept::Flag(kept_opt::NODELAY)),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => Some(Kept::Flag(kept_opt::KEEPALIVE)),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                Some(Kept::Timer(kept_opt::KEEPIDLE, MAX_KEEPIDLE))
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => {
                Some(Kept::Timer(kept_opt::KEEPINTVL, MAX_KEEPINTVL))
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => {
                Some(Kept::Timer(kept_opt::KEEPCNT, MAX_KEEPCNT))
            }
            _ => None,
        }
    }

    /// `word` with this option set from the program's bytes, or the errno Linux gives
    /// (EINVAL for fewer than 4 bytes or a timer out of its range).
    pub(crate) fn set(self, word: u64, val: &[u8]) -> Result<u64, i32> {
        let Some(b) = val.get(..4) else {
            return Err(libc::EINVAL);
        };
        let v = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        match self {
            Kept::Flag(bit) if v != 0 => Ok(word | bit),
            Kept::Flag(bit) => Ok(word & !bit),
            Kept::Timer(t, max) if (1..=max).contains(&v) => Ok(t.set(word, v as u32)),
            Kept::Timer(..) => Err(libc::EINVAL),
        }
    }

    /// The value getsockopt reports from `word`; None for a timer never set.
    pub(crate) fn get(self, word: u64) -> Option<i32> {
        match self {
            Kept::Flag(bit) => Some(i32::from(word & bit != 0)),
            Kept::Timer(t, _) => t.get(word).map(|v| v as i32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(v: i32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    fn of(level: c_int, name: c_int) -> Kept {
        Kept::of(level, name).unwrap()
    }

    #[test]
    fn flags_follow_any_nonzero_value_and_stay_apart() {
        let (nodelay, keepalive) = (
            of(libc::IPPROTO_TCP, libc::TCP_NODELAY),
            of(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
        );
        let w = nodelay.set(0, &int(7)).unwrap();
        assert_eq!((nodelay.get(w), keepalive.get(w)), (Some(1), Some(0)));
        let w = keepalive.set(w, &int(-1)).unwrap();
        assert_eq!((nodelay.get(w), keepalive.get(w)), (Some(1), Some(1)));
        let w = nodelay.set(w, &int(0)).unwrap();
        assert_eq!((nodelay.get(w), keepalive.get(w)), (Some(0), Some(1)));
        // A longer value: Linux reads the first int.
        let mut long = [0u8; 8];
        long[..4].copy_from_slice(&int(1));
        assert_eq!(nodelay.get(nodelay.set(0, &long).unwrap()), Some(1));
    }

    #[test]
    fn short_values_and_out_of_range_timers_are_einval() {
        let nodelay = of(libc::IPPROTO_TCP, libc::TCP_NODELAY);
        assert_eq!(nodelay.set(0, &[1, 0, 0]), Err(libc::EINVAL));
        assert_eq!(
            of(libc::SOL_SOCKET, libc::SO_KEEPALIVE).set(0, &[]),
            Err(libc::EINVAL)
        );
        for (name, max) in [
            (libc::TCP_KEEPIDLE, 32767),
            (libc::TCP_KEEPINTVL, 32767),
            (libc::TCP_KEEPCNT, 127),
        ] {
            let k = of(libc::IPPROTO_TCP, name);
            assert_eq!(k.set(0, &int(0)), Err(libc::EINVAL));
            assert_eq!(k.set(0, &int(-5)), Err(libc::EINVAL));
            assert_eq!(k.set(0, &int(max + 1)), Err(libc::EINVAL));
            assert_eq!(k.get(k.set(0, &int(max)).unwrap()), Some(max));
            assert_eq!(k.get(0), None, "a timer never set is canald's to answer");
        }
    }

    #[test]
    fn timers_do_not_overlap_each_other_or_the_flags() {
        let t = |name| of(libc::IPPROTO_TCP, name);
        let (idle, intvl, cnt) = (
            t(libc::TCP_KEEPIDLE),
            t(libc::TCP_KEEPINTVL),
            t(libc::TCP_KEEPCNT),
        );
        let mut w = !0x1fu64; // stray bits in every field but the has-bits
        w = idle.set(w, &int(15)).unwrap();
        w = intvl.set(w, &int(32767)).unwrap();
        w = cnt.set(w, &int(9)).unwrap();
        assert_eq!(
            (idle.get(w), intvl.get(w), cnt.get(w)),
            (Some(15), Some(32767), Some(9))
        );
        assert_eq!(t(libc::TCP_NODELAY).get(w), Some(0));
        let w = intvl.set(w, &int(1)).unwrap();
        assert_eq!((idle.get(w), intvl.get(w)), (Some(15), Some(1)));
    }

    #[test]
    fn only_the_five_options_are_kept() {
        assert!(Kept::of(libc::SOL_SOCKET, libc::TCP_NODELAY).is_none()); // SO_DEBUG
        assert!(Kept::of(libc::IPPROTO_TCP, libc::TCP_CORK).is_none());
        assert!(Kept::of(libc::IPPROTO_IP, libc::TCP_KEEPIDLE).is_none());
    }
}
