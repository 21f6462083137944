//! Configuration files: TOML whose keys are canald's long option names
//! (`data-mib = 64`), read from `--config FILE`, else from the system file and then
//! the user's (a user key wins over the system one).
//!
//! A file is trusted like the control directory (`ctldir`): it must belong to the
//! daemon's user or root and be writable by nobody else, or another user could set
//! canald's policy (allowed destinations, quotas) for it.
use super::args::DaemonArgs;
use super::model::ConfigError;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The host-wide file.
pub const SYSTEM_FILE: &str = "/etc/canal/canald.toml";

/// One configuration file, read and checked.
#[derive(Debug, Clone)]
pub(crate) struct ConfigFile {
    pub(crate) path: PathBuf,
    text: String,
    pub(crate) args: DaemonArgs,
}

/// `$XDG_CONFIG_HOME/canal/canald.toml`, else `$HOME/.config/canal/canald.toml`.
pub(crate) fn user_file() -> Option<PathBuf> {
    let nonempty = |v: &str| std::env::var_os(v).filter(|p| !p.is_empty());
    let base = nonempty("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("canal").join("canald.toml"))
}

/// The files to read: `explicit` alone (it must exist), else whichever of the system
/// and user files exist, in that order.
pub(crate) fn load_all(explicit: Option<&Path>) -> Result<Vec<ConfigFile>, ConfigError> {
    if let Some(p) = explicit {
        return Ok(vec![load(p)?]);
    }
    let mut out = load_system()?;
    if let Some(p) = user_file() {
        match std::fs::metadata(&p) {
            Ok(_) => out.push(load(&p)?),
            // Not there, or under a home this process may not search (a program run
            // as another user with HOME still set): no user file to apply.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) => {}
            Err(e) => return Err(file_error(&p, 0, e.to_string())),
        }
    }
    Ok(out)
}

/// The system file alone, if it exists (a user's canald: never the user's file).
pub(crate) fn load_system() -> Result<Vec<ConfigFile>, ConfigError> {
    let p = Path::new(SYSTEM_FILE);
    match std::fs::metadata(p) {
        Ok(_) => Ok(vec![load(p)?]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(file_error(p, 0, e.to_string())),
    }
}

fn file_error(path: &Path, line: usize, reason: String) -> ConfigError {
    ConfigError::File {
        path: path.into(),
        line,
        reason,
    }
}

/// Reads, checks the owner and mode of, and parses one file.
pub(crate) fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| file_error(path, 0, e.to_string()))?;
    let me = crate::sys::getuid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(file_error(
            path,
            0,
            format!(
                "it belongs to uid {}, not to canald's user (uid {me}) or root; refusing it",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(file_error(
            path,
            0,
            format!(
                "it is writable by other users (mode {:04o}); refusing it (chmod go-w)",
                meta.mode() & 0o7777
            ),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| file_error(path, 0, e.to_string()))?;
    parse(path, text)
}

/// Parses `text` (the contents of `path`).
pub(crate) fn parse(path: &Path, text: String) -> Result<ConfigFile, ConfigError> {
    match toml::from_str::<DaemonArgs>(&text) {
        Ok(args) => Ok(ConfigFile {
            path: path.into(),
            text,
            args,
        }),
        Err(e) => {
            let line = e.span().map_or(0, |s| line_at(&text, s.start));
            Err(file_error(path, line, e.message().trim_end().to_string()))
        }
    }
}

/// The 1-based line of byte offset `at`.
fn line_at(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

impl ConfigFile {
    /// The line that sets `key` at the top level (0 if none is found), for
    /// `--print-config` and for errors found after parsing.
    pub(crate) fn line_of(&self, key: &str) -> usize {
        let mut in_table = false;
        for (i, l) in self.text.lines().enumerate() {
            let t = l.trim_start();
            if t.starts_with('[') {
                in_table = true;
            }
            if in_table {
                continue;
            }
            if let Some(rest) = t.strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return i + 1;
                }
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<ConfigFile, String> {
        parse(Path::new("/c.toml"), text.into()).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_are_the_long_options() {
        let f = p(
            "# comment\nslots = 64\ndata-mib = 16\nnotify = \"sleep\"\nzones = true\n\
                   pin = [0, 1]\nloopback-only = true\ndns = \"127.0.0.1:5353\"\n",
        )
        .unwrap();
        assert_eq!(f.args.slots, Some(64));
        assert_eq!(f.args.data_mib, Some(16));
        assert_eq!(f.args.zones, Some(true));
        assert_eq!(f.args.pin, vec![0, 1]);
        assert!(f.args.loopback_only);
        assert_eq!(f.line_of("slots"), 2);
        assert_eq!(f.line_of("data-mib"), 3);
        assert_eq!(f.line_of("spin"), 0);
        assert_eq!(p("zones = \"off\"").unwrap().args.zones, Some(false));
    }

    #[test]
    fn errors_name_the_line_and_the_reason() {
        let e = p("slots = 64\n\nbogus = 1\n").unwrap_err();
        assert!(e.starts_with("/c.toml:3: unknown field `bogus`"), "{e}");
        let e = p("slots = 64\nnotify = \"spin\"\n").unwrap_err();
        assert!(e.starts_with("/c.toml:2: "), "{e}");
        assert!(e.contains("not poll, sleep or hybrid"), "{e}");
        let e = p("slots = \"many\"\n").unwrap_err();
        assert!(e.starts_with("/c.toml:1: invalid type"), "{e}");
        let e = p("slots = \n").unwrap_err();
        assert!(e.starts_with("/c.toml:1: "), "{e}");
        // Options of the command line only are not keys.
        assert!(p("print-config = true\n").is_err());
        assert!(p("config = \"/x\"\n").is_err());
    }
}
