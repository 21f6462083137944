//! Which socket options a guest may get or set on its host socket.
//!
//! The rule (issue 14): an option reaches the host socket and the guest gets the
//! kernel's own answer — its value or its errno — unless applying it there would act
//! beyond the guest's own socket, with canald's privileges rather than the guest's, or
//! with canald's memory or descriptors. Those few are refused with the errno an
//! unprivileged process gets natively where there is one; each has its reason here and
//! in docs/compat.md ("Socket options"). Options the library answers itself (timeouts,
//! SO_ERROR, SO_TYPE, ...) and SO_LINGER (emulated by canald) never get here.
//!
//! Guests are treated as unprivileged: canald may run as root (a system service), and a
//! guest must not borrow its capabilities. A privileged program under canal therefore
//! gets EPERM where natively it would succeed (documented).

use libc::c_int;

/// Linux option numbers the libc crate does not name (x86-64 and aarch64 share them).
mod name {
    pub(super) const SO_ATTACH_FILTER: i32 = 26;
    pub(super) const SO_ATTACH_BPF: i32 = 50;
    pub(super) const SO_ATTACH_REUSEPORT_CBPF: i32 = 51;
    pub(super) const SO_ATTACH_REUSEPORT_EBPF: i32 = 52;
    pub(super) const SO_ZEROCOPY: i32 = 60;
    pub(super) const SO_BINDTOIFINDEX: i32 = 62;
    pub(super) const SO_PREFER_BUSY_POLL: i32 = 69;
    pub(super) const SO_BUSY_POLL_BUDGET: i32 = 70;
    pub(super) const SO_PEERPIDFD: i32 = 77;
    pub(super) const SO_DEBUG: i32 = 1;
    pub(super) const SO_PRIORITY: i32 = 12;
    pub(super) const SO_BUSY_POLL: i32 = 46;
    pub(super) const SO_MARK: i32 = 36;
    pub(super) const SO_RCVBUFFORCE: i32 = 33;
    pub(super) const SO_SNDBUFFORCE: i32 = 32;
    pub(super) const SO_BINDTODEVICE: i32 = 25;
    pub(super) const IP_TRANSPARENT: i32 = 19;
    pub(super) const IP_IPSEC_POLICY: i32 = 16;
    pub(super) const IP_XFRM_POLICY: i32 = 17;
    pub(super) const IPV6_TRANSPARENT: i32 = 75;
    pub(super) const IPV6_IPSEC_POLICY: i32 = 34;
    pub(super) const IPV6_XFRM_POLICY: i32 = 35;
    pub(super) const TCP_REPAIR: i32 = 19;
    pub(super) const TCP_REPAIR_QUEUE: i32 = 20;
    pub(super) const TCP_QUEUE_SEQ: i32 = 21;
    pub(super) const TCP_REPAIR_OPTIONS: i32 = 22;
    pub(super) const TCP_ULP: i32 = 31;
    pub(super) const TCP_ZEROCOPY_RECEIVE: i32 = 35;
    pub(super) const TCP_REPAIR_WINDOW: i32 = 29;
    pub(super) const TCP_CONGESTION: i32 = 13;
    pub(super) const UDP_GRO: i32 = 104;
}

/// Why an option is refused (the table in docs/compat.md follows these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Needs CAP_NET_ADMIN or CAP_NET_RAW natively: EPERM, as for an unprivileged process.
    Privileged,
    /// Would pick a host interface for the socket: the guest's view of interfaces is not
    /// the host's (vCanal's address view), so EPERM.
    HostInterface,
    /// The value points into the guest's memory or names one of its descriptors, which
    /// mean something else (or nothing) in canald: ENOPROTOOPT.
    GuestPointer,
    /// The answer would install a descriptor in canald, not the guest: ENODATA, as
    /// natively for a TCP or UDP socket.
    DescriptorOut,
    /// Results would come back as ancillary data or error-queue messages, which canal
    /// does not carry (docs/compat.md, "ancillary data"): ENOPROTOOPT, so the program
    /// takes its fallback instead of waiting for what never comes.
    NeedsErrorQueue,
    /// kTLS (TCP_ULP "tls"): canald's reads and writes would go through the kernel's
    /// TLS; ENOENT, as a kernel without the module answers.
    Ulp,
    /// Not a socket level a TCP or UDP socket has: ENOPROTOOPT, as natively.
    Level,
    /// A value the kernel would reject before looking further: EINVAL, as natively.
    Malformed,
}

impl Refusal {
    pub(crate) fn errno(self) -> c_int {
        match self {
            Refusal::Privileged | Refusal::HostInterface => libc::EPERM,
            Refusal::GuestPointer | Refusal::NeedsErrorQueue | Refusal::Level => libc::ENOPROTOOPT,
            Refusal::DescriptorOut => libc::ENODATA,
            Refusal::Ulp => libc::ENOENT,
            Refusal::Malformed => libc::EINVAL,
        }
    }
}

fn int_value(value: &[u8]) -> Option<i32> {
    let b: [u8; 4] = value.get(..4)?.try_into().ok()?;
    Some(i32::from_ne_bytes(b))
}

/// A set with a non-zero int (a bool switched on, or a count raised).
fn turns_on(value: &[u8]) -> bool {
    int_value(value).is_some_and(|v| v != 0)
}

/// Whether the guest may set option (`level`, `name`) to `value`; `allowed_cc` is the
/// host's `net.ipv4.tcp_allowed_congestion_control` (what an unprivileged process may
/// pick).
pub(crate) fn may_set(
    level: c_int,
    name: c_int,
    value: &[u8],
    allowed_cc: &str,
) -> Result<(), Refusal> {
    use name::*;
    match level {
        libc::SOL_SOCKET => match name {
            SO_DEBUG if turns_on(value) => Err(Refusal::Privileged),
            SO_PRIORITY if int_value(value).is_some_and(|v| !(0..=6).contains(&v)) => {
                Err(Refusal::Privileged)
            }
            SO_MARK | SO_RCVBUFFORCE | SO_SNDBUFFORCE => Err(Refusal::Privileged),
            SO_BUSY_POLL | SO_PREFER_BUSY_POLL | SO_BUSY_POLL_BUDGET if turns_on(value) => {
                Err(Refusal::Privileged)
            }
            SO_BINDTODEVICE | SO_BINDTOIFINDEX => Err(Refusal::HostInterface),
            // A malformed value gets the kernel's EINVAL first (a struct sock_fprog is
            // 16 bytes, a BPF program descriptor an int).
            SO_ATTACH_FILTER | SO_ATTACH_REUSEPORT_CBPF if value.len() < 16 => {
                Err(Refusal::Malformed)
            }
            SO_ATTACH_BPF | SO_ATTACH_REUSEPORT_EBPF if value.len() < 4 => Err(Refusal::Malformed),
            SO_ATTACH_FILTER
            | SO_ATTACH_BPF
            | SO_ATTACH_REUSEPORT_CBPF
            | SO_ATTACH_REUSEPORT_EBPF => Err(Refusal::GuestPointer),
            SO_ZEROCOPY if turns_on(value) => Err(Refusal::NeedsErrorQueue),
            _ => Ok(()),
        },
        libc::IPPROTO_IP => match name {
            IP_TRANSPARENT if turns_on(value) => Err(Refusal::Privileged),
            IP_IPSEC_POLICY | IP_XFRM_POLICY => Err(Refusal::Privileged),
            _ => Ok(()),
        },
        libc::IPPROTO_IPV6 => match name {
            IPV6_TRANSPARENT if turns_on(value) => Err(Refusal::Privileged),
            IPV6_IPSEC_POLICY | IPV6_XFRM_POLICY => Err(Refusal::Privileged),
            _ => Ok(()),
        },
        libc::IPPROTO_TCP => match name {
            TCP_REPAIR | TCP_REPAIR_QUEUE | TCP_QUEUE_SEQ | TCP_REPAIR_OPTIONS
            | TCP_REPAIR_WINDOW => Err(Refusal::Privileged),
            TCP_ULP => Err(Refusal::Ulp),
            TCP_CONGESTION => {
                let want = value.split(|&b| b == 0).next().unwrap_or(&[]);
                let want = core::str::from_utf8(want).unwrap_or("");
                if allowed_cc.split_whitespace().any(|a| a == want) {
                    Ok(())
                } else {
                    Err(Refusal::Privileged)
                }
            }
            _ => Ok(()),
        },
        libc::IPPROTO_UDP => match name {
            UDP_GRO if turns_on(value) => Err(Refusal::NeedsErrorQueue),
            _ => Ok(()),
        },
        _ => Err(Refusal::Level),
    }
}

/// Whether the guest may read option (`level`, `name`).
pub(crate) fn may_get(level: c_int, name: c_int) -> Result<(), Refusal> {
    use name::*;
    match (level, name) {
        (libc::SOL_SOCKET, SO_PEERPIDFD) => Err(Refusal::DescriptorOut),
        (libc::IPPROTO_TCP, TCP_ZEROCOPY_RECEIVE) => Err(Refusal::GuestPointer),
        (libc::SOL_SOCKET | libc::IPPROTO_IP | libc::IPPROTO_IPV6, _) => Ok(()),
        (libc::IPPROTO_TCP | libc::IPPROTO_UDP, _) => Ok(()),
        _ => Err(Refusal::Level),
    }
}

/// The host's `net.ipv4.tcp_allowed_congestion_control`, read when asked (rare).
fn allowed_congestion_control() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control").unwrap_or_default()
}

/// Whether `level` is one the socket has at all: a TCP option on a UDP socket, a UDP
/// option on a TCP socket or an IPv6 option on an IPv4 socket gets the kernel's own
/// answer (ENOPROTOOPT), as natively, never a refusal of ours.
fn level_applies(family: u16, dgram: bool, level: c_int) -> bool {
    match level {
        libc::IPPROTO_TCP => !dgram,
        libc::IPPROTO_UDP => dgram,
        libc::IPPROTO_IPV6 => family == libc::AF_INET6 as u16,
        _ => true,
    }
}

/// The check before a guest's setsockopt reaches its host socket: Ok to pass it on, or
/// the errno of a refusal.
pub(crate) fn check_set(
    family: u16,
    dgram: bool,
    level: c_int,
    name: c_int,
    value: &[u8],
) -> Result<(), c_int> {
    if !level_applies(family, dgram, level) {
        return Ok(());
    }
    let cc = if level == libc::IPPROTO_TCP && name == name::TCP_CONGESTION {
        allowed_congestion_control()
    } else {
        String::new()
    };
    may_set(level, name, value, &cc).map_err(Refusal::errno)
}

/// The check before a guest's getsockopt reaches its host socket.
pub(crate) fn check_get(family: u16, dgram: bool, level: c_int, name: c_int) -> Result<(), c_int> {
    if !level_applies(family, dgram, level) {
        return Ok(());
    }
    may_get(level, name).map_err(Refusal::errno)
}

/// Applies to a host stream what changed in its guest's kept options (entry
/// `options`, protocol §3.4: TCP_NODELAY, SO_KEEPALIVE, the keepalive timers) from
/// `old` to `new`. The word is the guest's, unchecked: the kernel refuses a value out
/// of range (EINVAL), which is ignored — the guest's library checked it already, so
/// only a guest writing the word by hand gets there, and only for its own socket.
pub(crate) fn apply_kept(fd: &std::os::fd::OwnedFd, old: u64, new: u64) {
    use canal_abi::kept_opt::{self, KEEPALIVE, NODELAY};
    let set = |level: c_int, name: c_int, v: u32| {
        let _ = crate::sys::setsockopt_bytes(fd, level, name, &(v as i32).to_ne_bytes());
    };
    for (bit, level, name) in [
        (NODELAY, libc::IPPROTO_TCP, libc::TCP_NODELAY),
        (KEEPALIVE, libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    ] {
        if (old ^ new) & bit != 0 {
            set(level, name, u32::from(new & bit != 0));
        }
    }
    for (t, name) in [
        (kept_opt::KEEPIDLE, libc::TCP_KEEPIDLE),
        (kept_opt::KEEPINTVL, libc::TCP_KEEPINTVL),
        (kept_opt::KEEPCNT, libc::TCP_KEEPCNT),
    ] {
        if let Some(v) = t.get(new).filter(|&v| t.get(old) != Some(v)) {
            set(libc::IPPROTO_TCP, name, v);
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
    fn kept_options_reach_a_real_socket_and_only_the_changed_ones() {
        use canal_abi::kept_opt::{self, KEEPALIVE, NODELAY};
        let fd = crate::sys::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        let get = |level, name| {
            let mut b = [0u8; 4];
            crate::sys::getsockopt_bytes(&fd, level, name, &mut b).unwrap();
            i32::from_ne_bytes(b)
        };
        let w = kept_opt::KEEPIDLE.set(NODELAY | KEEPALIVE, 77);
        let w = kept_opt::KEEPCNT.set(w, 4);
        apply_kept(&fd, 0, w);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_NODELAY), 1);
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 77);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 4);
        // Unchanged bits are not applied again: set NODELAY behind the word's back and
        // move only KEEPALIVE; NODELAY keeps the socket's own value.
        crate::sys::setsockopt_bytes(&fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, &int(0)).unwrap();
        apply_kept(&fd, w, w & !KEEPALIVE);
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_NODELAY), 0);
        // A timer past the kernel's range (a guest writing the word by hand) is
        // refused by the kernel and leaves the old value.
        apply_kept(&fd, w, kept_opt::KEEPIDLE.set(w, 65535));
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 77);
    }

    #[test]
    fn ordinary_options_pass_with_the_kernels_answer() {
        for (l, n) in [
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            (libc::SOL_SOCKET, libc::SO_RCVBUF),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE),
            (libc::SOL_SOCKET, 999), // unknown: the kernel says ENOPROTOOPT itself
            (libc::IPPROTO_TCP, libc::TCP_NODELAY),
            (libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT),
            (libc::IPPROTO_IP, libc::IP_TOS),
            (libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
            (libc::IPPROTO_UDP, libc::UDP_CORK),
        ] {
            assert_eq!(may_set(l, n, &int(1), ""), Ok(()), "{l}/{n}");
            assert_eq!(may_get(l, n), Ok(()), "{l}/{n}");
        }
        // Reading SO_BINDTODEVICE is harmless (sshd does it).
        assert_eq!(may_get(libc::SOL_SOCKET, name::SO_BINDTODEVICE), Ok(()));
        // Switching privileged things off is allowed, as natively.
        assert_eq!(
            may_set(libc::SOL_SOCKET, name::SO_DEBUG, &int(0), ""),
            Ok(())
        );
        assert_eq!(
            may_set(libc::SOL_SOCKET, name::SO_PRIORITY, &int(6), ""),
            Ok(())
        );
    }

    #[test]
    fn refusals_carry_the_unprivileged_errno() {
        let set = |l, n, v: &[u8]| may_set(l, n, v, "reno cubic").map_err(Refusal::errno);
        assert_eq!(
            set(libc::SOL_SOCKET, name::SO_MARK, &int(1)),
            Err(libc::EPERM)
        );
        assert_eq!(
            set(libc::SOL_SOCKET, name::SO_PRIORITY, &int(7)),
            Err(libc::EPERM)
        );
        assert_eq!(
            set(libc::SOL_SOCKET, name::SO_BINDTODEVICE, b"lo\0"),
            Err(libc::EPERM)
        );
        assert_eq!(
            set(libc::SOL_SOCKET, name::SO_ATTACH_FILTER, &[0; 16]),
            Err(libc::ENOPROTOOPT)
        );
        assert_eq!(
            set(libc::SOL_SOCKET, name::SO_ATTACH_BPF, &int(3)),
            Err(libc::ENOPROTOOPT)
        );
        assert_eq!(
            set(libc::IPPROTO_IP, name::IP_TRANSPARENT, &int(1)),
            Err(libc::EPERM)
        );
        assert_eq!(
            set(libc::IPPROTO_TCP, name::TCP_REPAIR, &int(1)),
            Err(libc::EPERM)
        );
        assert_eq!(
            set(libc::IPPROTO_TCP, name::TCP_ULP, b"tls"),
            Err(libc::ENOENT)
        );
        assert_eq!(
            set(libc::IPPROTO_TCP, name::TCP_CONGESTION, b"cubic\0"),
            Ok(())
        );
        assert_eq!(
            set(libc::IPPROTO_TCP, name::TCP_CONGESTION, b"bbr"),
            Err(libc::EPERM)
        );
        assert_eq!(set(libc::SOL_PACKET, 1, &int(1)), Err(libc::ENOPROTOOPT));
        assert_eq!(
            set(libc::SOL_SOCKET, name::SO_ATTACH_FILTER, &int(1)),
            Err(libc::EINVAL)
        );
        // Options of a level the socket does not have: the kernel answers.
        let v6 = libc::AF_INET6 as u16;
        let v4 = libc::AF_INET as u16;
        assert_eq!(
            check_set(
                v4,
                false,
                libc::IPPROTO_IPV6,
                name::IPV6_TRANSPARENT,
                &int(1)
            ),
            Ok(())
        );
        assert_eq!(
            check_set(
                v6,
                false,
                libc::IPPROTO_IPV6,
                name::IPV6_TRANSPARENT,
                &int(1)
            ),
            Err(libc::EPERM)
        );
        assert_eq!(
            check_set(v4, true, libc::IPPROTO_TCP, name::TCP_ULP, b"tls"),
            Ok(())
        );
        assert_eq!(
            check_set(v4, false, libc::IPPROTO_UDP, name::UDP_GRO, &int(1)),
            Ok(())
        );
        assert_eq!(
            check_get(v4, true, libc::IPPROTO_TCP, name::TCP_ZEROCOPY_RECEIVE),
            Ok(())
        );
        assert_eq!(
            may_get(libc::SOL_SOCKET, name::SO_PEERPIDFD).map_err(Refusal::errno),
            Err(libc::ENODATA)
        );
    }
}
