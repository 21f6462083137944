//! canald's log: the `log` facade to standard error, one line per record with a UTC
//! timestamp and the level (`2026-11-25T19:58:35.123Z INFO canald: guest 3 attached`).
//! Warnings and errors always; informational lines (attach, departure, exits) with `-v`.
//! Under systemd, when standard error is the journal (`$JOURNAL_STREAM` names it), a
//! line is `<PRIORITY>message` instead: the journal keeps the time and the level
//! itself (sd-daemon(3)), so `journalctl -p warning -u canald` works.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

struct StderrLog;

/// Standard error is the journal's stream: set once at `init`.
static TO_JOURNAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

static LOGGER: StderrLog = StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = if TO_JOURNAL.load(std::sync::atomic::Ordering::Relaxed) {
            format!("<{}>{}\n", journal_priority(r.level()), r.args())
        } else {
            format!("{} {} canald: {}\n", utc_now(), r.level(), r.args())
        };
        // One write per record, so lines from several workers do not interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// syslog priorities as the journal reads them from a line's `<N>` prefix.
fn journal_priority(l: log::Level) -> u8 {
    match l {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    }
}

/// Whether standard error is the stream `$JOURNAL_STREAM` ("DEV:INODE") names.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    v.to_str() == Some(&format!("{}:{}", meta.dev(), meta.ino()))
}

/// Installs the logger (once; later calls only change the level).
pub fn init(verbose: bool) {
    TO_JOURNAL.store(stderr_is_journal(), std::sync::atomic::Ordering::Relaxed);
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(if verbose {
        log::LevelFilter::Info
    } else {
        log::LevelFilter::Warn
    });
}

/// Now as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_utc(d.as_secs(), d.subsec_millis())
}

fn format_utc(secs: u64, millis: u32) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's civil_from_days).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(format_utc(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(format_utc(1_795_636_715, 123), "2026-11-25T19:58:35.123Z");
    }
}
