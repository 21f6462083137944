//! Results → CSV (every run and a per-cell summary), a Markdown report, and the inputs of
//! the plotting script.

use crate::model::{Cell, Experiment, System, Workload};
use crate::runner::{metric_unit, Outcome, Status};
use crate::stats::{summarize, Summary};
use std::collections::BTreeMap;
use std::fmt::Write as _;

pub struct Row {
    pub cell: Cell,
    pub exps: String,
    pub rep: usize,
    pub outcome: Outcome,
    pub repro: String,
}

/// Facts recorded with every row.
pub struct RunInfo {
    pub machine: String,
    pub machine_long: Vec<(String, String)>,
    pub command: String,
    pub placement_note: String,
    pub reps: usize,
    pub mode: String,
}

pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv_line(fields: &[String]) -> String {
    let mut l = fields
        .iter()
        .map(|f| csv_field(f))
        .collect::<Vec<_>>()
        .join(",");
    l.push('\n');
    l
}

pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if a >= 100.0 {
        format!("{:.0}", v)
    } else if a >= 10.0 {
        format!("{:.1}", v)
    } else if a >= 1.0 {
        format!("{:.2}", v)
    } else {
        format!("{:.3}", v)
    }
}

pub fn fmt_size(b: usize) -> String {
    if b >= 1024 && b % 1024 == 0 {
        format!("{} KiB", b / 1024)
    } else {
        format!("{b} B")
    }
}

pub fn write_results_csv(rows: &[Row], info: &RunInfo) -> String {
    let mut out = csv_line(
        &[
            "experiments",
            "system",
            "system_label",
            "workload",
            "size_bytes",
            "pairs",
            "variant",
            "rep",
            "status",
            "reason",
            "metric",
            "value",
            "unit",
            "detail",
            "placement",
            "machine",
            "command",
            "raw_command",
        ]
        .map(String::from),
    );
    for r in rows {
        let c = &r.cell;
        let base = |metric: &str, value: String, unit: &str| {
            vec![
                r.exps.clone(),
                c.system.id().into(),
                c.system.label().into(),
                c.workload.id().into(),
                c.size.to_string(),
                c.pairs.to_string(),
                c.variant.clone(),
                r.rep.to_string(),
                r.outcome.status.word().into(),
                r.outcome.status.reason().into(),
                metric.into(),
                value,
                unit.into(),
                r.outcome.detail.clone(),
                format!("{}; {}", c.system.placement(), info.placement_note),
                info.machine.clone(),
                r.repro.clone(),
                r.outcome.raw_command.clone(),
            ]
        };
        if r.outcome.metrics.is_empty() {
            out.push_str(&csv_line(&base("", String::new(), "")));
        }
        for (m, v) in &r.outcome.metrics {
            out.push_str(&csv_line(&base(m, format!("{v}"), metric_unit(m))));
        }
    }
    out
}

/// All repetitions of one cell.
pub struct CellAgg<'a> {
    pub cell: &'a Cell,
    pub rows: Vec<&'a Row>,
}

impl CellAgg<'_> {
    pub fn summary(&self, metric: &str) -> Option<Summary> {
        let v: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.outcome.status == Status::Ok)
            .filter_map(|r| {
                r.outcome
                    .metrics
                    .iter()
                    .find(|(m, _)| m == metric)
                    .map(|x| x.1)
            })
            .collect();
        summarize(&v)
    }
    /// The status of the cell as a whole: ok if any repetition succeeded.
    pub fn status(&self) -> Status {
        let bad: Vec<&Status> = self
            .rows
            .iter()
            .map(|r| &r.outcome.status)
            .filter(|s| **s != Status::Ok)
            .collect();
        if bad.len() < self.rows.len() {
            Status::Ok
        } else {
            bad.first()
                .map(|s| (*s).clone())
                .unwrap_or(Status::Skipped("not run".into()))
        }
    }
    pub fn failed_reps(&self) -> Vec<&Status> {
        self.rows
            .iter()
            .map(|r| &r.outcome.status)
            .filter(|s| **s != Status::Ok)
            .collect()
    }
}

pub fn aggregate(rows: &[Row]) -> Vec<CellAgg<'_>> {
    let mut map: BTreeMap<&Cell, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        map.entry(&r.cell).or_default().push(r);
    }
    map.into_iter()
        .map(|(cell, rows)| CellAgg { cell, rows })
        .collect()
}

pub fn write_summary_csv(aggs: &[CellAgg]) -> String {
    let mut out = csv_line(
        &[
            "experiments",
            "system",
            "system_label",
            "workload",
            "size_bytes",
            "pairs",
            "variant",
            "metric",
            "unit",
            "n",
            "median",
            "min",
            "max",
            "p25",
            "p75",
            "status",
            "reason",
            "repro",
        ]
        .map(String::from),
    );
    for a in aggs {
        let c = a.cell;
        let first = a.rows[0];
        let st = a.status();
        let failed = a.failed_reps();
        let reason = if st == Status::Ok && !failed.is_empty() {
            format!(
                "{} of {} reps failed: {}",
                failed.len(),
                a.rows.len(),
                failed[0].reason()
            )
        } else {
            st.reason().to_string()
        };
        let head = vec![
            first.exps.clone(),
            c.system.id().into(),
            c.system.label().into(),
            c.workload.id().into(),
            c.size.to_string(),
            c.pairs.to_string(),
            c.variant.clone(),
        ];
        let mut metrics: Vec<&str> = Vec::new();
        for r in &a.rows {
            for (m, _) in &r.outcome.metrics {
                if !metrics.contains(&m.as_str()) {
                    metrics.push(m);
                }
            }
        }
        let tail = |line: &mut Vec<String>| {
            line.push(st.word().into());
            line.push(reason.clone());
            line.push(first.repro.clone());
        };
        let mut wrote = false;
        for m in metrics {
            if let Some(s) = a.summary(m) {
                let mut line = head.clone();
                line.extend([m.to_string(), metric_unit(m).to_string(), s.n.to_string()]);
                line.extend(
                    [s.median, s.min, s.max, s.p25, s.p75]
                        .iter()
                        .map(|v| format!("{v}")),
                );
                tail(&mut line);
                out.push_str(&csv_line(&line));
                wrote = true;
            }
        }
        if !wrote {
            let mut line = head.clone();
            line.extend([
                "".into(),
                "".into(),
                "0".into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
            ]);
            tail(&mut line);
            out.push_str(&csv_line(&line));
        }
    }
    out
}

#[derive(Clone)]
struct Col {
    label: String,
    system: System,
    variant: String,
}

struct RowSpec {
    label: String,
    workload: Workload,
    size: usize,
    pairs: usize,
    metric: String,
}

struct Table<'a, 'n> {
    aggs: &'a [CellAgg<'a>],
    notes: &'n mut Vec<String>,
}

impl<'a> Table<'a, '_> {
    fn find(&self, r: &RowSpec, c: &Col) -> Option<&'a CellAgg<'a>> {
        self.aggs.iter().find(|a| {
            a.cell.workload == r.workload
                && a.cell.size == r.size
                && a.cell.pairs == r.pairs
                && a.cell.system == c.system
                && a.cell.variant == c.variant
        })
    }

    fn note(&mut self, reason: &str) -> usize {
        if let Some(i) = self.notes.iter().position(|n| n == reason) {
            return i + 1;
        }
        self.notes.push(reason.to_string());
        self.notes.len()
    }

    fn median(&self, r: &RowSpec, c: &Col) -> Option<f64> {
        self.find(r, c)
            .and_then(|a| a.summary(&r.metric))
            .map(|s| s.median)
    }

    /// One Markdown table: a row per RowSpec, a column per Col, then ratio columns.
    fn render(&mut self, title: &str, unit: &str, rows: &[RowSpec], cols: &[Col]) -> String {
        let rows: Vec<&RowSpec> = rows
            .iter()
            .filter(|r| cols.iter().any(|c| self.find(r, c).is_some()))
            .collect();
        let cols: Vec<&Col> = cols
            .iter()
            .filter(|c| rows.iter().any(|r| self.find(r, c).is_some()))
            .collect();
        if rows.is_empty() || cols.is_empty() {
            return String::new();
        }
        let mut s = format!(
            "**{title}**{}\n\n| |",
            if unit.is_empty() {
                String::new()
            } else {
                format!(" ({unit})")
            }
        );
        for c in &cols {
            let _ = write!(s, " {} |", c.label);
        }
        s.push('\n');
        s.push_str(&"| --- ".repeat(cols.len() + 1));
        s.push_str("|\n");
        for r in &rows {
            let _ = write!(s, "| {} |", r.label);
            for c in &cols {
                let cell = match self.find(r, c) {
                    None => "".to_string(),
                    Some(a) => match (a.status(), a.summary(&r.metric)) {
                        (Status::Ok, Some(sm)) => {
                            let mut t = if sm.n > 1 {
                                format!(
                                    "{} [{}–{}]",
                                    fmt_num(sm.median),
                                    fmt_num(sm.min),
                                    fmt_num(sm.max)
                                )
                            } else {
                                fmt_num(sm.median)
                            };
                            let f = a.failed_reps();
                            if !f.is_empty() {
                                let n = self.note(f[0].reason());
                                let _ = write!(
                                    t,
                                    " ({} of {} reps failed [{n}])",
                                    f.len(),
                                    a.rows.len()
                                );
                            }
                            t
                        }
                        (Status::Ok, None) => "–".into(),
                        (st, _) => {
                            let n = self.note(st.reason());
                            format!("{} [{n}]", st.word())
                        }
                    },
                };
                let _ = write!(s, " {cell} |");
            }
            s.push('\n');
        }
        s.push('\n');
        s
    }
}

/// Ratio table: for each row, median(col a) / median(col b) of the same run.
fn ratio_table(t: &Table, title: &str, rows: &[RowSpec], pairs: &[(Col, Col)]) -> String {
    let mut lines = Vec::new();
    for r in rows {
        let mut any = false;
        let mut line = format!("| {} |", r.label);
        for (a, b) in pairs {
            let v = match (t.median(r, a), t.median(r, b)) {
                (Some(x), Some(y)) if y != 0.0 => {
                    any = true;
                    format!("{}×", fmt_num(x / y))
                }
                _ => "–".into(),
            };
            let _ = write!(line, " {v} |");
        }
        if any {
            lines.push(line);
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    let mut s = format!("**{title}** (ratio of medians, same run)\n\n| |");
    for (a, b) in pairs {
        let _ = write!(s, " {} ÷ {} |", a.label, b.label);
    }
    s.push('\n');
    s.push_str(&"| --- ".repeat(pairs.len() + 1));
    s.push_str("|\n");
    for l in lines {
        s.push_str(&l);
        s.push('\n');
    }
    s.push('\n');
    s
}

fn sys_col(s: System) -> Col {
    Col {
        label: s.label().into(),
        system: s,
        variant: "default".into(),
    }
}

fn var_col(s: System, v: &str) -> Col {
    let label = match (s, v) {
        (System::CanalGG, "default") => "canal default".to_string(),
        (_, "default") => s.label().to_string(),
        _ => format!("canal {v}"),
    };
    Col {
        label,
        system: s,
        variant: v.into(),
    }
}

fn size_rows(cells: &[Cell], w: Workload, metric: &str) -> Vec<RowSpec> {
    let mut sizes: Vec<(usize, usize)> = cells
        .iter()
        .filter(|c| c.workload == w)
        .map(|c| (c.size, c.pairs))
        .collect();
    sizes.sort();
    sizes.dedup();
    sizes
        .into_iter()
        .map(|(size, pairs)| RowSpec {
            label: if pairs > 1 {
                format!("{} × {pairs} pairs", fmt_size(size))
            } else {
                fmt_size(size)
            },
            workload: w,
            size,
            pairs,
            metric: metric.into(),
        })
        .collect()
}

fn pair_rows(cells: &[Cell], w: Workload, metric: &str) -> Vec<RowSpec> {
    let mut ps: Vec<(usize, usize)> = cells
        .iter()
        .filter(|c| c.workload == w)
        .map(|c| (c.pairs, c.size))
        .collect();
    ps.sort();
    ps.dedup();
    ps.into_iter()
        .map(|(pairs, size)| RowSpec {
            label: format!("{pairs} pair(s)"),
            workload: w,
            size,
            pairs,
            metric: metric.into(),
        })
        .collect()
}

fn systems_in(cells: &[Cell]) -> Vec<System> {
    let mut s: Vec<System> = cells.iter().map(|c| c.system).collect();
    s.sort();
    s.dedup();
    s
}

fn variants_in(cells: &[Cell]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for c in cells {
        if !v.contains(&c.variant) {
            v.push(c.variant.clone());
        }
    }
    v
}

/// The Markdown section of one experiment.
pub fn experiment_section(e: &Experiment, aggs: &[CellAgg], notes: &mut Vec<String>) -> String {
    use System::*;
    use Workload::*;
    let mut s = format!(
        "### {} — {}\n\nMeasures: {}. Target: {}.\n\n",
        e.id, e.title, e.measures, e.target
    );
    if let Some(u) = e.unavailable {
        let _ = writeln!(s, "Not available: {u}.\n");
        return s;
    }
    let cells = &e.cells;
    let sys: Vec<Col> = systems_in(cells).into_iter().map(sys_col).collect();
    let mut t = Table { aggs, notes };
    let gg_tcp = || {
        vec![
            (sys_col(CanalGG), sys_col(Tcp)),
            (sys_col(CanalGG), sys_col(Uds)),
            (sys_col(CanalGN), sys_col(Tcp)),
            (sys_col(Uds), sys_col(Tcp)),
        ]
    };
    match e.id {
        "B1" => {
            let p50 = size_rows(cells, Rr, "rtt_p50_us");
            s += &t.render(
                "RTT p50 by message size",
                "µs, median [min–max] over reps",
                &p50,
                &sys,
            );
            s += &t.render(
                "RTT p99 by message size",
                "µs",
                &size_rows(cells, Rr, "rtt_p99_us"),
                &sys,
            );
            s += &ratio_table(&t, "p50 ratios", &p50, &gg_tcp());
        }
        "B2" | "B6" => {
            if e.id == "B2" {
                let g = size_rows(cells, Stream, "gbit_s");
                s += &t.render("Throughput by message size", "Gbit/s", &g, &sys);
                s += &t.render(
                    "Message rate by message size",
                    "messages/s",
                    &size_rows(cells, Stream, "msgs_s"),
                    &sys,
                );
                s += &ratio_table(&t, "Throughput ratios", &g, &gg_tcp());
            } else {
                let c = size_rows(cells, Stream, "cpu_ns_per_byte");
                s += &t.render(
                    "CPU time per byte moved, all processes (client + server + canald)",
                    "ns/B",
                    &c,
                    &sys,
                );
                s += &t.render(
                    "Cores busy during the transfer",
                    "cores",
                    &size_rows(cells, Stream, "cpu_cores"),
                    &sys,
                );
                s += &t.render(
                    "Estimated cycles per byte (CPU time × nominal MHz; no hardware counters here)",
                    "cycles/B",
                    &size_rows(cells, Stream, "est_cycles_per_byte"),
                    &sys,
                );
                s += &ratio_table(&t, "Cost ratios", &c, &gg_tcp());
            }
        }
        "B3" => {
            let mut rows = size_rows(cells, Stream, "gbit_s");
            rows.iter_mut()
                .for_each(|r| r.label = format!("generator stream {} — Gbit/s", r.label));
            let mut more = size_rows(cells, Iperf3, "gbit_s");
            more.iter_mut()
                .for_each(|r| r.label = format!("iperf3 -l {} — Gbit/s", r.label));
            rows.extend(more);
            let mut more = size_rows(cells, Rr, "rtt_p50_us");
            more.iter_mut()
                .for_each(|r| r.label = format!("generator RR {} — p50 µs", r.label));
            rows.extend(more);
            let mut more = size_rows(cells, Sockperf, "rtt_p50_us");
            more.iter_mut()
                .for_each(|r| r.label = format!("sockperf ping-pong {} — RTT p50 µs", r.label));
            rows.extend(more);
            let mut more = size_rows(cells, Sockperf, "rtt_p99_us");
            more.iter_mut()
                .for_each(|r| r.label = format!("sockperf ping-pong {} — RTT p99 µs", r.label));
            rows.extend(more);
            s += &t.render(
                "Guest client vs native client, same native server",
                "",
                &rows,
                &sys,
            );
            s += &ratio_table(
                &t,
                "guest → native ÷ native",
                &rows,
                &[(sys_col(CanalGN), sys_col(Tcp))],
            );
        }
        "B4" => {
            let g = pair_rows(cells, Stream, "gbit_s");
            s += &t.render(
                "Aggregate stream throughput, 16 KiB messages",
                "Gbit/s",
                &g,
                &sys,
            );
            let l = pair_rows(cells, Rr, "rtt_p50_us");
            s += &t.render("Mean over pairs of RTT p50, 64 B", "µs", &l, &sys);
            s += &ratio_table(
                &t,
                "canal ÷ kernel TCP",
                &g,
                &[(sys_col(CanalGG), sys_col(Tcp))],
            );
        }
        "B5" | "B8" | "B9" => {
            let vs = variants_in(cells);
            let mut cols = vec![];
            if cells.iter().any(|c| c.system == Tcp) {
                cols.push(sys_col(Tcp));
            }
            // B9 runs on guest→native pairs (the split acts in canald).
            let sys = if e.id == "B9" { CanalGN } else { CanalGG };
            cols.extend(vs.iter().map(|v| var_col(sys, v)));
            match e.id {
                "B5" => {
                    s += &t.render(
                        "RR at 64 B: RTT p50",
                        "µs",
                        &size_rows(cells, Rr, "rtt_p50_us"),
                        &cols,
                    );
                    s += &t.render(
                        "RR at 64 B: RTT p99",
                        "µs",
                        &size_rows(cells, Rr, "rtt_p99_us"),
                        &cols,
                    );
                    s += &t.render(
                        "RR at 64 B: cores busy (all processes)",
                        "cores",
                        &size_rows(cells, Rr, "cpu_cores"),
                        &cols,
                    );
                    let mut idle = size_rows(cells, Idle, "daemon_cpu_pct");
                    idle.iter_mut()
                        .for_each(|r| r.label = "idle connection: canald CPU".into());
                    let mut ig = size_rows(cells, Idle, "guests_cpu_pct");
                    ig.iter_mut()
                        .for_each(|r| r.label = "idle connection: client+server CPU".into());
                    idle.extend(ig);
                    s += &t.render("Idle CPU", "% of one core", &idle, &cols);
                }
                "B8" => {
                    s += &t.render(
                        "Stream throughput with one mechanism disabled",
                        "Gbit/s",
                        &size_rows(cells, Stream, "gbit_s"),
                        &cols,
                    );
                    s += &t.render(
                        "RR p50 with one mechanism disabled",
                        "µs",
                        &size_rows(cells, Rr, "rtt_p50_us"),
                        &cols,
                    );
                    // Guest→native: the path through canald (batching, coalescing).
                    let gn: Vec<Col> = variants_in(cells)
                        .iter()
                        .filter(|v| {
                            cells
                                .iter()
                                .any(|c| c.system == CanalGN && c.variant == **v)
                        })
                        .map(|v| {
                            let mut c = var_col(CanalGN, v);
                            c.label = format!("guest→native {v}");
                            c
                        })
                        .collect();
                    if !gn.is_empty() {
                        s += &t.render(
                            "Guest→native stream throughput with one mechanism disabled",
                            "Gbit/s",
                            &size_rows(cells, Stream, "gbit_s"),
                            &gn,
                        );
                        s += &t.render(
                            "Guest→native RR p50 with one mechanism disabled",
                            "µs",
                            &size_rows(cells, Rr, "rtt_p50_us"),
                            &gn,
                        );
                    }
                }
                _ => {
                    // A split that delays wake-ups also lowers the round-trip rate:
                    // compare the CPU per round trip, not only the cores busy.
                    s += &t.render(
                        "CPU per round trip (all processes) per split",
                        "µs",
                        &pair_rows(cells, Rr, "cpu_per_rt_us"),
                        &cols,
                    );
                    s += &t.render(
                        "Cores busy (all processes) per split",
                        "cores",
                        &pair_rows(cells, Rr, "cpu_cores"),
                        &cols,
                    );
                    s += &t.render(
                        "Mean RTT p50 per split",
                        "µs",
                        &pair_rows(cells, Rr, "rtt_p50_us"),
                        &cols,
                    );
                    s += &t.render(
                        "Worst-case RTT (max) per split",
                        "µs",
                        &pair_rows(cells, Rr, "rtt_max_us"),
                        &cols,
                    );
                    s += &t.render(
                        "RTT p99 per split",
                        "µs",
                        &pair_rows(cells, Rr, "rtt_p99_us"),
                        &cols,
                    );
                }
            }
        }
        "B7" => {
            let mut rows = size_rows(cells, SysRr, "syscalls_per_msg");
            rows.iter_mut()
                .for_each(|r| r.label = format!("RR {}: per round trip", r.label));
            let mut st = size_rows(cells, SysStream, "syscalls_per_msg");
            st.iter_mut()
                .for_each(|r| r.label = format!("stream {}: per send", r.label));
            rows.extend(st);
            let mut cols = sys.clone();
            for (system, who) in [(CanalGG, "g↔g"), (CanalGN, "g→n")] {
                if cells
                    .iter()
                    .any(|c| c.system == system && c.variant == "notify=poll")
                {
                    let mut c = var_col(system, "notify=poll");
                    c.label = format!("canal {who}, all polling");
                    cols.push(c);
                }
            }
            s += &t.render(
                "Client system calls per message, steady state",
                "calls",
                &rows,
                &cols,
            );
            let mut d = String::new();
            for a in aggs
                .iter()
                .filter(|a| matches!(a.cell.workload, SysRr | SysStream) && cells.contains(a.cell))
            {
                if let Some(r) = a.rows.iter().find(|r| r.outcome.status == Status::Ok) {
                    let _ = writeln!(
                        d,
                        "- {}{} {}: {}",
                        a.cell.system.label(),
                        if a.cell.variant == "default" {
                            String::new()
                        } else {
                            format!(" ({})", a.cell.variant)
                        },
                        a.cell.workload.id(),
                        if r.outcome.detail.is_empty() {
                            "none"
                        } else {
                            &r.outcome.detail
                        }
                    );
                }
            }
            if !d.is_empty() {
                s += "Per call (first ok repetition):\n\n";
                s += &d;
                s.push('\n');
            }
        }
        "B10" => {
            let mk = |w: Workload, m: &str, label: &str| RowSpec {
                label: label.into(),
                workload: w,
                size: 0,
                pairs: 1,
                metric: m.into(),
            };
            let rows = vec![
                mk(Redis, "set_rps", "redis SET req/s"),
                mk(Redis, "get_rps", "redis GET req/s"),
                mk(Redis, "get_p99_us", "redis GET p99 µs"),
                mk(Nginx, "req_s", "nginx+wrk req/s"),
                mk(Nginx, "p99_us", "nginx+wrk p99 µs"),
            ];
            s += &t.render("Applications", "", &rows, &sys);
            s += &ratio_table(
                &t,
                "Application ratios",
                &rows,
                &[
                    (sys_col(CanalGG), sys_col(Tcp)),
                    (sys_col(CanalGN), sys_col(Tcp)),
                    (sys_col(Uds), sys_col(Tcp)),
                ],
            );
        }
        _ => {}
    }
    s
}

/// One line per target the harness can judge mechanically from this run.
pub fn verdicts(aggs: &[CellAgg]) -> Vec<String> {
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
    for (m, label) in [("get_rps", "redis GET"), ("set_rps", "redis SET")] {
        judge(
            &format!("B10 {label}: g↔g ≥ 1.5× native, g→n ≥ 0.95× native"),
            (|| {
                let t = med(Tcp, Redis, 0, m)?;
                let g = med(CanalGG, Redis, 0, m)?;
                let n = med(CanalGN, Redis, 0, m)?;
                Ok((
                    g >= 1.5 * t && n >= 0.95 * t,
                    format!("g↔g {}×, g→n {}×", fmt_num(g / t), fmt_num(n / t)),
                ))
            })(),
        );
    }
    out
}

pub fn markdown(info: &RunInfo, exps: &[Experiment], aggs: &[CellAgg], plots: &[String]) -> String {
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
pub fn headline(aggs: &[CellAgg], notes_out: &mut Vec<String>) -> String {
    use System::*;
    use Workload::*;
    let items: [(&str, Workload, usize, &str, bool); 11] = [
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
pub fn readme_snippet(info: &RunInfo, aggs: &[CellAgg], out: &str, plots: &[String]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_escaping_and_numbers() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(fmt_num(1234567.0), "1.235M");
        assert_eq!(fmt_num(0.1234), "0.123");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_size(65536), "64 KiB");
        assert_eq!(fmt_size(56), "56 B");
    }
}
