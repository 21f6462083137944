//! Benchmark harness: `canal bench` runs the experiments of
//! docs/bench/README.md side by side with their baselines, interleaved and repeated, and
//! writes CSV, Markdown and PNG plots. The traffic generator it drives is
//! `canal-bench-gen` (src/bin), run natively and under `canal run`.
//!
//! Errors: the run itself fails with `anyhow` errors at the edge (`run`); a cell that
//! fails is data, not an error — its reason is a `String` recorded in results.csv and
//! the report (`runner::Outcome`), so the helpers that produce reasons return
//! `Result<_, String>`.

pub mod cli;
pub(crate) mod conngen;
pub mod gen;
pub mod isolation;
mod isolation_report;
pub(crate) mod json;
pub(crate) mod model;
pub(crate) mod procs;
pub(crate) mod report;
pub(crate) mod rrloop;
pub(crate) mod runner;
pub(crate) mod stats;
pub(crate) mod status;
mod tools;
pub(crate) mod udpgen;

use cli::Opts;
use model::{Cell, Experiment, System, Variant};
use report::{Row, RunInfo};
use runner::{Knobs, Runner, Status};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PLOT_SCRIPT: &str = include_str!("../../../scripts/bench-plot.py");

fn cmd_output(argv: &[&str]) -> Option<String> {
    let out = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn cpuinfo(key: &str) -> Option<String> {
    let t = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    t.lines()
        .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

struct Machine {
    short: String,
    long: Vec<(String, String)>,
    mhz: Option<f64>,
}

fn machine() -> Machine {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = cpuinfo("model name").unwrap_or_else(|| "unknown CPU".into());
    let mhz = cpuinfo("cpu MHz").and_then(|m| m.parse::<f64>().ok());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mem = procs::kib_field("/proc/meminfo", "MemTotal:")
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1048576.0))
        .unwrap_or_default();
    let date = cmd_output(&["date", "-u", "+%Y-%m-%d %H:%M:%S UTC"]).unwrap_or_default();
    let git = cmd_output(&["git", "rev-parse", "--short", "HEAD"]).map(|h| {
        let dirty = cmd_output(&["git", "status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|s| !s.is_empty());
        if dirty {
            format!("{h} (work tree has uncommitted changes)")
        } else {
            h
        }
    });
    let perf = if cmd_output(&["perf", "stat", "-x,", "-e", "cycles", "true"])
        .is_some_and(|_| perf_cycles_work())
    {
        "perf cycles counter available"
    } else {
        "no hardware cycle counter (perf stat -e cycles: not supported); costs are CPU time"
    };
    let short = format!("{cores} cores, {model}, Linux {kernel}");
    Machine {
        short,
        long: vec![
            ("Date".into(), date),
            (
                "Machine".into(),
                format!(
                    "{cores} logical CPUs ({model}, {} MHz), {mem} RAM",
                    mhz.map(|m| format!("{m:.0}")).unwrap_or("?".into())
                ),
            ),
            ("Kernel".into(), format!("Linux {kernel}")),
            (
                "Commit".into(),
                git.unwrap_or_else(|| "not a git checkout".into()),
            ),
            ("Counters".into(), perf.into()),
        ],
        mhz,
    }
}

fn perf_cycles_work() -> bool {
    let out = std::process::Command::new("perf")
        .args(["stat", "-x,", "-e", "cycles", "true"])
        .output();
    out.is_ok_and(|o| !String::from_utf8_lossy(&o.stderr).contains("not supported"))
}

fn find_gen() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("CANAL_BENCH_GEN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let p = exe.with_file_name("canal-bench-gen");
    if p.is_file() {
        Ok(p)
    } else {
        Err(anyhow::anyhow!(
            "{} not found: build it with `cargo build --release -p canal-bench -p canal-cli`",
            p.display()
        ))
    }
}

fn find_canal() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("CANAL_BIN") {
        return Ok(PathBuf::from(p));
    }
    Ok(std::env::current_exe()?)
}

/// How to reproduce one cell with `canal bench`.
fn repro(exe: &str, exps: &str, cell: &Cell, o: &Opts, reps: usize) -> String {
    let mut s = format!(
        "{exe} bench {} {exps} --systems {} --variants {} --reps {reps}",
        if o.quick { "--quick" } else { "--full" },
        cell.system.id(),
        procs::shell_quote(&cell.variant)
    );
    if cell.size > 0 {
        s += &format!(" --sizes {}", cell.size);
    }
    if o.plan.pairs.is_some() || cell.pairs > 1 {
        s += &format!(" --pairs {}", cell.pairs);
    }
    if let Some(d) = o.duration {
        s += &format!(" --duration {d}");
    }
    if o.pinned() {
        s += " --pin";
    } else if !o.quick {
        s += " --no-pin";
    }
    s
}

fn display_exe() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let cwd = std::env::current_dir().unwrap_or_default();
    match exe.strip_prefix(&cwd) {
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => exe.to_string_lossy().into_owned(),
    }
}

/// Runs `canal bench` with these arguments; returns the exit status.
pub fn run(args: &cli::BenchArgs) -> i32 {
    let o = match args.opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("canal bench: {e}");
            return 2;
        }
    };
    let exps: Vec<Experiment> = o
        .exps
        .iter()
        .filter_map(|id| model::experiment(id, &o.plan))
        .collect();
    if o.list {
        for e in &exps {
            println!(
                "{:4} {} — {} ({} cells)",
                e.id,
                e.title,
                e.measures,
                e.cells.len()
            );
        }
        return 0;
    }
    match run_all(&o, &exps) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("canal bench: {e}");
            1
        }
    }
}

fn run_all(o: &Opts, exps: &[Experiment]) -> anyhow::Result<i32> {
    let started = Instant::now();
    let gen = find_gen()?;
    let canal = find_canal()?;
    let m = machine();
    let mode = if o.quick { "quick" } else { "full" };
    let reps = o.reps.unwrap_or(if o.quick { 2 } else { 3 });
    let out = o.out.clone().unwrap_or_else(|| {
        let ts = cmd_output(&["date", "-u", "+%Y%m%d-%H%M%S"]).unwrap_or_else(|| "now".into());
        PathBuf::from(format!("bench-out/{mode}-{ts}"))
    });
    std::fs::create_dir_all(&out).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
    // Short paths: Unix socket addresses are limited to 108 bytes.
    let tmp = std::env::temp_dir().join(format!("canal-bench-{}", std::process::id()));
    // Private (0700): canald and the guests refuse a control directory others can use.
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&tmp)
        .map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?;
    let knobs = Knobs {
        duration: o.duration.unwrap_or(if o.quick { 0.25 } else { 1.0 }),
        idle_secs: if o.quick { 0.5 } else { 3.0 },
        tool_secs: if o.quick { 1.0 } else { 4.0 },
        redis_requests: if o.quick { 5000 } else { 100_000 },
        strace_counts: if o.quick { (100, 600) } else { (500, 5000) },
        strace_secs: if o.quick { 3.0 } else { 20.0 },
        canal_grace: o.canal_grace.unwrap_or(if o.quick { 4.0 } else { 20.0 }),
        pin: o.pinned(),
        cpu_mhz: m.mhz,
    };
    let exe = display_exe();
    let info = run_info(o, m.short.clone(), m.long, &exe, reps, mode);

    let cells = union_cells(exps);
    let total = cells.len() * reps;
    eprintln!(
        "canal bench: {mode} mode, {} experiment(s), {} cell(s) × {reps} rep(s) → {}",
        exps.len(),
        cells.len(),
        out.display()
    );
    let mut runner = Runner::new(canal, gen, tmp.clone(), knobs);
    let mut rows: Vec<Row> = Vec::new();
    // Consecutive failures per (system, variant): a broken canal must not stall the run.
    let mut streak: HashMap<(System, String), (u32, String)> = HashMap::new();
    let mut daemon_failed: Option<Status> = None;
    // The quick mode must finish in under 2 minutes whatever canal does: past this many
    // seconds its remaining canal cells are skipped (native cells are fast and still run).
    let budget: Option<f64> = o.quick.then_some(90.0);
    let mut done = 0;
    for rep in 1..=reps {
        for (cell, ids) in &cells {
            done += 1;
            let exps_s = ids.join(" ");
            let key = (cell.system, cell.variant.clone());
            let over_budget = budget.is_some_and(|b| started.elapsed().as_secs_f64() > b);
            let outcome = match (streak.get(&key), &daemon_failed) {
                _ if over_budget && cell.system.uses_canal() => runner::Outcome::not_run(Status::Skipped(format!(
                    "the quick mode's {:.0} s budget for canal cells was spent (canal runs were slow or timed out)",
                    budget.unwrap_or(0.0)
                ))),
                (Some((n, why)), _) if *n >= 3 => runner::Outcome::not_run(Status::Skipped(format!(
                    "{} failed {n} times in a row in this run; last: {why}",
                    cell.system.id()
                ))),
                (_, Some(st)) if cell.system.uses_canal() && cell.variant != "default" => {
                    runner::Outcome::not_run(st.clone())
                }
                _ => runner.run(cell),
            };
            if cell.system.uses_canal() && cell.variant == "default" {
                if let Some(p) = runner.daemon.as_ref().and_then(|d| d.problem.clone()) {
                    daemon_failed = Some(match p {
                        Status::Failed(r) => {
                            Status::Failed(format!("canald for the default variant failed: {r}"))
                        }
                        other => other,
                    });
                }
            }
            // A canald that did not start fails every cell of its variant the same way,
            // at no cost; only failures of runs count towards giving up on a system.
            let daemon_problem = cell.system.uses_canal()
                && runner.daemon.as_ref().is_some_and(|d| d.problem.is_some());
            match &outcome.status {
                _ if daemon_problem => {}
                Status::Ok => {
                    streak.remove(&key);
                }
                Status::Failed(r) => {
                    let e = streak.entry(key).or_insert((0, String::new()));
                    e.0 += 1;
                    e.1 = r.clone();
                }
                _ => {}
            }
            eprintln!(
                "[{done}/{total} {:.0}s] rep {rep} {exps_s}: {cell}: {}",
                started.elapsed().as_secs_f64(),
                if outcome.status == Status::Ok {
                    headline_metrics(&outcome)
                } else {
                    format!("{} — {}", outcome.status.word(), outcome.status.reason())
                }
            );
            rows.push(Row {
                cell: cell.clone(),
                exps: exps_s.clone(),
                rep,
                repro: repro(&exe, &exps_s, cell, o, reps),
                outcome,
            });
        }
    }
    runner.stop_daemon();
    let _ = std::fs::remove_dir_all(&tmp);

    write_outputs(o, &out, &info, exps, &rows, started)
}

/// The report's header: machine, command line, placement, repetitions.
fn run_info(
    o: &Opts,
    machine: String,
    machine_long: Vec<(String, String)>,
    exe: &str,
    reps: usize,
    mode: &str,
) -> RunInfo {
    let command = format!(
        "{exe} bench {}",
        std::env::args()
            .skip_while(|a| a != "bench")
            .skip(1)
            .map(|a| procs::shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    RunInfo {
        machine,
        machine_long,
        command: command.trim().to_string(),
        placement_note: if o.pinned() {
            "every built-in generator run (B1, B2 and all other generator cells) pins its \
             server(s) to CPU 0 and client(s) to CPU 1, for every system alike (kernel TCP, \
             UDS, canal); canald and the tools (iperf3, sockperf, redis, nginx/wrk) are \
             unpinned"
                .into()
        } else {
            "no pinning (the scheduler places every process)".into()
        },
        reps,
        mode: mode.into(),
    }
}

/// The union of the experiments' cells (a cell shared by two experiments runs once),
/// each with the experiments that use it.
fn union_cells(exps: &[Experiment]) -> Vec<(Cell, Vec<&str>)> {
    // Union of cells; a cell shared by two experiments runs once.
    let mut cells: Vec<(Cell, Vec<&str>)> = Vec::new();
    for e in exps {
        for c in &e.cells {
            match cells.iter_mut().find(|(x, _)| x == c) {
                Some((_, ids)) => ids.push(e.id),
                None => cells.push((c.clone(), vec![e.id])),
            }
        }
    }
    // Interleave: within a repetition, the systems of one point run back to back;
    // default-variant cells first so canald restarts happen once per variant.
    cells.sort_by_key(|(c, _)| {
        (
            c.variant != "default",
            Variant::parse(&c.variant)
                .map(|v| v.name)
                .unwrap_or_default(),
        )
    });
    cells
}

/// The metrics worth a glance in the progress line.
fn headline_metrics(outcome: &runner::Outcome) -> String {
    outcome
        .metrics
        .iter()
        .filter(|(k, _)| {
            [
                "rtt_p50_us",
                "gbit_s",
                "syscalls_per_msg",
                "get_rps",
                "req_s",
                "ops_rps",
                "select_tps",
                "daemon_cpu_pct",
                "guests_cpu_pct",
            ]
            .contains(&k.as_str())
        })
        .map(|(k, v)| format!("{k}={}", report::fmt_num(*v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes results.csv, summary.csv, machine.txt, the plots, results.md and the README
/// snippet; 1 when a native baseline failed (a harness problem), else 0.
fn write_outputs(
    o: &Opts,
    out: &Path,
    info: &RunInfo,
    exps: &[Experiment],
    rows: &[Row],
    started: Instant,
) -> anyhow::Result<i32> {
    let aggs = report::aggregate(rows);
    write(
        &out.join("results.csv"),
        &report::write_results_csv(rows, info),
    )?;
    write(&out.join("summary.csv"), &report::write_summary_csv(&aggs))?;
    let mut machine_txt = format!(
        "command: {}\nmachine: {}\nplacement: {}\n",
        info.command, info.machine, info.placement_note
    );
    for (k, v) in &info.machine_long {
        machine_txt += &format!("{}: {v}\n", k.to_lowercase());
    }
    write(&out.join("machine.txt"), &machine_txt)?;
    let plots = if o.plots {
        match plot(out) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("canal bench: plots: {e}");
                vec![]
            }
        }
    } else {
        vec![]
    };
    let md = report::markdown(info, exps, &aggs, &plots);
    write(&out.join("results.md"), &md)?;
    let out_s = out.to_string_lossy();
    write(
        &out.join("readme-snippet.md"),
        &report::readme_snippet(info, &aggs, out_s.trim_end_matches('/'), &plots),
    )?;
    let native_bad: Vec<String> = aggs
        .iter()
        .filter(|a| !a.cell.system.uses_canal() && matches!(a.status(), Status::Failed(_)))
        .map(|a| format!("{}: {}", a.cell, a.status().reason()))
        .collect();
    eprintln!(
        "canal bench: done in {:.0}s; {}/results.md, results.csv, summary.csv, {} plot(s)",
        started.elapsed().as_secs_f64(),
        out.display(),
        plots.len()
    );
    for v in report::verdicts(&aggs) {
        eprintln!("  {v}");
    }
    if !native_bad.is_empty() {
        eprintln!("canal bench: native baselines failed (harness problem):");
        for b in &native_bad {
            eprintln!("  {b}");
        }
        return Ok(1);
    }
    Ok(0)
}

fn write(p: &Path, s: &str) -> anyhow::Result<()> {
    std::fs::write(p, s).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

/// Runs the plotting script (written next to the results so the plots can be redrawn).
fn plot(out: &Path) -> Result<Vec<String>, String> {
    let script = out.join("bench-plot.py");
    write(&script, PLOT_SCRIPT).map_err(|e| e.to_string())?;
    let py = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| runner::which(p).is_some() || Path::new(p).is_file())
        .ok_or("no python3")?;
    let argv = vec![
        py.to_string(),
        script.to_string_lossy().into_owned(),
        out.to_string_lossy().into_owned(),
    ];
    let p = procs::run_to_end(&argv.join(" "), &argv, Duration::from_secs(120))?;
    Ok(p.stdout()
        .lines()
        .filter_map(|l| l.strip_prefix("WROTE ").map(|s| s.trim().to_string()))
        .collect())
}
