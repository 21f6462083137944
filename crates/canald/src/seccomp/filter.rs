//! The seccomp filter `canal run --isolate` installs in a program before exec: which
//! system calls canald is notified of (x86-64; other architectures, and x32 or i386
//! calls of an x86-64 program, run unnotified — they cannot reach past the invariant,
//! `mod.rs`, but are not translated either).

/// AUDIT_ARCH_X86_64.
const ARCH_X86_64: u32 = 0xc000_003e;
/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}

/// Calls notified whatever their arguments (sendmsg/recvmsg and their batch forms:
/// their address is inside the msghdr, which a filter cannot read; canald lets the
/// others through at once).
const ALWAYS: [i64; 10] = [
    nr::CONNECT,
    nr::BIND,
    nr::ACCEPT,
    nr::ACCEPT4,
    nr::GETSOCKNAME,
    nr::GETPEERNAME,
    nr::SENDMSG,
    nr::RECVMSG,
    nr::SENDMMSG,
    nr::RECVMMSG,
];

/// x86-64 system call numbers canald serves.
pub mod nr {
    pub const SOCKET: i64 = 41;
    pub const CONNECT: i64 = 42;
    pub const ACCEPT: i64 = 43;
    pub const SENDTO: i64 = 44;
    pub const RECVFROM: i64 = 45;
    pub const BIND: i64 = 49;
    pub const GETSOCKNAME: i64 = 51;
    pub const GETPEERNAME: i64 = 52;
    pub const SENDMSG: i64 = 46;
    pub const RECVMSG: i64 = 47;
    pub const SETSOCKOPT: i64 = 54;
    pub const GETSOCKOPT: i64 = 55;
    pub const ACCEPT4: i64 = 288;
    pub const RECVMMSG: i64 = 299;
    pub const SENDMMSG: i64 = 307;
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

fn load(off: u32) -> libc::sock_filter {
    stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, off)
}

fn ret(v: u32) -> libc::sock_filter {
    stmt(libc::BPF_RET | libc::BPF_K, v)
}

/// The program: notify for socket(AF_INET/AF_INET6), connect, bind, accept, accept4,
/// getsockname, getpeername, sendmsg, recvmsg, sendmmsg, recvmmsg,
/// setsockopt and getsockopt of (IPPROTO_IPV6, IPV6_V6ONLY),
/// and sendto/recvfrom with an address; allow everything else.
pub fn filter_program() -> Vec<libc::sock_filter> {
    let notify = libc::SECCOMP_RET_USER_NOTIF;
    let allow = libc::SECCOMP_RET_ALLOW;
    // Jump offsets count from the next instruction. After the header (4) comes the
    // dispatch on the call number, then the blocks below, then NOTIFY and ALLOW.
    let mut p = vec![load(ARCH), jeq(ARCH_X86_64, 1, 0), ret(allow), load(NR)];
    let always = ALWAYS;
    // Layout after the dispatch: socket block (5), addr block (6), setsockopt block (5),
    // then NOTIFY, ALLOW.
    let dispatch = always.len() + 5; // + socket, sendto, recvfrom, set/getsockopt checks
    let socket_at = dispatch + 1; // after the final "allow" of the dispatch
    let addr_at = socket_at + 5;
    let opt_at = addr_at + 6;
    let notify_at = opt_at + 5;
    let allow_at = notify_at + 1;
    let here = |p: &Vec<libc::sock_filter>| p.len() - 4; // index within the dispatch
    for &n in &always {
        let off = (notify_at - here(&p) - 1) as u8;
        p.push(jeq(n as u32, off, 0));
    }
    let off = (socket_at - here(&p) - 1) as u8;
    p.push(jeq(nr::SOCKET as u32, off, 0));
    for n in [nr::SENDTO, nr::RECVFROM] {
        let off = (addr_at - here(&p) - 1) as u8;
        p.push(jeq(n as u32, off, 0));
    }
    for n in [nr::SETSOCKOPT, nr::GETSOCKOPT] {
        let off = (opt_at - here(&p) - 1) as u8;
        p.push(jeq(n as u32, off, 0));
    }
    p.push(ret(allow));
    // socket: the domain.
    p.push(load(arg_lo(0)));
    let n = (notify_at - (socket_at + 1) - 1) as u8;
    p.push(jeq(libc::AF_INET as u32, n, 0));
    let n = (notify_at - (socket_at + 2) - 1) as u8;
    p.push(jeq(libc::AF_INET6 as u32, n, 0));
    p.push(ret(allow));
    p.push(ret(allow)); // padding keeps the block at 5
                        // sendto/recvfrom: an address pointer (arg 4) that is not NULL.
    p.push(load(arg_lo(4)));
    let n = (notify_at - (addr_at + 1) - 1) as u8;
    p.push(jeq(0, 0, n));
    p.push(load(arg_lo(4) + 4));
    let n = (notify_at - (addr_at + 3) - 1) as u8;
    p.push(jeq(0, 0, n));
    p.push(ret(allow));
    p.push(ret(allow));
    // setsockopt/getsockopt: level IPPROTO_IPV6 and name IPV6_V6ONLY.
    p.push(load(arg_lo(1)));
    p.push(jeq(libc::IPPROTO_IPV6 as u32, 0, 2));
    p.push(load(arg_lo(2)));
    let n = (notify_at - (opt_at + 3) - 1) as u8;
    p.push(jeq(libc::IPV6_V6ONLY as u32, n, 0));
    p.push(ret(allow));
    debug_assert_eq!(p.len() - 4, notify_at);
    p.push(ret(notify));
    debug_assert_eq!(p.len() - 4, allow_at);
    p.push(ret(allow));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instructions the filter uses.
    fn run(p: &[libc::sock_filter], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as i32).to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = p[pc];
            let code = i.code as u32;
            if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                let o = i.k as usize;
                acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
                pc += 1;
            } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                pc += 1 + if acc == i.k { i.jt } else { i.jf } as usize;
            } else if code == libc::BPF_RET | libc::BPF_K {
                return i.k;
            } else {
                panic!("unexpected instruction {code:#x}");
            }
        }
    }

    #[test]
    fn notifies_exactly_the_served_calls() {
        let p = filter_program();
        let n = libc::SECCOMP_RET_USER_NOTIF;
        let a = libc::SECCOMP_RET_ALLOW;
        let x = ARCH_X86_64;
        assert_eq!(run(&p, nr::SOCKET, x, [2, 1, 0, 0, 0, 0]), n);
        assert_eq!(run(&p, nr::SOCKET, x, [10, 2, 0, 0, 0, 0]), n);
        assert_eq!(run(&p, nr::SOCKET, x, [1, 1, 0, 0, 0, 0]), a, "AF_UNIX");
        for c in ALWAYS {
            assert_eq!(run(&p, c, x, [3, 0, 0, 0, 0, 0]), n, "{c}");
        }
        for c in [nr::SENDTO, nr::RECVFROM] {
            assert_eq!(
                run(&p, c, x, [3, 0, 0, 0, 0, 0]),
                a,
                "{c} without an address"
            );
            assert_eq!(run(&p, c, x, [3, 0, 0, 0, 0x7fff_0000_1000, 16]), n, "{c}");
            assert_eq!(run(&p, c, x, [3, 0, 0, 0, 0x1000, 16]), n, "{c} low half");
            assert_eq!(
                run(&p, c, x, [3, 0, 0, 0, 0x7fff_0000_0000, 16]),
                n,
                "{c} high half"
            );
        }
        assert_eq!(
            run(&p, nr::SETSOCKOPT, x, [3, 41, 26, 0, 4, 0]),
            n,
            "IPV6_V6ONLY"
        );
        assert_eq!(
            run(&p, nr::GETSOCKOPT, x, [3, 41, 26, 0, 4, 0]),
            n,
            "reading IPV6_V6ONLY"
        );
        assert_eq!(run(&p, nr::GETSOCKOPT, x, [3, 6, 1, 0, 4, 0]), a);
        assert_eq!(run(&p, nr::SETSOCKOPT, x, [3, 41, 27, 0, 4, 0]), a);
        assert_eq!(run(&p, nr::SETSOCKOPT, x, [3, 1, 26, 0, 4, 0]), a);
        assert_eq!(run(&p, 0, x, [0; 6]), a, "read");
        assert_eq!(run(&p, 1, x, [0; 6]), a, "write");
        assert_eq!(
            run(&p, nr::CONNECT, 0x4000_0003, [3, 0, 0, 0, 0, 0]),
            a,
            "i386"
        );
    }
}
