//! The standard descriptors as `canal run`'s caller left them: one the caller closed
//! stays closed for the program (`prog >&-` fails natively at its first write), while
//! canal itself holds /dev/null there so nothing it opens lands on 0-2.
use std::sync::atomic::{AtomicU8, Ordering};

/// Which of descriptors 0-2 (bit per descriptor) the caller left closed.
static CLOSED_STD: AtomicU8 = AtomicU8::new(0);

/// At entry: notes which of 0-2 are closed and holds each with /dev/null.
pub(crate) fn hold_closed() {
    let mut closed = 0u8;
    for fd in 0..3 {
        // SAFETY: F_GETFD only reads descriptor flags.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            closed |= 1 << fd;
            // SAFETY: a NUL-terminated path; the lowest free number is `fd`.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
    CLOSED_STD.store(closed, Ordering::Relaxed);
    if closed & 2 != 0 {
        canald::output::note_stdout_closed();
    }
}

/// Closes again the standard descriptors the caller left closed (`canal run`, just
/// before exec).
pub(crate) fn close_what_was_closed() {
    let closed = CLOSED_STD.load(Ordering::Relaxed);
    for fd in 0..3 {
        if closed & (1 << fd) != 0 {
            // SAFETY: closing our own placeholder descriptor.
            unsafe { libc::close(fd) };
        }
    }
}
