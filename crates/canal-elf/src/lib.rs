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
    // Tables are read a chunk at a time, not an entry at a time: this runs in every
    // exec under canal, where each read is a system call (about 70 for /bin/true
    // before, 5 now).
    let mut chunk = [0u8; CHUNK];
    let mut has_interp = false;
    let mut i = 0;
    while i < phnum as u64 && !has_interp {
        let ents = read_entries(read_at, phoff, phentsize, phnum as u64, i, &mut chunk)?;
        has_interp = ents.iter().any(|ph| u32_at(ph, 0) == Some(3)); // PT_INTERP
        i += ents.len() as u64;
    }
    if shnum > 0 && shstrndx < shnum && shentsize >= 64 {
        let mut sh = [0u8; 64];
        if !read_at(shoff.checked_add(shstrndx as u64 * shentsize)?, &mut sh) {
            return None;
        }
        let mut names = Strings::new(u64_at(&sh, 24)?, u64_at(&sh, 32)?);
        let mut i = 0;
        while i < shnum as u64 {
            let ents = read_entries(read_at, shoff, shentsize, shnum as u64, i, &mut chunk)?;
            i += ents.len() as u64;
            for sh in ents.iter() {
                let Some(n) = u32_at(sh, 0) else { continue };
                if names
                    .get(read_at, u64::from(n))
                    .is_some_and(|name| GO_SECTIONS.contains(&name))
                {
                    return Some(Verdict::Go);
                }
            }
        }
    }
    Some(if has_interp {
        Verdict::Fine
    } else {
        Verdict::Static
    })
}

/// Bytes read at once from a header table.
const CHUNK: usize = 2048;

/// Entries `first..` of a table of `count` entries of `entsize` bytes at file offset
/// `off`: as many as `buf` holds, read at once. None if unreadable, or if an entry is
/// smaller than 4 bytes or larger than `buf`.
fn read_entries<'b>(
    read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool,
    off: u64,
    entsize: u64,
    count: u64,
    first: u64,
    buf: &'b mut [u8],
) -> Option<Entries<'b>> {
    let per = buf.len() as u64 / entsize;
    if per == 0 || entsize < 4 {
        return None;
    }
    let n = per.min(count - first);
    let bytes = (n * entsize) as usize;
    if !read_at(
        off.checked_add(first.checked_mul(entsize)?)?,
        &mut buf[..bytes],
    ) {
        return None;
    }
    Some(Entries {
        bytes: &buf[..bytes],
        size: entsize as usize,
    })
}

/// Table entries read at once (`read_entries`).
struct Entries<'b> {
    bytes: &'b [u8],
    size: usize,
}

impl<'b> Entries<'b> {
    fn len(&self) -> usize {
        self.bytes.len() / self.size
    }

    fn iter(&self) -> core::slice::ChunksExact<'b, u8> {
        self.bytes.chunks_exact(self.size)
    }
}

/// The section-name string table, read a window at a time.
struct Strings {
    off: u64,
    len: u64,
    /// The window: table offset of `buf[0]`, and bytes held.
    start: u64,
    held: usize,
    buf: [u8; 512],
}

/// A name longer than the longest one looked for cannot match; only this much of each
/// is read.
const NAME_MAX: u64 = 17;

impl Strings {
    fn new(off: u64, len: u64) -> Strings {
        Strings {
            off,
            len,
            start: 0,
            held: 0,
            buf: [0; 512],
        }
    }

    /// The name at table offset `n` (up to its NUL or `NAME_MAX` bytes); None if it is
    /// outside the table or unreadable.
    fn get(&mut self, read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool, n: u64) -> Option<&[u8]> {
        if n >= self.len {
            return None;
        }
        let end = self.len.min(n + NAME_MAX);
        if n < self.start || end > self.start + self.held as u64 {
            let held = (self.len - n).min(self.buf.len() as u64) as usize;
            if !read_at(self.off.checked_add(n)?, &mut self.buf[..held]) {
                self.held = 0;
                return None;
            }
            (self.start, self.held) = (n, held);
        }
        let name = &self.buf[(n - self.start) as usize..(end - self.start) as usize];
        let cut = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Some(&name[..cut])
    }
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

    /// A minimal ELF: header, one program header (PT_INTERP or PT_LOAD), `extra`
    /// empty sections, then a string table section whose names include `name`.
    fn synthetic(interp: bool, extra: usize, name: &[u8]) -> Vec<u8> {
        let mut strtab = b"\0.shstrtab\0".to_vec();
        let name_off = strtab.len() as u32;
        strtab.extend_from_slice(name);
        strtab.push(0);
        let shnum = extra + 2; // null section, `extra` named `name`, .shstrtab
        let (phoff, shoff) = (64u64, 64u64 + 56);
        let str_off = shoff + 64 * shnum as u64;
        let mut b = std::vec![0u8; str_off as usize];
        b[..4].copy_from_slice(b"\x7fELF");
        (b[4], b[5]) = (2, 1);
        b[32..40].copy_from_slice(&phoff.to_le_bytes());
        b[40..48].copy_from_slice(&shoff.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&1u16.to_le_bytes());
        b[58..60].copy_from_slice(&64u16.to_le_bytes());
        b[60..62].copy_from_slice(&(shnum as u16).to_le_bytes());
        b[62..64].copy_from_slice(&((shnum - 1) as u16).to_le_bytes());
        let pt: u32 = if interp { 3 } else { 1 };
        b[64..68].copy_from_slice(&pt.to_le_bytes());
        for i in 1..=extra {
            let o = (shoff + 64 * i as u64) as usize;
            b[o..o + 4].copy_from_slice(&name_off.to_le_bytes());
        }
        let o = (shoff + 64 * (shnum as u64 - 1)) as usize;
        b[o..o + 4].copy_from_slice(&1u32.to_le_bytes());
        b[o + 24..o + 32].copy_from_slice(&str_off.to_le_bytes());
        b[o + 32..o + 40].copy_from_slice(&(strtab.len() as u64).to_le_bytes());
        b.extend_from_slice(&strtab);
        b
    }

    #[test]
    fn go_sections_and_interpreters_are_told_apart() {
        assert_eq!(from_bytes(&synthetic(true, 3, b".text")), Verdict::Fine);
        assert_eq!(from_bytes(&synthetic(false, 3, b".text")), Verdict::Static);
        assert_eq!(
            from_bytes(&synthetic(true, 1, b".go.buildinfo")),
            Verdict::Go
        );
        assert_eq!(
            from_bytes(&synthetic(false, 1, b".note.go.buildid")),
            Verdict::Go
        );
        // A prefix of a Go name is not one; nor is a longer name starting with one.
        assert_eq!(from_bytes(&synthetic(true, 1, b".go.build")), Verdict::Fine);
        assert_eq!(
            from_bytes(&synthetic(true, 1, b".go.buildinfox")),
            Verdict::Fine
        );
        // Many sections: more than one chunk of the table.
        assert_eq!(
            from_bytes(&synthetic(true, 100, b".go.buildinfo")),
            Verdict::Go
        );
        assert_eq!(from_bytes(&synthetic(true, 100, b".data")), Verdict::Fine);
    }

    #[test]
    fn a_real_binary_takes_a_few_reads() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        let mut reads = 0;
        let v = classify(&mut |off, buf: &mut [u8]| {
            reads += 1;
            let off = off as usize;
            match me.get(off..off + buf.len()) {
                Some(s) => {
                    buf.copy_from_slice(s);
                    true
                }
                None => false,
            }
        });
        assert_eq!(v, Verdict::Fine);
        assert!(reads <= 8, "{reads} reads");
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
