//! Which executables canal cannot intercept, from their ELF headers: a statically
//! linked ELF (no PT_INTERP: the dynamic loader, and so LD_PRELOAD, never runs) or a Go
//! program (its runtime makes system calls itself). Used by `canal run` for the
//! program it starts and by libcanal's exec hook for every program exec'd under canal,
//! so both say the same thing.
//!
//! No allocation and no I/O of its own (`no_std`): the caller supplies `read_at`, so
//! the preloaded library can use it with raw system calls inside an exec hook.
#![no_std]

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Dynamically linked, calls libc: canal takes its sockets.
    Fine,
    /// No program interpreter: LD_PRELOAD does nothing.
    Static,
    /// A Go binary (`.go.buildinfo` / `.note.go.buildid` section).
    Go,
}

/// The warning's text after the program's path, for each case canal cannot reach.
pub const WHY_STATIC: &str =
    "is statically linked: libcanal cannot be preloaded into it, so its sockets use the kernel, not canal";
pub const WHY_GO: &str =
    "is a Go program: its runtime makes socket system calls directly, so its sockets use the kernel, not canal";
pub const WHY_SETID: &str =
    "is set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD for it, so its sockets use the kernel, not canal";

impl Verdict {
    /// The warning's text after the path, if canal cannot reach the program.
    pub fn why(self) -> Option<&'static str> {
        match self {
            Verdict::Fine => None,
            Verdict::Static => Some(WHY_STATIC),
            Verdict::Go => Some(WHY_GO),
        }
    }
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Section names that mark a Go binary.
const GO_SECTIONS: [&[u8]; 2] = [b".go.buildinfo", b".note.go.buildid"];

/// Classifies a 64-bit little-endian ELF file read through `read_at(offset, buf)`
/// (true when `buf` was filled). Anything else — scripts, other ELF classes, short or
/// unreadable files — is `Fine`: the kernel or the interpreter decides.
pub fn classify(read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool) -> Verdict {
    classify_inner(read_at).unwrap_or(Verdict::Fine)
}

fn classify_inner(read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool) -> Option<Verdict> {
    let mut h = [0u8; 64];
    if !read_at(0, &mut h) || &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(&h, 32)?, u16_at(&h, 54)? as u64, u16_at(&h, 56)?);
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(&h, 40)?,
        u16_at(&h, 58)? as u64,
        u16_at(&h, 60)?,
        u16_at(&h, 62)?,
    );
    let mut has_interp = false;
    let mut ph = [0u8; 4];
    for i in 0..phnum as u64 {
        if read_at(phoff.checked_add(i.checked_mul(phentsize)?)?, &mut ph)
            && u32_at(&ph, 0) == Some(3)
        {
            has_interp = true; // PT_INTERP
            break;
        }
    }
    if shnum > 0 && shstrndx < shnum && shentsize >= 64 {
        let mut sh = [0u8; 64];
        if !read_at(shoff.checked_add(shstrndx as u64 * shentsize)?, &mut sh) {
            return None;
        }
        let (str_off, str_len) = (u64_at(&sh, 24)?, u64_at(&sh, 32)?);
        for i in 0..shnum as u64 {
            if !read_at(shoff.checked_add(i * shentsize)?, &mut sh) {
                return None;
            }
            let n = u32_at(&sh, 0)? as u64;
            let mut name = [0u8; 17];
            let avail = str_len.saturating_sub(n).min(name.len() as u64) as usize;
            if avail == 0 || !read_at(str_off.checked_add(n)?, &mut name[..avail]) {
                continue;
            }
            let end = name[..avail].iter().position(|&b| b == 0).unwrap_or(avail);
            if GO_SECTIONS.contains(&&name[..end]) {
                return Some(Verdict::Go);
            }
        }
    }
    Some(if has_interp {
        Verdict::Fine
    } else {
        Verdict::Static
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    fn from_bytes(b: &[u8]) -> Verdict {
        classify(&mut |off, buf: &mut [u8]| {
            let off = off as usize;
            match b.get(off..off + buf.len()) {
                Some(s) => {
                    buf.copy_from_slice(s);
                    true
                }
                None => false,
            }
        })
    }

    #[test]
    fn not_elf_is_fine() {
        assert_eq!(from_bytes(b"#!/bin/sh\necho hi\n"), Verdict::Fine);
        assert_eq!(from_bytes(b""), Verdict::Fine);
    }

    #[test]
    fn this_test_binary_is_dynamic() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(from_bytes(&me), Verdict::Fine);
    }

    #[test]
    fn truncated_headers_do_not_panic() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        for cut in [10usize, 64, 100, 1000] {
            let v: Vec<u8> = me[..cut.min(me.len())].to_vec();
            let _ = from_bytes(&v);
        }
    }
}
