//! Integration tier: runs `tests/semantics.py` (real sockets against native peers)
//! under `libcanal.so` with a real canald. Says "skipped" and passes when canald is not
//! built or python3 is missing: build everything first with `cargo build --release`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// target/<profile> of this test binary (…/target/<profile>/deps/preload-…).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn find(name: &str) -> Option<PathBuf> {
    let here = profile_dir();
    let release = here.parent().unwrap().join("release");
    [here.join(name), release.join(name)]
        .into_iter()
        .find(|p| p.exists())
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(path: &Path) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `cargo test` does not rebuild the cdylib for integration tests: build it (same
/// profile) so the library under test is this source tree's.
fn build_cdylib() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", "libcanal"]);
    if profile_dir().ends_with("release") {
        cmd.arg("--release");
    }
    let st = cmd.status().expect("run cargo build");
    assert!(st.success(), "cargo build -p libcanal failed");
}

/// Starts canald on a private socket; None (after saying "skipped") if it is not built.
fn setup(tag: &str) -> Option<(Daemon, PathBuf, PathBuf)> {
    build_cdylib();
    let lib = profile_dir().join("libcanal.so");
    let (Some(canald), true) = (find("canald"), lib.exists()) else {
        eprintln!("skipped: canald or libcanal.so not built (run `cargo build --release`)");
        return None;
    };
    // canald and the library want a private directory (0700) for the control socket.
    let dir = std::env::temp_dir().join(format!("libcanal-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&dir)
        .expect("make the socket directory");
    let sock = dir.join("canald.sock");
    let d = Daemon(
        // These programs look at canal's own sockets: a fresh one must be canal's
        // (with the default --direct a fresh socket is the program's kernel socket
        // until its first address: tests/e2e/test_direct.py).
        Command::new(&canald)
            .arg("--socket")
            .arg(&sock)
            .args(["--direct", "off"])
            .spawn()
            .expect("start canald"),
    );
    assert!(wait_for(&sock), "canald did not create {}", sock.display());
    Some((d, sock, lib))
}

/// Runs `cmd` under the library; passes on exit 0, fails otherwise (77 = the program
/// found itself not under canal, which is a failure here).
fn run_under(mut cmd: Command, sock: &Path, lib: &Path) {
    let out = cmd
        .env("CANAL_SOCKET", sock)
        .env("LD_PRELOAD", lib)
        .output()
        .expect("run test program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    let _ = std::fs::remove_file(sock);
    assert_eq!(out.status.code(), Some(0), "failed:\n{stdout}\n{stderr}");
}

#[test]
fn c_program_under_canal() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/preload_check.c");
    let bin = std::env::temp_dir().join(format!("libcanal-check-{}", std::process::id()));
    let cc = Command::new("cc")
        .args(["-O2", "-D_FORTIFY_SOURCE=2", "-o"])
        .arg(&bin)
        .arg(&src)
        .status();
    if !cc.is_ok_and(|s| s.success()) {
        eprintln!("skipped: no working C compiler (cc)");
        return;
    }
    let Some((_d, sock, lib)) = setup("c") else {
        return;
    };
    let mut cmd = Command::new("timeout");
    cmd.arg("60").arg(&bin);
    run_under(cmd, &sock, &lib);
    let _ = std::fs::remove_file(&bin);
}

#[test]
fn semantics_under_canal() {
    if Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        eprintln!("skipped: python3 not available");
        return;
    }
    let Some((_d, sock, lib)) = setup("py") else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/semantics.py");
    let mut cmd = Command::new("timeout");
    cmd.arg("120").arg("python3").arg(&script);
    run_under(cmd, &sock, &lib);
}

#[test]
fn selection_policy_under_canal() {
    if Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        eprintln!("skipped: python3 not available");
        return;
    }
    let Some((_d, sock, lib)) = setup("policy") else {
        return;
    };
    // A free port for the excluded rule.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/policy.py");
    let mut cmd = Command::new("timeout");
    cmd.arg("60")
        .arg("python3")
        .arg(&script)
        .arg(port.to_string())
        .env("CANAL_EXCLUDE", format!("127.0.0.1:{port}, 10.0.0.0/8"));
    run_under(cmd, &sock, &lib);
}
