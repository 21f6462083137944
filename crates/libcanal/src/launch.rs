//! What an exec'd image gets from a process under canal: an environment that keeps it
//! under canal, and a warning when it is a program canal cannot reach.
//!
//! `canal run` covers a process tree: programs that build their children's environment
//! from scratch (systemd-socket-activate, `env -i`, daemons that sanitise it) would
//! otherwise drop LD_PRELOAD and the CANAL_* settings, and their children would run on
//! kernel sockets (or find another canald) without a word. So every exec carries the
//! library in LD_PRELOAD (first, ahead of the program's own preloads) and each CANAL_*
//! setting this process started with that the new environment lacks; a setting the
//! program chose itself is kept. And as `canal run` does for the first program, an
//! exec'd program that LD_PRELOAD cannot reach (static, Go, set-ID) gets one line on
//! stderr (canal_elf).

use crate::sys;
use libc::c_char;
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// The settings an exec'd image needs to find the same canald and wait the same way.
const KEPT: [&[u8]; 8] = [
    b"CANAL_SOCKET",
    // Set by `canal run --isolate`: canald serves static and Go programs by seccomp.
    b"CANAL_SECCOMP",
    b"CANAL_NOTIFY",
    b"CANAL_SPIN",
    b"CANAL_LOG",
    b"CANAL_EXCLUDE",
    b"CANAL_DISABLE",
    b"CANAL_NO_SHORTCUT",
];

struct Snapshot {
    /// This library's path, as the loader mapped it.
    lib: Option<CString>,
    /// `LD_PRELOAD=<lib>`, made once (an exec in a vfork child must not allocate).
    preload: Option<CString>,
    /// `NAME=value` of each KEPT setting present at start.
    kept: Vec<CString>,
}

static SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();

/// Takes the snapshot (library constructor, before the program can change its
/// environment).
pub(crate) fn at_start() {
    let _ = SNAPSHOT.get_or_init(take_snapshot);
}

fn take_snapshot() -> Snapshot {
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    let here = at_start as *const libc::c_void;
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    let found = unsafe { libc::dladdr(here, &mut info) } != 0 && !info.dli_fname.is_null();
    // SAFETY: dli_fname points to the object's path, alive as long as the object
    // (never unloaded).
    let lib = found
        .then(|| unsafe { CStr::from_ptr(info.dli_fname) }.to_owned())
        .filter(|p| p.as_bytes().starts_with(b"/"));
    let kept = std::env::vars_os()
        .filter(|(k, _)| KEPT.contains(&k.as_encoded_bytes()))
        .filter_map(|(k, v)| {
            let mut e = k.into_encoded_bytes();
            e.push(b'=');
            e.extend_from_slice(v.as_encoded_bytes());
            CString::new(e).ok()
        })
        .collect();
    snapshot_of(lib, kept)
}

fn snapshot_of(lib: Option<CString>, kept: Vec<CString>) -> Snapshot {
    let preload = lib.as_ref().and_then(|l| {
        let mut e = b"LD_PRELOAD=".to_vec();
        e.extend_from_slice(l.as_bytes());
        CString::new(e).ok()
    });
    Snapshot { lib, preload, kept }
}

/// Most environment entries an exec'd image gets through the rewrite (beyond: the
/// caller's environment goes unchanged).
const MAX_ENTRIES: usize = 1024;

/// The environment an exec'd image gets: pointers into the caller's strings, the
/// snapshot's and its own. No allocation unless the program has a preload list of
/// its own to put ours in front of (`alloc`: false in a vfork child).
pub(crate) struct ExecEnv {
    combined: Option<CString>,
    rejoin: Option<CString>,
    ptrs: [*const c_char; MAX_ENTRIES + 1],
    /// The caller's environment, when it could not be rewritten.
    original: *const *const c_char,
}

impl ExecEnv {
    pub(crate) fn as_ptr(&self) -> *const *const c_char {
        if self.original.is_null() {
            self.ptrs.as_ptr()
        } else {
            self.original
        }
    }
}

fn name_of(entry: &[u8]) -> &[u8] {
    entry.split(|&b| b == b'=').next().unwrap_or(entry)
}

/// `envp` (the caller's), without any CANAL_REJOIN, with this library in LD_PRELOAD,
/// the missing CANAL_* settings, and `rejoin` if given.
///
/// # Safety
/// `envp` is null or a NULL-terminated array of valid C strings (exec's contract).
pub(crate) unsafe fn exec_env(
    envp: *const *const c_char,
    rejoin: Option<CString>,
    alloc: bool,
) -> ExecEnv {
    let Some(snap) = SNAPSHOT.get() else {
        let mut e = ExecEnv {
            combined: None,
            rejoin: None,
            ptrs: [core::ptr::null(); MAX_ENTRIES + 1],
            original: envp,
        };
        e.original = if envp.is_null() {
            e.ptrs.as_ptr()
        } else {
            envp
        };
        return e;
    };
    // SAFETY: forwarded contract.
    unsafe { rewrite(envp, rejoin, alloc, snap) }
}

/// # Safety
/// As `exec_env`.
unsafe fn rewrite(
    envp: *const *const c_char,
    rejoin: Option<CString>,
    alloc: bool,
    snap: &Snapshot,
) -> ExecEnv {
    let mut out = ExecEnv {
        combined: None,
        rejoin,
        ptrs: [core::ptr::null(); MAX_ENTRIES + 1],
        original: core::ptr::null(),
    };
    let mut n = 0;
    let mut preload: Option<*const c_char> = None;
    let mut have_setting = [false; KEPT.len()];
    let mut i = 0;
    while !envp.is_null() {
        // SAFETY: envp is a NULL-terminated array of C strings (exec's contract).
        let p = unsafe { *envp.add(i) };
        i += 1;
        if p.is_null() {
            break;
        }
        // SAFETY: p is a valid C string that outlives the exec call.
        let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
        let name = name_of(bytes);
        if name == b"CANAL_REJOIN" {
            continue;
        }
        if let Some(k) = KEPT.iter().position(|k| *k == name) {
            have_setting[k] = true;
        }
        if name == b"LD_PRELOAD" {
            preload = Some(p);
            continue;
        }
        if n == MAX_ENTRIES - 16 {
            out.original = envp; // too many to rewrite: the caller's, unchanged
            return out;
        }
        out.ptrs[n] = p;
        n += 1;
    }
    // LD_PRELOAD: the program's if ours is in it (or we cannot say), else ours first.
    let preload_entry = match preload {
        // SAFETY: an entry of envp, as above.
        Some(p) => match with_library(unsafe { CStr::from_ptr(p) }.to_bytes(), snap) {
            Some(_) if !alloc => p,
            Some(v) => out.combined.insert(v).as_ptr(),
            None => p,
        },
        None => snap
            .preload
            .as_ref()
            .map_or(core::ptr::null(), |c| c.as_ptr()),
    };
    if !preload_entry.is_null() {
        out.ptrs[n] = preload_entry;
        n += 1;
    }
    for k in &snap.kept {
        let name = name_of(k.as_bytes());
        if let Some(pos) = KEPT.iter().position(|x| *x == name) {
            if !have_setting[pos] {
                out.ptrs[n] = k.as_ptr();
                n += 1;
            }
        }
    }
    if let Some(r) = &out.rejoin {
        out.ptrs[n] = r.as_ptr();
        n += 1;
    }
    out.ptrs[n] = core::ptr::null();
    out
}

/// `LD_PRELOAD=...` with this library first, or None if it already is in the list.
fn with_library(entry: &[u8], snap: &Snapshot) -> Option<CString> {
    let lib = snap.lib.as_ref()?.as_bytes();
    let value = entry.get(b"LD_PRELOAD=".len()..)?;
    let listed = value
        .split(|&b| b == b':' || b == b' ')
        .any(|item| item == lib);
    if listed {
        return None;
    }
    let mut e = b"LD_PRELOAD=".to_vec();
    e.extend_from_slice(lib);
    if !value.is_empty() {
        e.push(b':');
        e.extend_from_slice(value);
    }
    CString::new(e).ok()
}

// ---- programs canal cannot reach ----------------------------------------------------------------

/// The executable `file` names as execvp would find it (PATH of this process).
pub(crate) fn resolve(file: &CStr) -> Option<CString> {
    let f = file.to_bytes();
    if f.is_empty() || f.contains(&b'/') {
        return Some(file.to_owned());
    }
    let path = std::env::var_os("PATH")
        .map_or_else(|| b"/bin:/usr/bin".to_vec(), |p| p.into_encoded_bytes());
    path.split(|&b| b == b':').find_map(|dir| {
        let dir = if dir.is_empty() { &b"."[..] } else { dir };
        let mut c = dir.to_vec();
        c.push(b'/');
        c.extend_from_slice(f);
        let c = CString::new(c).ok()?;
        // SAFETY: a NUL-terminated path; access only checks.
        (unsafe { crate::sys::raw_syscall!(libc::SYS_access, c.as_ptr(), libc::X_OK) } == 0)
            .then_some(c)
    })
}

/// One stderr line if the program at `path` (or open at `fd` when ≥ 0) is one canal
/// cannot reach, as `canal run` prints for the program it starts.
pub(crate) fn warn_if_unreachable(path: &CStr, fd: libc::c_int) {
    if sys::confined() {
        return;
    }
    let own = fd < 0;
    let fd = if own {
        // SAFETY: a NUL-terminated path; flags only.
        let r = unsafe {
            crate::sys::raw_syscall!(
                libc::SYS_openat,
                libc::AT_FDCWD,
                path.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if r < 0 {
            return;
        }
        r as libc::c_int
    } else {
        fd
    };
    let why = if set_id(fd) {
        Some(canal_elf::WHY_SETID)
    } else {
        canal_elf::classify(&mut |off, buf: &mut [u8]| sys::pread(fd, buf, off) == Ok(buf.len()))
            .why()
    };
    if own {
        let _ = sys::close(fd);
    }
    // Inside `canal run --isolate`, seccomp service reaches static and Go programs.
    let served = crate::rt::env(c"CANAL_SECCOMP").is_some_and(|v| v == b"1");
    if let Some(why) = why.filter(|w| !served || *w == canal_elf::WHY_SETID) {
        sys::log_fmt(format_args!("canal: {} {why}\n", path.to_string_lossy()));
    }
}

/// Whether exec'ing the file open at `fd` changes credentials (secure execution: the
/// loader ignores LD_PRELOAD).
fn set_id(fd: libc::c_int) -> bool {
    let Ok(st) = sys::fstat(fd) else {
        return false;
    };
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    (st.st_mode & libc::S_ISUID != 0 && st.st_uid != uid)
        || (st.st_mode & libc::S_ISGID != 0 && st.st_gid != gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(e: &ExecEnv) -> Vec<String> {
        let mut v = vec![];
        let p = e.as_ptr();
        for i in 0.. {
            // SAFETY: a NULL-terminated array of live C strings.
            let s = unsafe { *p.add(i) };
            if s.is_null() {
                break;
            }
            // SAFETY: as above.
            v.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
        }
        v
    }

    #[test]
    fn preload_and_settings_are_kept_and_rejoin_replaced() {
        let snap = snapshot_of(
            Some(CString::new("/x/libcanal.so").unwrap()),
            vec![
                CString::new("CANAL_SOCKET=/run/c.sock").unwrap(),
                CString::new("CANAL_LOG=debug").unwrap(),
            ],
        );
        let a = CString::new("A=1").unwrap();
        let old = CString::new("CANAL_REJOIN=old").unwrap();
        let mine = CString::new("CANAL_LOG=off").unwrap();
        let env = [a.as_ptr(), old.as_ptr(), mine.as_ptr(), core::ptr::null()];
        let rejoin = Some(CString::new("CANAL_REJOIN=new").unwrap());
        // SAFETY: env is a NULL-terminated array of C strings.
        let e = unsafe { rewrite(env.as_ptr(), rejoin, true, &snap) };
        assert_eq!(
            env_of(&e),
            [
                "A=1",
                "CANAL_LOG=off",
                "LD_PRELOAD=/x/libcanal.so",
                "CANAL_SOCKET=/run/c.sock",
                "CANAL_REJOIN=new"
            ]
        );
        // A program's own preload stays, after ours; ours is not added twice; without
        // allocation (a vfork child) the program's list is left alone.
        let theirs = CString::new("LD_PRELOAD=/y/other.so").unwrap();
        let env = [theirs.as_ptr(), core::ptr::null()];
        // SAFETY: as above.
        let e = unsafe { rewrite(env.as_ptr(), None, true, &snap) };
        assert_eq!(env_of(&e)[0], "LD_PRELOAD=/x/libcanal.so:/y/other.so");
        // SAFETY: as above.
        let e = unsafe { rewrite(env.as_ptr(), None, false, &snap) };
        assert_eq!(env_of(&e)[0], "LD_PRELOAD=/y/other.so");
        let both = CString::new("LD_PRELOAD=/y/other.so /x/libcanal.so").unwrap();
        let env = [both.as_ptr(), core::ptr::null()];
        // SAFETY: as above.
        let e = unsafe { rewrite(env.as_ptr(), None, true, &snap) };
        assert_eq!(env_of(&e)[0], "LD_PRELOAD=/y/other.so /x/libcanal.so");
    }

    #[test]
    fn path_search_finds_sh() {
        let p = resolve(c"sh").unwrap();
        assert!(p.to_bytes().ends_with(b"/sh"), "{p:?}");
        assert_eq!(resolve(c"/bin/x").unwrap().as_bytes(), b"/bin/x");
    }
}
