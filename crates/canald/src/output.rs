//! Writing a command's result to standard output the way a shell user expects: a reader
//! that went away (`canal stat | head -1`) ends the command quietly; any other failure
//! (a closed or full standard output) is said on standard error and fails the command.

#![forbid(unsafe_code)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set when the process started with descriptor 1 closed and a placeholder holds it
/// (`canal`'s entry point): output written there would vanish without an error.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Notes that standard output was closed at start (its descriptor now holds
/// /dev/null only so that nothing else opened lands on it).
pub fn note_stdout_closed() {
    STDOUT_CLOSED.store(true, Ordering::Relaxed);
}

/// Writes `text` to standard output and flushes it. Returns the exit status: 0 when
/// written or when the reader is gone (EPIPE), 1 with a message otherwise.
pub fn print_or_fail(prog: &str, text: &str) -> i32 {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        let e = std::io::Error::from_raw_os_error(libc::EBADF);
        eprintln!("{prog}: cannot write to standard output: {e}");
        return 1;
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("{prog}: cannot write to standard output: {e}");
            1
        }
    }
}
