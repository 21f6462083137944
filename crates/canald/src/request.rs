//! Requests: the one copy of a guest's slot into host memory, and its validation into
//! a typed command. Nothing here touches shared memory after `Request::copy_from`.
#![forbid(unsafe_code)]

use canal_abi::sync::Ordering;
use canal_abi::{errno, op, CanalAddr, Slot, SLOT_PAYLOAD};

/// A slot copied into host memory. Every later decision uses this copy only, so a
/// guest that keeps writing the slot cannot change what was validated (no double
/// fetch).
#[derive(Clone)]
pub(crate) struct Request {
    pub(crate) op: u32,
    pub(crate) socket: u32,
    pub(crate) in_len: u32,
    pub(crate) args: [u64; 4],
    pub(crate) seq: u32,
    pub(crate) payload: [u8; SLOT_PAYLOAD],
}

impl Request {
    pub(crate) fn copy_from(slot: &Slot) -> Request {
        let mut payload = [0u8; SLOT_PAYLOAD];
        slot.read_payload(0, &mut payload);
        Request {
            op: slot.op.load(Ordering::Relaxed),
            socket: slot.socket.load(Ordering::Relaxed),
            in_len: slot.in_len.load(Ordering::Relaxed),
            args: [
                slot.args[0].load(Ordering::Relaxed),
                slot.args[1].load(Ordering::Relaxed),
                slot.args[2].load(Ordering::Relaxed),
                slot.args[3].load(Ordering::Relaxed),
            ],
            seq: slot.seq.load(Ordering::Relaxed),
            payload,
        }
    }

    /// A request built in host memory (tests, fuzzing).
    pub(crate) fn new(op: u32, socket: u32, args: [u64; 4], input: &[u8]) -> Request {
        let mut payload = [0u8; SLOT_PAYLOAD];
        let n = input.len().min(SLOT_PAYLOAD);
        payload[..n].copy_from_slice(&input[..n]);
        Request {
            op,
            socket,
            in_len: input.len() as u32,
            args,
            seq: 0,
            payload,
        }
    }

    /// The supplied payload bytes (in_len checked against the payload size).
    fn input(&self) -> Result<&[u8], i32> {
        let n = self.in_len as usize;
        if n > SLOT_PAYLOAD {
            return Err(errno::EINVAL);
        }
        Ok(&self.payload[..n])
    }
}

/// A validated command. Handle checks need the guest's socket table and happen in
/// `guest.rs`, before the command's own arguments are validated (EBADF first, as the
/// kernel does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cmd {
    Socket {
        domain: i32,
        ty: i32,
        protocol: i32,
    },
    Bind(CanalAddr),
    Listen(i32),
    Connect(CanalAddr),
    /// CONNECT with args[0] = 1: connect(AF_UNSPEC), dissolving a datagram
    /// socket's association (protocol §5).
    Disconnect,
    Close,
    Shutdown(i32),
    SetOpt {
        level: i32,
        name: i32,
        value: Vec<u8>,
    },
    GetOpt {
        level: i32,
        name: i32,
        len: usize,
    },
    SockName,
    PeerName,
    Nop,
}

/// Whether an opcode names a socket handle.
pub(crate) fn needs_handle(opcode: u32) -> bool {
    !matches!(opcode, op::SOCKET | op::NOP) && opcode <= op::MAX && opcode != 0
}

fn addr(req: &Request) -> Result<CanalAddr, i32> {
    let input = req.input()?;
    CanalAddr::decode(input).ok_or(errno::EINVAL)
}

/// Converts a guest u64 argument to a C int, refusing values that do not fit.
fn int_arg(v: u64) -> Result<i32, i32> {
    i32::try_from(v as i64).map_err(|_| errno::EINVAL)
}

pub(crate) const SOCK_STREAM: i32 = 1;
pub(crate) const SOCK_DGRAM: i32 = 2;

/// Validates a request copy into a command. Errors are positive errno values.
pub(crate) fn decode(req: &Request) -> Result<Cmd, i32> {
    // Bound the supplied length first, whatever the opcode.
    req.input()?;
    match req.op {
        op::SOCKET => {
            let domain = int_arg(req.args[0])?;
            let ty = int_arg(req.args[1])?;
            let protocol = int_arg(req.args[2])?;
            if domain != libc::AF_INET && domain != libc::AF_INET6 {
                return Err(errno::EAFNOSUPPORT);
            }
            let proto_ok = match ty {
                SOCK_STREAM => protocol == 0 || protocol == libc::IPPROTO_TCP,
                SOCK_DGRAM => protocol == 0 || protocol == libc::IPPROTO_UDP,
                _ => return Err(errno::EINVAL),
            };
            if !proto_ok {
                return Err(errno::EPROTONOSUPPORT);
            }
            Ok(Cmd::Socket {
                domain,
                ty,
                protocol,
            })
        }
        op::BIND => Ok(Cmd::Bind(addr(req)?)),
        op::LISTEN => {
            // The kernel clamps the backlog; so do we (negative means default).
            let b = req.args[0] as i64;
            let b = if !(0..=65535).contains(&b) {
                4096
            } else {
                b as i32
            };
            Ok(Cmd::Listen(b))
        }
        op::CONNECT if req.args[0] == 1 => Ok(Cmd::Disconnect),
        op::CONNECT => Ok(Cmd::Connect(addr(req)?)),
        op::CLOSE => Ok(Cmd::Close),
        op::SHUTDOWN => match req.args[0] {
            0..=2 => Ok(Cmd::Shutdown(req.args[0] as i32)),
            _ => Err(errno::EINVAL),
        },
        op::SETSOCKOPT => {
            let level = int_arg(req.args[0])?;
            let name = int_arg(req.args[1])?;
            // Which options reach the host socket: sockopt.rs, where the socket is known.
            Ok(Cmd::SetOpt {
                level,
                name,
                value: req.input()?.to_vec(),
            })
        }
        op::GETSOCKOPT => {
            let level = int_arg(req.args[0])?;
            let name = int_arg(req.args[1])?;
            let len = usize::try_from(req.args[2]).map_err(|_| errno::EINVAL)?;
            if len > SLOT_PAYLOAD {
                return Err(errno::EINVAL);
            }
            Ok(Cmd::GetOpt { level, name, len })
        }
        op::GETSOCKNAME => Ok(Cmd::SockName),
        op::GETPEERNAME => Ok(Cmd::PeerName),
        op::NOP => Ok(Cmd::Nop),
        _ => Err(errno::ENOSYS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(opc: u32, args: [u64; 4], input: &[u8]) -> Request {
        Request::new(opc, 0, args, input)
    }

    #[test]
    fn socket_args() {
        assert_eq!(
            decode(&req(op::SOCKET, [2, 1, 0, 0], &[])),
            Ok(Cmd::Socket {
                domain: 2,
                ty: 1,
                protocol: 0
            })
        );
        assert!(decode(&req(op::SOCKET, [10, 2, 17, 0], &[])).is_ok());
        assert_eq!(
            decode(&req(op::SOCKET, [1, 1, 0, 0], &[])),
            Err(errno::EAFNOSUPPORT)
        );
        assert_eq!(
            decode(&req(op::SOCKET, [2, 3, 0, 0], &[])),
            Err(errno::EINVAL)
        );
        assert_eq!(
            decode(&req(op::SOCKET, [2, 1, 17, 0], &[])),
            Err(errno::EPROTONOSUPPORT)
        );
        assert_eq!(
            decode(&req(op::SOCKET, [1 << 40, 1, 0, 0], &[])),
            Err(errno::EINVAL)
        );
    }

    #[test]
    fn lengths_and_opcodes() {
        let mut r = req(op::NOP, [0; 4], &[]);
        assert_eq!(decode(&r), Ok(Cmd::Nop));
        r.in_len = SLOT_PAYLOAD as u32 + 1;
        assert_eq!(decode(&r), Err(errno::EINVAL));
        r.in_len = u32::MAX;
        assert_eq!(decode(&r), Err(errno::EINVAL));
        assert_eq!(decode(&req(0, [0; 4], &[])), Err(errno::ENOSYS));
        assert_eq!(decode(&req(999, [0; 4], &[])), Err(errno::ENOSYS));
        assert!(!needs_handle(0) && !needs_handle(999) && !needs_handle(op::NOP));
        assert!(needs_handle(op::CONNECT) && needs_handle(op::CLOSE));
    }

    #[test]
    fn addresses() {
        let a = CanalAddr::v4([127, 0, 0, 1], 80);
        assert_eq!(
            decode(&req(op::CONNECT, [0; 4], &a.encode())),
            Ok(Cmd::Connect(a))
        );
        assert_eq!(
            decode(&req(op::CONNECT, [1, 0, 0, 0], &[])),
            Ok(Cmd::Disconnect)
        );
        // Too short, unknown family, junk in IPv4's unused bytes, reserved not zero.
        assert_eq!(
            decode(&req(op::BIND, [0; 4], &a.encode()[..31])),
            Err(errno::EINVAL)
        );
        let mut b = a.encode();
        b[0] = 1;
        assert_eq!(decode(&req(op::BIND, [0; 4], &b)), Err(errno::EINVAL));
        let mut b = a.encode();
        b[20] = 1;
        assert_eq!(decode(&req(op::BIND, [0; 4], &b)), Err(errno::EINVAL));
        let mut b = a.encode();
        b[31] = 1;
        assert_eq!(decode(&req(op::BIND, [0; 4], &b)), Err(errno::EINVAL));
    }

    #[test]
    fn options() {
        let set = |l: i32, n: i32| {
            decode(&req(
                op::SETSOCKOPT,
                [l as u64, n as u64, 0, 0],
                &[1, 0, 0, 0],
            ))
        };
        // Decoding takes any option; which reach the host socket is sockopt.rs's call.
        assert!(set(libc::IPPROTO_TCP, libc::TCP_NODELAY).is_ok());
        assert!(set(libc::SOL_SOCKET, libc::SO_BINDTODEVICE).is_ok());
        assert!(set(12345, 1).is_ok());
        assert_eq!(
            decode(&req(op::SETSOCKOPT, [1 << 40, 1, 0, 0], &[])),
            Err(errno::EINVAL)
        );
        let get = |l: i32, n: i32, len: u64| {
            decode(&req(op::GETSOCKOPT, [l as u64, n as u64, len, 0], &[]))
        };
        assert_eq!(
            get(libc::SOL_SOCKET, libc::SO_TYPE, 4),
            Ok(Cmd::GetOpt {
                level: libc::SOL_SOCKET,
                name: libc::SO_TYPE,
                len: 4
            })
        );
        assert!(get(libc::IPPROTO_TCP, libc::TCP_INFO, 232).is_ok());
        assert_eq!(
            get(libc::SOL_SOCKET, libc::SO_TYPE, 385),
            Err(errno::EINVAL)
        );
        assert_eq!(
            get(libc::SOL_SOCKET, libc::SO_TYPE, u64::MAX),
            Err(errno::EINVAL)
        );
    }

    #[test]
    fn shutdown_and_listen() {
        assert_eq!(
            decode(&req(op::SHUTDOWN, [1, 0, 0, 0], &[])),
            Ok(Cmd::Shutdown(1))
        );
        assert_eq!(
            decode(&req(op::SHUTDOWN, [3, 0, 0, 0], &[])),
            Err(errno::EINVAL)
        );
        assert_eq!(
            decode(&req(op::LISTEN, [16, 0, 0, 0], &[])),
            Ok(Cmd::Listen(16))
        );
        assert_eq!(
            decode(&req(op::LISTEN, [u64::MAX, 0, 0, 0], &[])),
            Ok(Cmd::Listen(4096))
        );
    }
}
