//! Links the unwinder into libcanal.so instead of depending on libgcc_s.so.1.
//!
//! Every program started under canal loads the library; a NEEDED libgcc_s.so.1 is one
//! more object for the dynamic loader, whose constructor probes the CPU with cpuid
//! (a trap to the hypervisor in a VM): about 0.1–0.2 ms of every exec here. The
//! library catches its own panics at each hook (catch_unwind), so no unwinding ever
//! crosses into the program's frames: its own copy of the unwinder (libgcc_eh.a,
//! which Rust's std uses the same way for static builds) serves it alone.
//!
//! How: Rust's std asks the linker for `-lgcc_s`; a linker script of that name, found
//! first on the search path of the cdylib's link only, names libgcc_eh.a instead.
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = out.join("static-unwind");
    std::fs::create_dir_all(&dir).expect("create OUT_DIR/static-unwind");
    std::fs::write(dir.join("libgcc_s.so"), "INPUT(-lgcc_eh)\n").expect("write the linker script");
    println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
    println!("cargo:rerun-if-changed=build.rs");
}
