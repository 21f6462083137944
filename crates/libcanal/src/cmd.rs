//! Variadic `fcntl`/`ioctl` arguments by command class (rsocket's preload.c idea).
//!
//! Stable Rust cannot define C-variadic functions, so the hooks take the optional third
//! argument as one machine word. On the Linux x86-64 and AArch64 calling conventions a
//! variadic integer or pointer argument travels in the same register as a fixed one, so
//! the word holds it; for commands without an argument the word is garbage and is only
//! passed through, never interpreted.

/// How an fcntl command's third argument is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgClass {
    None,
    Int,
    Ptr,
}

const F_SETSIG: i32 = 10;
const F_GETSIG: i32 = 11;

pub fn fcntl_class(cmd: i32) -> ArgClass {
    match cmd {
        libc::F_GETFD
        | libc::F_GETFL
        | libc::F_GETOWN
        | F_GETSIG
        | libc::F_GETLEASE
        | libc::F_GETPIPE_SZ
        | libc::F_GET_SEALS => ArgClass::None,
        libc::F_DUPFD
        | libc::F_DUPFD_CLOEXEC
        | libc::F_SETFD
        | libc::F_SETFL
        | libc::F_SETOWN
        | F_SETSIG
        | libc::F_SETLEASE
        | libc::F_NOTIFY
        | libc::F_SETPIPE_SZ
        | libc::F_ADD_SEALS => ArgClass::Int,
        // Locks, owner_ex, read/write hints, and anything unknown: a pointer-sized word
        // passed through untouched.
        _ => ArgClass::Ptr,
    }
}

/// What the library does with an fcntl command on a canal descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FcntlAction {
    /// F_GETFL: the dummy's flags with O_NONBLOCK taken from the socket entry.
    GetFl,
    /// F_SETFL: O_NONBLOCK into the socket entry, the rest to the dummy.
    SetFl(i32),
    /// F_DUPFD / F_DUPFD_CLOEXEC: a new descriptor for the same socket.
    Dup { min: i32, cloexec: bool },
    /// Everything else acts on the dummy descriptor (F_GETFD/F_SETFD, locks, owner...).
    PassThrough,
}

pub fn fcntl_action(cmd: i32, arg: u64) -> FcntlAction {
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
    fn classes() {
        assert_eq!(fcntl_class(libc::F_GETFL), ArgClass::None);
        assert_eq!(fcntl_class(libc::F_GETFD), ArgClass::None);
        assert_eq!(fcntl_class(libc::F_SETFL), ArgClass::Int);
        assert_eq!(fcntl_class(libc::F_DUPFD_CLOEXEC), ArgClass::Int);
        assert_eq!(fcntl_class(libc::F_SETLK), ArgClass::Ptr);
        assert_eq!(fcntl_class(libc::F_OFD_SETLKW), ArgClass::Ptr);
        assert_eq!(fcntl_class(12345), ArgClass::Ptr);
    }

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
