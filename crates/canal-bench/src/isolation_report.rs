//! B14's report: one table per topology (tests × systems, median and range), the
//! targets of docs/bench/targets.md as ratios measured in the same run, and a plot.
use crate::stats::Summary;
use std::fmt::Write as _;
use std::path::Path;

/// One (topology, test, system) cell, as the report needs it.
pub(crate) struct Cell {
    pub(crate) topo: &'static str,
    pub(crate) topo_id: &'static str,
    pub(crate) test: &'static str,
    pub(crate) test_id: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) higher_is_better: bool,
    pub(crate) sys: &'static str,
    pub(crate) sys_id: &'static str,
    pub(crate) summary: Option<Summary>,
    /// Why there is no number (not available, or every run failed).
    pub(crate) why: Option<String>,
}

fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn cell_text(c: &Cell) -> String {
    match (&c.summary, &c.why) {
        (Some(s), _) => format!("{} ({}–{})", num(s.median), num(s.min), num(s.max)),
        (None, Some(w)) => format!(
            "n/a: {}",
            w.lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(60)
                .collect::<String>()
        ),
        (None, None) => "n/a".into(),
    }
}

fn median_of(cells: &[Cell], topo: &str, test: &str, sys: &str) -> Option<f64> {
    cells
        .iter()
        .find(|c| c.topo_id == topo && c.test_id == test && c.sys_id == sys)?
        .summary
        .map(|s| s.median)
}

/// How many times better canal is than `other` (>1: canal better), by medians.
fn advantage(cells: &[Cell], topo: &str, test: &str, other: &str) -> Option<f64> {
    let c = cells
        .iter()
        .find(|c| c.topo_id == topo && c.test_id == test)?;
    let canal = median_of(cells, topo, test, "canal-isolate")?;
    let o = median_of(cells, topo, test, other)?;
    Some(if c.higher_is_better {
        canal / o
    } else {
        o / canal
    })
}

/// The better pasta path of the two (its best is what canal is held to).
fn best_pasta(cells: &[Cell], topo: &str, test: &str) -> Option<(f64, &'static str)> {
    ["pasta-splice", "pasta-tap"]
        .into_iter()
        .filter_map(|p| advantage(cells, topo, test, p).map(|a| (a, p)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

pub(crate) fn markdown(cells: &[Cell], reps: usize, duration: u32) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# B14: isolated guests — canal --isolate, pasta, slirp4netns\n\n\
         Medians of {reps} run(s) of {duration} s each, interleaved (every cell once per \
         round), with the range in parentheses. Higher is better except for the p50."
    );
    let mut topos: Vec<(&str, &str)> = Vec::new();
    for c in cells {
        if !topos.iter().any(|t| t.0 == c.topo_id) {
            topos.push((c.topo_id, c.topo));
        }
    }
    for (tid, tlabel) in &topos {
        let sys: Vec<(&str, &str)> =
            cells
                .iter()
                .filter(|c| c.topo_id == *tid)
                .fold(Vec::new(), |mut v, c| {
                    if !v.iter().any(|s: &(&str, &str)| s.0 == c.sys_id) {
                        v.push((c.sys_id, c.sys));
                    }
                    v
                });
        let _ = writeln!(o, "\n## {tlabel}\n");
        let _ = writeln!(
            o,
            "| test | unit | {} |",
            sys.iter().map(|s| s.1).collect::<Vec<_>>().join(" | ")
        );
        let _ = writeln!(o, "| --- | --- |{}", " --- |".repeat(sys.len()));
        let mut tests: Vec<&Cell> = Vec::new();
        for c in cells.iter().filter(|c| c.topo_id == *tid) {
            if !tests.iter().any(|t| t.test_id == c.test_id) {
                tests.push(c);
            }
        }
        for t in tests {
            let row: Vec<String> = sys
                .iter()
                .map(|s| {
                    cells
                        .iter()
                        .find(|c| c.topo_id == *tid && c.test_id == t.test_id && c.sys_id == s.0)
                        .map_or("–".into(), cell_text)
                })
                .collect();
            let _ = writeln!(o, "| {} | {} | {} |", t.test, t.unit, row.join(" | "));
        }
    }
    o.push_str(&targets(cells));
    o
}

fn verdict(v: Option<f64>, goal: f64) -> String {
    match v {
        Some(x) if x >= goal => format!("{x:.2}× — met (≥ {goal}×)"),
        Some(x) => format!("{x:.2}× — not met (≥ {goal}×)"),
        None => "no number".into(),
    }
}

fn targets(cells: &[Cell]) -> String {
    let mut o = String::from(
        "\n## Targets (docs/bench/targets.md): canal's advantage, same run\n\n\
         Advantage = canal ÷ other for throughput and connection rate, other ÷ canal for \
         the p50; against pasta, its better path of the two.\n\n\
         | target | test | advantage |\n| --- | --- | --- |\n",
    );
    let gh = "guest-host";
    for (test, name) in [("iperf3", "iperf3 →"), ("iperf3-reverse", "iperf3 ← (-R)")] {
        let p = best_pasta(cells, gh, test);
        let _ = writeln!(
            o,
            "| throughput ≥ 2× pasta | {name} | {} |",
            verdict(p.map(|x| x.0), 2.0)
        );
        let s = advantage(cells, gh, test, "slirp4netns");
        let _ = writeln!(
            o,
            "| throughput ≥ 5× slirp4netns | {name} | {} |",
            verdict(s, 5.0)
        );
    }
    let p = best_pasta(cells, gh, "rr-p50");
    let _ = writeln!(
        o,
        "| RR p50 ≤ 0.5× pasta's | 64 B p50 | {} |",
        verdict(p.map(|x| x.0), 2.0)
    );
    let p = best_pasta(cells, gh, "conn-rate");
    let _ = writeln!(
        o,
        "| connection rate ≥ 2× pasta | conn/s | {} |",
        verdict(p.map(|x| x.0), 2.0)
    );
    for test in ["iperf3", "iperf3-reverse", "rr-p50", "conn-rate"] {
        let p = best_pasta(cells, "guest-guest", test);
        let _ = writeln!(
            o,
            "| two isolated guests ≥ 10× two pasta containers | {test} | {} |",
            verdict(p.map(|x| x.0), 10.0)
        );
    }
    // Issue 16: a static Go program is served by seccomp notification, its data then
    // moves through the kernel; held to the same programs on the host without canal.
    for (topo, where_) in [
        (gh, "client isolated, server on the host"),
        ("guest-guest", "both isolated"),
    ] {
        for test in ["go-http-bulk", "go-http-req"] {
            let n = advantage(cells, topo, test, "native");
            let _ = writeln!(
                o,
                "| static Go net/http inside --isolate ≥ 0.9× the host's | {test}, {where_} | {} |",
                verdict(n, 0.9)
            );
        }
    }
    for test in ["iperf3", "rr-p50", "conn-rate"] {
        let n = advantage(cells, gh, test, "native");
        let _ = writeln!(
            o,
            "| (orientation) canal --isolate vs the host itself | {test} | {} |",
            n.map_or("no number".into(), |x| format!("{x:.2}×"))
        );
    }
    o
}

/// The plot script (matplotlib, Debian's python3-matplotlib under /usr/bin/python3).
const PLOT: &str = include_str!("../../../scripts/b14-plot.py");

/// Writes DIR/b14.png from DIR/b14.csv, or says why not.
pub(crate) fn plot(dir: &Path) -> Result<(), String> {
    let py = Path::new("/usr/bin/python3");
    if !py.is_file() {
        eprintln!("canal bench b14: no plot: /usr/bin/python3 is missing");
        return Ok(());
    }
    let out = std::process::Command::new(py)
        .args(["-c", PLOT])
        .arg(dir)
        .output()
        .map_err(|e| format!("plot: {e}"))?;
    if !out.status.success() {
        eprintln!(
            "canal bench b14: no plot: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    Ok(())
}
