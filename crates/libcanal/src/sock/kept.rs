//! Options a short-circuited stream keeps in its entry's `options` word (protocol §3.4).
//!
//! TCP_NODELAY, SO_KEEPALIVE and the keepalive timers change nothing on a connection
//! whose bytes never meet TCP (both ends are canal guests; canald notices either end's
//! death itself), yet servers and runtimes set them on every connection they open or
//! accept: Go's net package four of them, nginx, redis, PostgreSQL and asyncio one or
//! two. Asked of canald each is a round trip — two wake-ups on a small machine, more
//! than the rest of a short connection's life — so on a short-circuited stream the
//! library sets and reads them here, with the kernel's checks and the kernel's answers.
//! Every socket records the options canald accepted for it too, so an accepted
//! connection starts with its listener's, as a kernel socket inherits them.
//!
//! The word: bit 0 TCP_NODELAY, bit 1 SO_KEEPALIVE, bits 2–4 "TCP_KEEPIDLE /
//! TCP_KEEPINTVL / TCP_KEEPCNT set", the idle time in bits 8–23, the interval in bits
//! 24–39, the count in bits 40–47. A timer never set is asked of canald (its default
//! is the network namespace's sysctl, which the library does not know).
use libc::c_int;

/// Linux's limits (include/net/tcp.h: MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL, MAX_TCP_KEEPCNT).
const MAX_KEEPIDLE: i32 = 32767;
const MAX_KEEPINTVL: i32 = 32767;
const MAX_KEEPCNT: i32 = 127;

/// One of the kept options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    NoDelay,
    KeepAlive,
    KeepIdle,
    KeepIntvl,
    KeepCnt,
}

impl Kept {
    /// (`level`, `name`) → the kept option it is, if any.
    pub(crate) fn of(level: c_int, name: c_int) -> Option<Kept> {
        match (level, name) {
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => Some(Kept::NoDelay),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => Some(Kept::KeepAlive),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => Some(Kept::KeepIdle),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => Some(Kept::KeepIntvl),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => Some(Kept::KeepCnt),
            _ => None,
        }
    }

    /// A timer's (has-bit, shift, width in bits, largest value); None for the flags.
    fn timer(self) -> Option<(u64, u32, u32, i32)> {
        match self {
            Kept::NoDelay | Kept::KeepAlive => None,
            Kept::KeepIdle => Some((1 << 2, 8, 16, MAX_KEEPIDLE)),
            Kept::KeepIntvl => Some((1 << 3, 24, 16, MAX_KEEPINTVL)),
            Kept::KeepCnt => Some((1 << 4, 40, 8, MAX_KEEPCNT)),
        }
    }

    fn flag(self) -> u64 {
        match self {
            Kept::NoDelay => 1 << 0,
            _ => 1 << 1,
        }
    }

    /// `word` with this option set from the program's bytes, or the errno Linux gives
    /// (EINVAL for fewer than 4 bytes or a timer out of its range).
    pub(crate) fn set(self, word: u64, val: &[u8]) -> Result<u64, i32> {
        let Some(b) = val.get(..4) else {
            return Err(libc::EINVAL);
        };
        let v = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        match self.timer() {
            None if v != 0 => Ok(word | self.flag()),
            None => Ok(word & !self.flag()),
            Some((has, shift, width, max)) => {
                if !(1..=max).contains(&v) {
                    return Err(libc::EINVAL);
                }
                let mask = ((1u64 << width) - 1) << shift;
                Ok((word & !mask) | has | ((v as u64) << shift))
            }
        }
    }

    /// The value getsockopt reports from `word`; None for a timer never set.
    pub(crate) fn get(self, word: u64) -> Option<i32> {
        match self.timer() {
            None => Some(i32::from(word & self.flag() != 0)),
            Some((has, shift, width, _)) => {
                (word & has != 0).then(|| ((word >> shift) & ((1u64 << width) - 1)) as i32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(v: i32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    #[test]
    fn flags_follow_any_nonzero_value_and_stay_apart() {
        let w = Kept::NoDelay.set(0, &int(7)).unwrap();
        assert_eq!(Kept::NoDelay.get(w), Some(1));
        assert_eq!(Kept::KeepAlive.get(w), Some(0));
        let w = Kept::KeepAlive.set(w, &int(-1)).unwrap();
        assert_eq!(
            (Kept::NoDelay.get(w), Kept::KeepAlive.get(w)),
            (Some(1), Some(1))
        );
        let w = Kept::NoDelay.set(w, &int(0)).unwrap();
        assert_eq!(
            (Kept::NoDelay.get(w), Kept::KeepAlive.get(w)),
            (Some(0), Some(1))
        );
        // A longer value: Linux reads the first int.
        let mut long = [0u8; 8];
        long[..4].copy_from_slice(&int(1));
        assert_eq!(
            Kept::NoDelay.get(Kept::NoDelay.set(0, &long).unwrap()),
            Some(1)
        );
    }

    #[test]
    fn short_values_and_out_of_range_timers_are_einval_and_change_nothing() {
        assert_eq!(Kept::NoDelay.set(0, &[1, 0, 0]), Err(libc::EINVAL));
        assert_eq!(Kept::KeepAlive.set(0, &[]), Err(libc::EINVAL));
        for (k, max) in [
            (Kept::KeepIdle, 32767),
            (Kept::KeepIntvl, 32767),
            (Kept::KeepCnt, 127),
        ] {
            assert_eq!(k.set(0, &int(0)), Err(libc::EINVAL));
            assert_eq!(k.set(0, &int(-5)), Err(libc::EINVAL));
            assert_eq!(k.set(0, &int(max + 1)), Err(libc::EINVAL));
            assert_eq!(k.get(k.set(0, &int(max)).unwrap()), Some(max));
            assert_eq!(k.get(0), None, "a timer never set is canald's to answer");
        }
    }

    #[test]
    fn timers_do_not_overlap_each_other_or_the_flags() {
        let mut w = !0x1fu64; // stray bits in every field but the has-bits
        w = Kept::KeepIdle.set(w, &int(15)).unwrap();
        w = Kept::KeepIntvl.set(w, &int(32767)).unwrap();
        w = Kept::KeepCnt.set(w, &int(9)).unwrap();
        assert_eq!(Kept::KeepIdle.get(w), Some(15));
        assert_eq!(Kept::KeepIntvl.get(w), Some(32767));
        assert_eq!(Kept::KeepCnt.get(w), Some(9));
        assert_eq!(
            (Kept::NoDelay.get(w), Kept::KeepAlive.get(w)),
            (Some(0), Some(0))
        );
        let w = Kept::KeepIntvl.set(w, &int(1)).unwrap();
        assert_eq!(
            (Kept::KeepIdle.get(w), Kept::KeepIntvl.get(w)),
            (Some(15), Some(1))
        );
    }

    #[test]
    fn only_the_five_options_are_kept() {
        assert_eq!(
            Kept::of(libc::IPPROTO_TCP, libc::TCP_NODELAY),
            Some(Kept::NoDelay)
        );
        assert_eq!(
            Kept::of(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            Some(Kept::KeepAlive)
        );
        assert_eq!(Kept::of(libc::SOL_SOCKET, libc::TCP_NODELAY), None); // SO_DEBUG
        assert_eq!(Kept::of(libc::IPPROTO_TCP, libc::TCP_CORK), None);
        assert_eq!(Kept::of(libc::IPPROTO_IP, libc::TCP_KEEPIDLE), None);
    }
}
