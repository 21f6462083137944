//! B11 (`canal bench b11`): the same QEMU guest runs the same programs over virtio-net
//! (QEMU user networking) and over canal (ivshmem + canald), interleaved, against host
//! servers on 127.0.0.1 (the guest's 10.0.2.2); the same clients also run natively on
//! the host as the baseline. One boot with both devices, so both transports see the
//! same guest, kernel and accelerator.
//!
//! Tests: `iperf3 -c` throughput (receiver side, Mbit/s) and a TCP request/response
//! probe (`canal-bench-gen --mode rr --size 64`: mean and p99 round trip).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `canal bench b11`: the same QEMU guest and programs over canal (ivshmem) and over
/// virtio-net, interleaved in one boot, plus the same clients natively on the host as
/// the baseline. Needs qemu-system-x86_64, iperf3, and canal-bench-gen next to canal.
#[derive(clap::Args, Debug, Clone)]
pub struct B11Args {
    /// 1 rep of 1 s per test (checks it runs)
    #[arg(long)]
    pub(crate) quick: bool,
    /// Repetitions
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) reps: u32,
    /// Seconds per run
    #[arg(long, value_name = "S", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) duration: u32,
    /// Also write the Markdown report to FILE
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// Accelerator for the guest
    #[arg(long, value_name = "auto|kvm|tcg", value_parser = ["auto", "kvm", "tcg"])]
    pub(crate) accel: Option<String>,
    /// The canal device without ivshmem doorbells (bounded backoff wake-ups)
    #[arg(long)]
    pub(crate) no_doorbell: bool,
}

struct Opts {
    reps: usize,
    duration: u32,
    out: Option<PathBuf>,
    accel: Option<String>,
    no_doorbell: bool,
}

impl B11Args {
    fn opts(&self) -> Opts {
        Opts {
            reps: if self.quick { 1 } else { self.reps as usize },
            duration: if self.quick { 1 } else { self.duration },
            out: self.out.clone(),
            accel: self.accel.clone(),
            no_doorbell: self.no_doorbell,
        }
    }
}

/// A host echo server for the RR probe: echoes every byte back, one thread per
/// connection, until the process ends.
fn echo_server() -> std::io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c: TcpStream = c;
                let _ = c.set_nodelay(true);
                let mut buf = [0u8; 65536];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    Ok(port)
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Kills the child (by its pid) when dropped.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Receiver throughput in Mbit/s from iperf3's text report (`-f m`).
fn iperf_mbps(out: &str) -> Option<f64> {
    let line = out.lines().rev().find(|l| l.contains("receiver"))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w.iter().position(|x| *x == "Mbits/sec")?;
    w.get(i.checked_sub(1)?)?.parse().ok()
}

/// (mean µs, p50 µs, p99 µs, round trips) from a canal-bench-gen RR RESULT line.
fn rr_result(out: &str) -> Option<(f64, f64, f64, u64)> {
    let line = out.lines().find(|l| l.starts_with("RESULT"))?;
    let get = |k: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((
        get("mean_ns")? / 1000.0,
        get("p50_ns")? / 1000.0,
        get("p99_ns")? / 1000.0,
        get("msgs")? as u64,
    ))
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

#[derive(Default)]
struct Samples {
    mbps: Vec<f64>,
    rr_mean: Vec<f64>,
    rr_p50: Vec<f64>,
    rr_p99: Vec<f64>,
    rr_msgs: Vec<f64>,
}

fn host_native(iperf: &Path, gen: &Path, iport: u16, eport: u16, d: u32, s: &mut Samples) {
    let out = Command::new(iperf)
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &iport.to_string(),
            "-t",
            &d.to_string(),
            "-f",
            "m",
        ])
        .stderr(Stdio::null())
        .output();
    if let Some(v) = out
        .ok()
        .and_then(|o| iperf_mbps(&String::from_utf8_lossy(&o.stdout)))
    {
        s.mbps.push(v);
    }
    let out = Command::new(gen)
        .args([
            "client",
            "--net",
            "tcp",
            "--addr",
            &format!("127.0.0.1:{eport}"),
        ])
        .args(["--mode", "rr", "--size", "64", "--duration", &d.to_string()])
        .stderr(Stdio::null())
        .output();
    if let Some((m, p50, p, n)) = out
        .ok()
        .and_then(|o| rr_result(&String::from_utf8_lossy(&o.stdout)))
    {
        s.rr_mean.push(m);
        s.rr_p50.push(p50);
        s.rr_p99.push(p);
        s.rr_msgs.push(n as f64);
    }
}

/// Runs B11; returns the exit status.
pub fn run_b11(args: &B11Args) -> i32 {
    match run(&args.opts()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("canal bench b11: {e}");
            1
        }
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn run(o: &Opts) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("/")).to_path_buf();
    let gen = dir.join("canal-bench-gen");
    if !gen.is_file() {
        return Err(anyhow::anyhow!(
            "{} not found (cargo build --release)",
            gen.display()
        ));
    }
    let iperf = which("iperf3").ok_or_else(|| anyhow::anyhow!("iperf3 not found"))?;
    let iport = free_port()?;
    let _iperf_srv = Child(
        Command::new(&iperf)
            .args(["-s", "-B", "127.0.0.1", "-p", &iport.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("iperf3 -s: {e}"))?,
    );
    let eport = echo_server()?;
    // The iperf3 server must listen before the first client.
    let t0 = std::time::Instant::now();
    while TcpStream::connect(("127.0.0.1", iport)).is_err() {
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(anyhow::anyhow!("iperf3 server did not start"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // One guest, both devices; the script's shell runs under libcanal, so a program
    // started with `env -u LD_PRELOAD` uses the guest kernel (virtio-net).
    let d = o.duration;
    let script = format!(
        r#"for rep in $(seq 1 {reps}); do
  for t in virtio canal; do
    if [ $t = virtio ]; then P="env -u LD_PRELOAD"; else P=""; fi
    echo "@@ $t iperf $rep"; $P {iperf} -c 10.0.2.2 -p {iport} -t {d} -f m 2>&1 | grep receiver
    echo "@@ $t rr $rep"; $P {gen} client --net tcp --addr 10.0.2.2:{eport} --mode rr --size 64 --duration {d} 2>&1
  done
done
echo "@@ end""#,
        reps = o.reps,
        iperf = iperf.display(),
        gen = gen.display(),
    );
    let mut cmd = Command::new(&exe);
    cmd.args(["vm", "run", "--canal", "--virtio", "-v", "--timeout"])
        .arg((60 + o.reps as u32 * d * 8).to_string());
    if let Some(a) = &o.accel {
        cmd.args(["--accel", a]);
    }
    if o.no_doorbell {
        cmd.arg("--no-doorbell");
    }
    cmd.args(["--", "sh", "-c", &script]);
    eprintln!(
        "canal bench b11: booting the guest ({} reps × {d} s × 4 runs)",
        o.reps
    );
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("canal vm run: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !stdout.contains("@@ end") {
        return Err(anyhow::anyhow!(
            "the guest run failed ({}):\n{stdout}\n{stderr}",
            out.status
        ));
    }
    let accel = stderr
        .lines()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("accel=")))
        .unwrap_or("?")
        .to_string();
    let (mut virtio, mut canal) = (Samples::default(), Samples::default());
    let mut sections = stdout.split("@@ ").skip(1);
    for sec in sections.by_ref() {
        let (head, body) = sec.split_once('\n').unwrap_or((sec, ""));
        let w: Vec<&str> = head.split_whitespace().collect();
        let s = match w.first() {
            Some(&"virtio") => &mut virtio,
            Some(&"canal") => &mut canal,
            _ => continue,
        };
        match w.get(1) {
            Some(&"iperf") => {
                if let Some(v) = iperf_mbps(body) {
                    s.mbps.push(v)
                }
            }
            Some(&"rr") => {
                if let Some((m, p50, p, n)) = rr_result(body) {
                    s.rr_mean.push(m);
                    s.rr_p50.push(p50);
                    s.rr_p99.push(p);
                    s.rr_msgs.push(n as f64);
                }
            }
            _ => {}
        }
    }
    let mut native = Samples::default();
    for _ in 0..o.reps {
        host_native(&iperf, &gen, iport, eport, d, &mut native);
    }
    let report = render(o, &accel, &mut native, &mut virtio, &mut canal);
    print!("{report}");
    if let Some(p) = &o.out {
        std::fs::write(p, &report).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    }
    if canal.mbps.len() < o.reps || virtio.mbps.len() < o.reps {
        return Err(anyhow::anyhow!(
            "some guest runs produced no result (see the table)"
        ));
    }
    Ok(())
}

fn render(o: &Opts, accel: &str, n: &mut Samples, v: &mut Samples, c: &mut Samples) -> String {
    let f = |x: Option<f64>, p: usize| x.map_or("–".to_string(), |x| format!("{x:.p$}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".into(),
    };
    let (nm, vm, cm) = (
        median(&mut n.mbps),
        median(&mut v.mbps),
        median(&mut c.mbps),
    );
    let (nl, vl, cl) = (
        median(&mut n.rr_mean),
        median(&mut v.rr_mean),
        median(&mut c.rr_mean),
    );
    let (n5, v5, c5) = (
        median(&mut n.rr_p50),
        median(&mut v.rr_p50),
        median(&mut c.rr_p50),
    );
    let (np, vp, cp) = (
        median(&mut n.rr_p99),
        median(&mut v.rr_p99),
        median(&mut c.rr_p99),
    );
    let mut s = String::new();
    s.push_str(&format!(
        "B11: the same QEMU guest over virtio-net and over canal (accelerator: {accel}; \
         median of {} reps × {} s; iperf3 receiver Mbit/s; TCP RR 64 B round trip µs)\n\n",
        o.reps, o.duration
    ));
    s.push_str("| test | host native | guest virtio-net | guest canal | canal / virtio-net |\n");
    s.push_str("| --- | --- | --- | --- | --- |\n");
    s.push_str(&format!(
        "| iperf3 -c, Mbit/s | {} | {} | {} | {} |\n",
        f(nm, 0),
        f(vm, 0),
        f(cm, 0),
        ratio(cm, vm)
    ));
    s.push_str(&format!(
        "| RR 64 B mean, µs | {} | {} | {} | {} |\n",
        f(nl, 1),
        f(vl, 1),
        f(cl, 1),
        ratio(cl, vl)
    ));
    s.push_str(&format!(
        "| RR 64 B p50, µs | {} | {} | {} | {} |\n",
        f(n5, 1),
        f(v5, 1),
        f(c5, 1),
        ratio(c5, v5)
    ));
    s.push_str(&format!(
        "| RR 64 B p99, µs | {} | {} | {} | {} |\n",
        f(np, 1),
        f(vp, 1),
        f(cp, 1),
        ratio(cp, vp)
    ));
    s.push_str(&format!(
        "\nSamples: iperf3 virtio {:?} canal {:?} native {:?}; RR mean virtio {:?} canal {:?} native {:?}\n",
        v.mbps, c.mbps, n.mbps, v.rr_mean, c.rr_mean, n.rr_mean
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_outputs() {
        let ip = "[  5]   0.00-2.00   sec   161 MBytes   675 Mbits/sec                  receiver\n";
        assert_eq!(iperf_mbps(ip), Some(675.0));
        assert_eq!(iperf_mbps("nothing"), None);
        let rr = "RESULT role=client mode=rr size=64 msgs=100 bytes=12800 elapsed_s=1.0 \
                  p50_ns=9000 p99_ns=20000 mean_ns=10000 min_ns=1 max_ns=2 cpu_s=0.1";
        assert_eq!(rr_result(rr), Some((10.0, 9.0, 20.0, 100)));
    }

    #[test]
    fn parses_args() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: B11Args,
        }
        let p = |v: &[&str]| Cli::try_parse_from(std::iter::once("b11").chain(v.iter().copied()));
        assert!(p(&["--reps", "0"]).is_err());
        assert!(p(&["--accel", "hvf"]).is_err());
        let o = p(&["--quick", "--reps=5"]).unwrap().args.opts();
        assert_eq!((o.reps, o.duration), (1, 1), "--quick wins");
        let o = p(&["--reps", "2", "--duration", "4"]).unwrap().args.opts();
        assert_eq!((o.reps, o.duration), (2, 4));
    }
}
