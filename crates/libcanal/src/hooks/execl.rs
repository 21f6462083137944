//! execl, execlp, execle: the variadic exec functions. glibc's own implementations call
//! its internal exec, which no preloaded library sees, so without these a program that
//! uses them (shells' helpers, daemons spawning children) would skip the exec hooks:
//! no CANAL_REJOIN, no bridge, LD_PRELOAD possibly lost.
//!
//! Stable Rust cannot define a C variadic function, so each is defined with 48 fixed
//! pointer parameters after `path`: on x86-64 and AArch64 Linux a variadic call passes
//! pointer arguments exactly where a fixed call of that shape reads them (registers,
//! then the caller's stack), and we read only up to the terminating NULL (and execle's
//! environment right after it). A call with more than 46 arguments gets E2BIG
//! (glibc's limit is the kernel's; such literal lists do not occur in practice).
use crate::hooks::exec::environ;
use libc::c_char;
use libc::c_int;

const N: usize = 48;

/// argv (NULL-terminated) from the fixed parameters, and what follows its NULL.
fn collect(a: [*const c_char; N]) -> Option<(Vec<*const c_char>, *const c_char)> {
    let end = a.iter().position(|p| p.is_null())?;
    let after = if end + 1 < N {
        a[end + 1]
    } else {
        core::ptr::null()
    };
    let mut v = a[..end].to_vec();
    v.push(core::ptr::null());
    Some((v, after))
}

fn too_many() -> c_int {
    crate::sys::set_errno(libc::E2BIG);
    -1
}

/// The three functions over one parameter list (`$a`: N names).
macro_rules! variadic_execs {
    ($($a:ident),*) => {
        #[cfg_attr(not(test), no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn execl(path: *const c_char, $($a: *const c_char),*) -> c_int {
            let Some((argv, _)) = collect([$($a),*]) else {
                return too_many();
            };
            // SAFETY: a NULL-terminated argv built from the caller's strings.
            unsafe { crate::hooks::exec::execv(path, argv.as_ptr()) }
        }

        #[cfg_attr(not(test), no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn execlp(file: *const c_char, $($a: *const c_char),*) -> c_int {
            let Some((argv, _)) = collect([$($a),*]) else {
                return too_many();
            };
            // SAFETY: as above.
            unsafe { crate::hooks::exec::execvp(file, argv.as_ptr()) }
        }

        #[cfg_attr(not(test), no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn execle(path: *const c_char, $($a: *const c_char),*) -> c_int {
            let Some((argv, envp)) = collect([$($a),*]) else {
                return too_many();
            };
            let envp = if envp.is_null() {
                // SAFETY: reading libc's environ pointer (an execle without one is a
                // caller bug).
                unsafe { environ }
            } else {
                envp as *const *const c_char
            };
            // SAFETY: as above; envp is the caller's environment array.
            unsafe { crate::hooks::exec::execve(path, argv.as_ptr(), envp) }
        }
    };
}

variadic_execs!(
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20,
    a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39,
    a40, a41, a42, a43, a44, a45, a46, a47
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_up_to_the_null_and_what_follows() {
        let (a, b) = (c"a".as_ptr(), c"b".as_ptr());
        let mut v = [core::ptr::null(); N];
        v[0] = a;
        v[1] = b;
        v[3] = c"env".as_ptr();
        let (argv, after) = collect(v).unwrap();
        assert_eq!(argv, vec![a, b, core::ptr::null()]);
        assert_eq!(after, v[3]);
        assert!(collect([a; N]).is_none());
    }
}
