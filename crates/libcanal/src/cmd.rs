//! Variadic `fcntl`/`ioctl` arguments: what the library does with each fcntl command.
//!
//! Stable Rust cannot define C-variadic functions, so the hooks take the optional third
//! argument as one machine word. On the Linux x86-64 and AArch64 calling conventions a
//! variadic integer or pointer argument travels in the same register as a fixed one, so
//! the word holds it; for commands without an argument the word is garbage and is only
//! passed through, never interpreted.

/// What the library does with an fcntl command on a canal descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FcntlAction {
    /// F_GETFL: the dummy's flags with O_NONBLOCK taken from the socket entry.
    GetFl,
    /// F_SETFL: O_NONBLOCK into the socket entry, the rest to the dummy.
    SetFl(i32),
    /// F_DUPFD / F_DUPFD_CLOEXEC: a new descriptor for the same socket.
    Dup { min: i32, cloexec: bool },
    /// Everything else acts on the dummy descriptor (F_GETFD/F_SETFD, locks, owner...).
    PassThrough,
}

pub(crate) fn fcntl_action(cmd: i32, arg: u64) -> FcntlAction {
    match cmd {
        libc::F_GETFL => FcntlAction::GetFl,
        libc::F_SETFL => FcntlAction::SetFl(arg as i32),
        libc::F_DUPFD => FcntlAction::Dup {
            min: arg as i32,
            cloexec: false,
        },
        libc::F_DUPFD_CLOEXEC => FcntlAction::Dup {
            min: arg as i32,
            cloexec: true,
        },
        _ => FcntlAction::PassThrough,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions() {
        // The int is read from the low 32 bits of the register word.
        let word = 0xdead_beef_0000_0800u64;
        assert_eq!(
            fcntl_action(libc::F_SETFL, word),
            FcntlAction::SetFl(libc::O_NONBLOCK)
        );
        assert_eq!(
            fcntl_action(libc::F_DUPFD_CLOEXEC, 10),
            FcntlAction::Dup {
                min: 10,
                cloexec: true
            }
        );
        assert_eq!(fcntl_action(libc::F_GETFL, word), FcntlAction::GetFl);
        assert_eq!(fcntl_action(libc::F_SETFD, 1), FcntlAction::PassThrough);
        assert_eq!(
            fcntl_action(libc::F_SETLK, 0x7fff_0000),
            FcntlAction::PassThrough
        );
    }
}
