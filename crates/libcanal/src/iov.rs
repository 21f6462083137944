//! Scatter/gather between an application's `iovec` array and a ring.
//!
//! `skip` counts bytes of the iovec list already handled, so a blocking call that
//! queues its data in several rounds resumes where it stopped.

use canal_abi::ring::{copy_in, copy_out, RingStorage};
use libc::iovec;

/// Sum of the iovec lengths; EINVAL if it overflows ssize_t (as the kernel says).
pub(crate) fn total_len(iov: &[iovec]) -> Result<usize, i32> {
    let mut t: usize = 0;
    for v in iov {
        t = t.checked_add(v.iov_len).ok_or(libc::EINVAL)?;
    }
    if t > isize::MAX as usize {
        return Err(libc::EINVAL);
    }
    Ok(t)
}

/// Walks `n` bytes of the iovec list starting `skip` bytes in, calling `f(piece,
/// offset_within_the_n_bytes)` for each contiguous piece.
///
/// # Safety
/// Every iovec must describe `iov_len` bytes of valid memory (the application's promise).
unsafe fn walk(
    iov: &[iovec],
    mut skip: usize,
    mut n: usize,
    mut f: impl FnMut(*mut u8, usize, usize),
) {
    let mut done = 0;
    for v in iov {
        if n == 0 {
            break;
        }
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let len = (v.iov_len - skip).min(n);
        // SAFETY: skip < iov_len, so the pointer stays inside the caller's buffer.
        let p = unsafe { (v.iov_base as *mut u8).add(skip) };
        f(p, len, done);
        done += len;
        n -= len;
        skip = 0;
    }
}

/// Copies `n` bytes of the iovecs (from `skip`) into the ring at index `pos`.
///
/// # Safety
/// As for `walk`: the iovecs describe readable memory.
pub(crate) unsafe fn gather_into<S: RingStorage + ?Sized>(
    ring: &S,
    pos: u64,
    iov: &[iovec],
    skip: usize,
    n: usize,
) {
    // SAFETY: forwarded caller guarantee; each piece is a valid readable slice.
    unsafe {
        walk(iov, skip, n, |p, len, off| {
            let src = core::slice::from_raw_parts(p as *const u8, len);
            copy_in(ring, pos.wrapping_add(off as u64), src);
        })
    }
}

/// Copies `n` bytes from the ring at index `pos` into the iovecs (from `skip`).
///
/// # Safety
/// As for `walk`: the iovecs describe writable memory.
pub(crate) unsafe fn scatter_from<S: RingStorage + ?Sized>(
    ring: &S,
    pos: u64,
    iov: &[iovec],
    skip: usize,
    n: usize,
) {
    // SAFETY: forwarded caller guarantee; each piece is a valid writable slice.
    unsafe {
        walk(iov, skip, n, |p, len, off| {
            let dst = core::slice::from_raw_parts_mut(p, len);
            copy_out(ring, pos.wrapping_add(off as u64), dst);
        })
    }
}

/// Calls `f` with the iovecs' pieces as byte slices (at most `n` bytes).
///
/// # Safety
/// As for `walk`: the iovecs describe readable memory that outlives the call.
pub(crate) unsafe fn for_each_slice<'a>(iov: &[iovec], n: usize, mut f: impl FnMut(&'a [u8])) {
    // SAFETY: forwarded caller guarantee.
    unsafe {
        walk(iov, 0, n, |p, len, _| {
            f(core::slice::from_raw_parts(p as *const u8, len))
        })
    }
}

/// Builds the iovec array for a contiguous buffer (send/recv on one buffer).
pub(crate) fn single(buf: *mut libc::c_void, len: usize) -> iovec {
    iovec {
        iov_base: buf,
        iov_len: len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cell::RefCell;

    struct VecRing(RefCell<Vec<u8>>);
    impl RingStorage for VecRing {
        fn size(&self) -> u64 {
            self.0.borrow().len() as u64
        }
        fn write(&self, off: usize, src: &[u8]) {
            self.0.borrow_mut()[off..off + src.len()].copy_from_slice(src);
        }
        fn read(&self, off: usize, dst: &mut [u8]) {
            dst.copy_from_slice(&self.0.borrow()[off..off + dst.len()]);
        }
    }

    fn iov_of(bufs: &mut [Vec<u8>]) -> Vec<iovec> {
        bufs.iter_mut()
            .map(|b| iovec {
                iov_base: b.as_mut_ptr() as *mut _,
                iov_len: b.len(),
            })
            .collect()
    }

    #[test]
    fn gather_scatter_with_wrap_and_skip() {
        let ring = VecRing(RefCell::new(vec![0; 16]));
        let mut src = vec![b"abc".to_vec(), vec![], b"defghij".to_vec()];
        let iov = iov_of(&mut src);
        assert_eq!(total_len(&iov), Ok(10));
        // Start at index 12 so the copy wraps; skip the first 2 bytes ("ab").
        // SAFETY: the iovecs point into `src`, alive for the call.
        unsafe { gather_into(&ring, 12, &iov, 2, 8) };
        let mut dst = vec![vec![0u8; 5], vec![0u8; 5]];
        let oiov = iov_of(&mut dst);
        // SAFETY: the iovecs point into `dst`.
        unsafe { scatter_from(&ring, 12, &oiov, 1, 8) };
        assert_eq!(&dst[0], &[0, b'c', b'd', b'e', b'f']);
        assert_eq!(&dst[1], b"ghij\0");
    }

    #[test]
    fn overflow_is_einval() {
        let iov = [
            iovec {
                iov_base: core::ptr::null_mut(),
                iov_len: usize::MAX,
            },
            iovec {
                iov_base: core::ptr::null_mut(),
                iov_len: 1,
            },
        ];
        assert_eq!(total_len(&iov), Err(libc::EINVAL));
    }

    #[test]
    fn slices_limited() {
        let mut src = vec![b"hello".to_vec(), b"world".to_vec()];
        let iov = iov_of(&mut src);
        let mut got = vec![];
        // SAFETY: the iovecs point into `src`.
        unsafe { for_each_slice(&iov, 7, |s| got.extend_from_slice(s)) };
        assert_eq!(got, b"hellowo");
    }
}
