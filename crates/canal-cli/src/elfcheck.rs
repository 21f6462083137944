//! Programs canal cannot intercept: `canal run` looks at the executable before running
//! it and prints one warning line when LD_PRELOAD cannot reach its socket calls — a
//! statically linked ELF (no PT_INTERP: the preload is never loaded) or a Go program
//! (its runtime issues the system calls itself). The program still runs, on kernel
//! sockets; nothing is bypassed silently.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use canal_elf::Verdict;

/// `prog` as execvp would find it.
pub fn resolve(prog: &str) -> Option<PathBuf> {
    if prog.contains('/') {
        return Some(PathBuf::from(prog));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// Classifies a 64-bit little-endian ELF file (canal_elf); anything else (scripts,
/// other ELF classes, unreadable files) is `Fine` — the kernel or the interpreter decides.
pub fn classify(path: &Path) -> Verdict {
    let Ok(f) = File::open(path) else {
        return Verdict::Fine;
    };
    canal_elf::classify(&mut |off, buf: &mut [u8]| f.read_exact_at(buf, off).is_ok())
}

/// Whether running `path` changes the process's credentials (set-user-ID to another
/// user, set-group-ID to another group): the kernel then starts it in secure-execution
/// mode (AT_SECURE) and the dynamic loader ignores LD_PRELOAD.
pub fn secure_exec(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    (m.mode() & libc::S_ISUID != 0 && m.uid() != uid)
        || (m.mode() & libc::S_ISGID != 0 && m.gid() != gid)
}

/// The warning line for `prog`, if any.
pub fn warning(prog: &str) -> Option<String> {
    let path = resolve(prog)?;
    let why = if secure_exec(&path) {
        canal_elf::WHY_SETID
    } else {
        classify(&path).why()?
    };
    Some(format!("canal: {} {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_programs_are_reported() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("canal-setuid-{}", std::process::id()));
        std::fs::copy(resolve("true").expect("true on PATH"), &d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o4755)).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        // Set-user-ID to ourselves changes nothing: no warning.
        assert!(!secure_exec(&d));
        if uid == 0 {
            // Owned by another user: the loader would drop LD_PRELOAD.
            std::os::unix::fs::chown(&d, Some(65534), None).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o4755)).unwrap();
            assert!(secure_exec(&d));
            assert!(warning(d.to_str().unwrap())
                .unwrap()
                .contains("set-user-ID"));
        }
        let _ = std::fs::remove_file(&d);
    }

    #[test]
    fn dynamic_binaries_are_fine() {
        let sh = resolve("sh").expect("sh on PATH");
        assert_eq!(classify(&sh), Verdict::Fine);
        assert_eq!(warning("sh"), None);
    }

    #[test]
    fn scripts_and_missing_files_are_fine() {
        assert_eq!(classify(Path::new("/nonexistent/x")), Verdict::Fine);
        let d = std::env::temp_dir().join(format!("canal-elfcheck-{}", std::process::id()));
        std::fs::write(&d, b"#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(classify(&d), Verdict::Fine);
        let _ = std::fs::remove_file(&d);
    }

    #[test]
    fn static_binary_is_flagged() {
        // Build one with the C compiler.
        let dir = std::env::temp_dir().join(format!("canal-elfcheck-s{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("s.c");
        std::fs::write(&src, b"int main(void){return 0;}\n").unwrap();
        let out = dir.join("s");
        let ok = std::process::Command::new("cc")
            .args(["-static", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok,
            "cc -static failed (gcc and libc6-dev are test dependencies)"
        );
        assert_eq!(classify(&out), Verdict::Static);
        assert!(warning(out.to_str().unwrap())
            .unwrap()
            .contains("statically linked"));
        // The same binary with Go's build-info section reads as a Go program.
        let marker = dir.join("bi");
        std::fs::write(&marker, b"\xff Go buildinf:").unwrap();
        let go = dir.join("g");
        let ok = std::process::Command::new("objcopy")
            .arg(format!("--add-section=.go.buildinfo={}", marker.display()))
            .arg(&out)
            .arg(&go)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "objcopy failed (binutils is a test dependency)");
        assert_eq!(classify(&go), Verdict::Go);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
