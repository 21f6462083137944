//! The whole report: verdicts against the targets, the headline, the README snippet.
use crate::report::csv::CellAgg;
use crate::report::csv::RunInfo;
use crate::report::format::fmt_num;
use crate::report::format::fmt_size;
use crate::report::sections::experiment_section;

use crate::model::{Experiment, System, Workload};
use crate::runner::Status;
use std::fmt::Write as _;

/// One line per target the harness can judge mechanically from this run.
pub(crate) fn verdicts(aggs: &[CellAgg]) -> Vec<String> {
    use System::*;
    use Workload::*;
    let med_of = |sys: System, w: Workload, size: usize, m: &str, v: &str| -> Result<f64, String> {
        let a = aggs
            .iter()
            .find(|a| {
                a.cell.system == sys
                    && a.cell.workload == w
                    && a.cell.size == size
                    && a.cell.pairs == 1
                    && a.cell.variant == v
            })
            .ok_or_else(|| "not run".to_string())?;
        match a.summary(m) {
            Some(s) => Ok(s.median),
            None => Err(format!("{}: {}", a.status().word(), a.status().reason())),
        }
    };
    let med = |sys: System, w: Workload, size: usize, m: &str| med_of(sys, w, size, m, "default");
    let short = |e: String| -> String {
        let e: String = e.chars().take(90).collect();
        format!("not measured ({e})")
    };
    let mut out = Vec::new();
    let mut judge = |name: &str, r: Result<(bool, String), String>| {
        out.push(match r {
            Ok((ok, detail)) => format!(
                "| {name} | {} | {detail} |",
                if ok { "met" } else { "**not met**" }
            ),
            Err(e) => format!("| {name} | {} | |", short(e)),
        });
    };
    judge(
        "B1 canal g↔g RR p50 at 64 B ≤ 1 µs and ≤ kernel TCP / 50",
        (|| {
            let g = med(CanalGG, Rr, 64, "rtt_p50_us")?;
            let t = med(Tcp, Rr, 64, "rtt_p50_us")?;
            Ok((
                g <= 1.0 && g <= t / 50.0,
                format!(
                    "{} µs vs kernel TCP {} µs ({}×)",
                    fmt_num(g),
                    fmt_num(t),
                    fmt_num(g / t)
                ),
            ))
        })(),
    );
    for (size, want) in [(16384usize, 7.0), (65536, 12.0)] {
        judge(
            &format!(
                "B2 canal g↔g stream ≥ {want}× kernel TCP at {}",
                fmt_size(size)
            ),
            (|| {
                let g = med(CanalGG, Stream, size, "gbit_s")?;
                let t = med(Tcp, Stream, size, "gbit_s")?;
                Ok((
                    g >= want * t,
                    format!(
                        "{}× ({} vs {} Gbit/s)",
                        fmt_num(g / t),
                        fmt_num(g),
                        fmt_num(t)
                    ),
                ))
            })(),
        );
    }
    judge(
        "B2 canal g↔g ≥ 2× UDS at every measured size",
        (|| {
            let mut worst: Option<(f64, usize)> = None;
            for a in aggs
                .iter()
                .filter(|a| a.cell.workload == Stream && a.cell.system == Uds && a.cell.pairs == 1)
            {
                let u = med(Uds, Stream, a.cell.size, "gbit_s")?;
                let g = med(CanalGG, Stream, a.cell.size, "gbit_s")?;
                if worst.map_or(true, |(w, _)| g / u < w) {
                    worst = Some((g / u, a.cell.size));
                }
            }
            let (w, size) = worst.ok_or("no UDS stream cells")?;
            Ok((
                w >= 2.0,
                format!("lowest {}× at {}", fmt_num(w), fmt_size(size)),
            ))
        })(),
    );
    judge(
        "B3 guest→native stream ≥ 0.96× native (64 KiB)",
        (|| {
            let g = med(CanalGN, Stream, 65536, "gbit_s")?;
            let t = med(Tcp, Stream, 65536, "gbit_s")?;
            Ok((g >= 0.96 * t, format!("{}×", fmt_num(g / t))))
        })(),
    );
    judge(
        "B3 guest→native RR p50 ≤ 1.04× native (64 B)",
        (|| {
            let g = med(CanalGN, Rr, 64, "rtt_p50_us")?;
            let t = med(Tcp, Rr, 64, "rtt_p50_us")?;
            Ok((g <= 1.04 * t, format!("{}×", fmt_num(g / t))))
        })(),
    );
    judge(
        "B7 canal g↔g: 0 system calls per round trip (64 B)",
        (|| {
            let g = med(CanalGG, SysRr, 64, "syscalls_per_msg")?;
            Ok((g < 0.05, format!("{} per round trip", fmt_num(g))))
        })(),
    );
    judge(
        "B7 … while the other side polls (all in notify=poll), g↔g and g→n",
        (|| {
            let g = med_of(CanalGG, SysRr, 64, "syscalls_per_msg", "notify=poll")?;
            let n = med_of(CanalGN, SysRr, 64, "syscalls_per_msg", "notify=poll")?;
            Ok((
                g < 0.05 && n < 0.05,
                format!("g↔g {}, g→n {} per round trip", fmt_num(g), fmt_num(n)),
            ))
        })(),
    );
    for (name, r) in b10_verdicts(&med) {
        judge(&name, r);
    }
    out
}

/// A cell's median of a metric (system, workload, size, metric), or why there is none.
type Median<'a> = &'a dyn Fn(System, Workload, usize, &str) -> Result<f64, String>;

/// A target's line: its name, and whether it was met with what was measured.
type Verdict = (String, Result<(bool, String), String>);

/// B10's application targets: each placement's median against the kernel's.
fn b10_verdicts(med: Median) -> Vec<Verdict> {
    use System::*;
    use Workload::*;
    let mut out = Vec::new();
    // (label, workload, metric, and per placement: system, least ratio, name).
    type Need = (System, f64, &'static str);
    let b10: [(&str, Workload, &str, [Need; 2]); 4] = [
        (
            "redis GET",
            Redis,
            "get_rps",
            [(CanalGG, 1.5, "g↔g"), (CanalGN, 0.95, "g→n")],
        ),
        (
            "redis SET",
            Redis,
            "set_rps",
            [(CanalGG, 1.5, "g↔g"), (CanalGN, 0.95, "g→n")],
        ),
        (
            "PostgreSQL select-only",
            Postgres,
            "select_tps",
            [(CanalGG, 1.2, "both ends"), (CanalNG, 0.95, "server only")],
        ),
        (
            "PostgreSQL TPC-B-like",
            Postgres,
            "tpcb_tps",
            [(CanalGG, 1.2, "both ends"), (CanalNG, 0.95, "server only")],
        ),
    ];
    for (label, w, m, needs) in b10 {
        let target: Vec<String> = needs
            .iter()
            .map(|(_, r, name)| format!("{name} ≥ {r}× native"))
            .collect();
        out.push((
            format!("B10 {label}: {}", target.join(", ")),
            (|| {
                let t = med(Tcp, w, 0, m)?;
                let mut ok = true;
                let mut said = Vec::new();
                for (sys, least, name) in needs {
                    let v = med(sys, w, 0, m)?;
                    ok &= v >= least * t;
                    said.push(format!("{name} {}×", fmt_num(v / t)));
                }
                Ok((ok, said.join(", ")))
            })(),
        ));
    }
    out
}

pub(crate) fn markdown(
    info: &RunInfo,
    exps: &[Experiment],
    aggs: &[CellAgg],
    plots: &[String],
) -> String {
    let mut s = String::from("# canal bench results\n\n");
    let _ = writeln!(s, "- Command: `{}`", info.command);
    for (k, v) in &info.machine_long {
        let _ = writeln!(s, "- {k}: {v}");
    }
    let _ = writeln!(
        s,
        "- Mode: {}, {} repetition(s) per cell, systems interleaved (A B C D A B C D …)",
        info.mode, info.reps
    );
    let _ = writeln!(s, "- Placement: {}", info.placement_note);
    s.push_str(
        "- Systems: **kernel TCP** = two native programs over 127.0.0.1; **UDS** = two native programs over a Unix \
         socket; **canal guest↔guest** = both ends under `canal run`; **canal guest→native** = client under \
         `canal run`, native server.\n\
         - Cells show the median over repetitions and [min–max]; ratios divide medians from this same run. \
         RTT = one request-response round trip. Bracketed numbers after *failed* / *not available* point to the notes.\n\n",
    );
    let mut notes = Vec::new();
    let mut glance_notes = Vec::new();
    let glance = headline(aggs, &mut glance_notes);
    if !glance.is_empty() {
        s.push_str(
            "## At a glance\n\nMedians of this run; the last two columns say by what factor canal is \
             better or worse than kernel TCP on that metric (lower latency, CPU and syscalls are \
             better; higher rates are better).\n\n",
        );
        s.push_str(&glance);
        s.push('\n');
        for n in &glance_notes {
            let _ = writeln!(s, "{n}");
        }
        s.push('\n');
    }
    let v = verdicts(aggs);
    if !v.is_empty() {
        s.push_str("## Targets (docs/bench/README.md)\n\n| target | verdict | this run |\n| --- | --- | --- |\n");
        for l in v {
            s.push_str(&l);
            s.push('\n');
        }
        s.push('\n');
    }
    s.push_str("## Experiments\n\n");
    for e in exps {
        s += &experiment_section(e, aggs, &mut notes);
    }
    if !plots.is_empty() {
        s.push_str("## Plots\n\n");
        for p in plots {
            let _ = writeln!(s, "![{p}](plots/{p})\n");
        }
    }
    if !notes.is_empty() {
        s.push_str("## Notes (why a cell has no number)\n\n");
        for (i, n) in notes.iter().enumerate() {
            let _ = writeln!(s, "{}. {}", i + 1, n.replace('|', "\\|").replace('\n', " "));
        }
    }
    s
}

/// The at-a-glance table: one row per headline metric, the four systems, and canal's
/// standing against kernel TCP as a factor where > 1 always means canal is better.
pub(crate) fn headline(aggs: &[CellAgg], notes_out: &mut Vec<String>) -> String {
    use System::*;
    use Workload::*;
    let items: [(&str, Workload, usize, &str, bool); 12] = [
        ("RR round trip p50, 64 B (µs)", Rr, 64, "rtt_p50_us", false),
        ("RR round trip p99, 64 B (µs)", Rr, 64, "rtt_p99_us", false),
        (
            "RR round trip p50, 16 KiB (µs)",
            Rr,
            16384,
            "rtt_p50_us",
            false,
        ),
        ("stream 64 B (Gbit/s)", Stream, 64, "gbit_s", true),
        ("stream 1 KiB (Gbit/s)", Stream, 1024, "gbit_s", true),
        ("stream 16 KiB (Gbit/s)", Stream, 16384, "gbit_s", true),
        ("stream 64 KiB (Gbit/s)", Stream, 65536, "gbit_s", true),
        (
            "CPU per byte, stream 64 KiB (ns/B)",
            Stream,
            65536,
            "cpu_ns_per_byte",
            false,
        ),
        (
            "client syscalls per RR round trip",
            SysRr,
            64,
            "syscalls_per_msg",
            false,
        ),
        ("redis GET (req/s)", Redis, 0, "get_rps", true),
        ("nginx + wrk (req/s)", Nginx, 0, "req_s", true),
        (
            "memcached + memaslap (ops/s)",
            Memcached,
            0,
            "ops_rps",
            true,
        ),
    ];
    let find = |s: System, w: Workload, size: usize| {
        aggs.iter().find(|a| {
            a.cell.system == s
                && a.cell.workload == w
                && a.cell.size == size
                && a.cell.pairs == 1
                && a.cell.variant == "default"
        })
    };
    let systems = [Tcp, Uds, CanalGG, CanalGN];
    let mut s = String::from(
        "| metric | kernel TCP | UDS | canal guest↔guest | canal guest→native | canal g↔g vs kernel TCP | canal g→n vs kernel TCP |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let mut slower: Vec<String> = Vec::new();
    let mut rows = 0;
    for (label, w, size, metric, higher) in items {
        if find(Tcp, w, size).is_none() {
            continue;
        }
        rows += 1;
        let med = |sys: System| {
            find(sys, w, size)
                .and_then(|a| a.summary(metric))
                .map(|x| x.median)
        };
        let _ = write!(s, "| {label} |");
        for sys in systems {
            let v = match find(sys, w, size) {
                None => "".to_string(),
                Some(a) => match a.summary(metric) {
                    Some(x) => fmt_num(x.median),
                    None => a.status().word().to_string(),
                },
            };
            let _ = write!(s, " {v} |");
        }
        for sys in [CanalGG, CanalGN] {
            let f = match (med(sys), med(Tcp)) {
                (Some(c), Some(t)) if c > 0.0 && t > 0.0 => {
                    let f = if higher { c / t } else { t / c };
                    if f < 1.0 {
                        slower.push(format!(
                            "{}: {label} {} vs kernel TCP {} ({}× worse)",
                            sys.label(),
                            fmt_num(c),
                            fmt_num(t),
                            fmt_num(1.0 / f)
                        ));
                    }
                    if f >= 1.0 {
                        format!("{}× better", fmt_num(f))
                    } else {
                        format!("{}× **worse**", fmt_num(1.0 / f))
                    }
                }
                (Some(0.0), Some(t)) if !higher && t > 0.0 => "none (kernel: some)".into(),
                _ => "–".into(),
            };
            let _ = write!(s, " {f} |");
        }
        s.push('\n');
    }
    if rows == 0 {
        return String::new();
    }
    for sys in [CanalGG, CanalGN] {
        let cells: Vec<&CellAgg> = aggs
            .iter()
            .filter(|a| a.cell.system == sys && a.cell.variant == "default")
            .collect();
        if !cells.is_empty() && cells.iter().all(|a| a.status() != Status::Ok) {
            notes_out.push(format!(
                "- {}: no numbers in this run — {}",
                sys.label(),
                cells[0].status().reason()
            ));
        }
    }
    if !slower.is_empty() {
        notes_out.push("- Where canal is worse than the kernel in this run:".to_string());
        notes_out.extend(slower.into_iter().map(|l| format!("  - {l}")));
    }
    s
}

/// A section for the top-level README: the at-a-glance table, where canal is slower, and
/// two plots, with links relative to the repository root (`out` as given on the command line).
pub(crate) fn readme_snippet(
    info: &RunInfo,
    aggs: &[CellAgg],
    out: &str,
    plots: &[String],
) -> String {
    let get = |k: &str| {
        info.machine_long
            .iter()
            .find(|(a, _)| a == k)
            .map(|x| x.1.clone())
            .unwrap_or_default()
    };
    let mut notes = Vec::new();
    let glance = headline(aggs, &mut notes);
    let mut s = format!(
        "Measured with `{}` on {} ({}; {}; commit {}), {} mode, {} repetitions, medians; \
         every ratio compares medians from that same run. Full report: [{out}/results.md]({out}/results.md).\n\n",
        info.command,
        get("Machine"),
        get("Kernel"),
        get("Date"),
        get("Commit"),
        info.mode,
        info.reps
    );
    s.push_str(&glance);
    s.push('\n');
    for n in notes {
        let _ = writeln!(s, "{n}");
    }
    s.push('\n');
    for p in ["throughput_vs_size.png", "latency_vs_size.png"] {
        if plots.iter().any(|x| x == p) {
            let _ = writeln!(s, "![{p}]({out}/plots/{p})\n");
        }
    }
    s
}
