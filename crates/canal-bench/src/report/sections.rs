//! The Markdown section of each experiment.
use crate::model::Cell;
use crate::report::csv::CellAgg;
use crate::report::table::pair_rows;
use crate::report::table::ratio_table;
use crate::report::table::size_rows;
use crate::report::table::sys_col;
use crate::report::table::systems_in;
use crate::report::table::var_col;
use crate::report::table::variants_in;
use crate::report::table::Col;
use crate::report::table::RowSpec;
use crate::report::table::Table;

use crate::model::{Experiment, System, Workload};
use crate::runner::Status;
use std::fmt::Write as _;

/// The Markdown section of one experiment.
pub(crate) fn experiment_section(
    e: &Experiment,
    aggs: &[CellAgg],
    notes: &mut Vec<String>,
) -> String {
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
    s += &match e.id {
        "B1" => b1(&mut t, cells, &sys),
        "B2" => b2(&mut t, cells, &sys),
        "B6" => b6(&mut t, cells, &sys),
        "B3" => b3(&mut t, cells, &sys),
        "B4" => b4(&mut t, cells, &sys),
        "B5" => b5(&mut t, cells, &variant_cols(e.id, cells)),
        "B8" => b8(&mut t, cells, &variant_cols(e.id, cells)),
        "B9" => b9(&mut t, cells, &variant_cols(e.id, cells)),
        "B7" => b7(&mut t, cells, &sys, aggs),
        "B10" => b10(&mut t, &sys),
        "B12" => crate::report::conn_sections::b12(&mut t, cells, &sys),
        "B13" => crate::report::conn_sections::b13(&mut t, cells, &sys),
        "B15" => crate::report::conn_sections::b15(&mut t, cells, &sys),
        _ => String::new(),
    };
    s
}

/// The usual ratio columns: canal and UDS against kernel TCP.
fn gg_tcp() -> Vec<(Col, Col)> {
    use System::*;
    vec![
        (sys_col(CanalGG), sys_col(Tcp)),
        (sys_col(CanalGG), sys_col(Uds)),
        (sys_col(CanalGN), sys_col(Tcp)),
        (sys_col(Uds), sys_col(Tcp)),
    ]
}

/// B5, B8, B9: kernel TCP (if measured) beside each canal variant.
fn variant_cols(id: &str, cells: &[Cell]) -> Vec<Col> {
    use System::*;
    let vs = variants_in(cells);
    let mut cols = vec![];
    if cells.iter().any(|c| c.system == Tcp) {
        cols.push(sys_col(Tcp));
    }
    // B9 runs on guest→native pairs (the split acts in canald).
    let sys = if id == "B9" { CanalGN } else { CanalGG };
    cols.extend(vs.iter().map(|v| var_col(sys, v)));
    cols
}

/// B1: RTT by message size.
fn b1(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    let mut s = String::new();
    use Workload::*;
    let p50 = size_rows(cells, Rr, "rtt_p50_us");
    s += &t.render(
        "RTT p50 by message size",
        "µs, median [min–max] over reps",
        &p50,
        sys,
    );
    s += &t.render(
        "RTT p99 by message size",
        "µs",
        &size_rows(cells, Rr, "rtt_p99_us"),
        sys,
    );
    s += &ratio_table(t, "p50 ratios", &p50, &gg_tcp());
    s
}

/// B2: throughput and message rate by size.
fn b2(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    let mut s = String::new();
    use Workload::*;
    let g = size_rows(cells, Stream, "gbit_s");
    s += &t.render("Throughput by message size", "Gbit/s", &g, sys);
    s += &t.render(
        "Message rate by message size",
        "messages/s",
        &size_rows(cells, Stream, "msgs_s"),
        sys,
    );
    s += &ratio_table(t, "Throughput ratios", &g, &gg_tcp());
    s
}

/// B6: CPU cost per byte.
fn b6(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    let mut s = String::new();
    use Workload::*;
    let c = size_rows(cells, Stream, "cpu_ns_per_byte");
    s += &t.render(
        "CPU time per byte moved, all processes (client + server + canald)",
        "ns/B",
        &c,
        sys,
    );
    s += &t.render(
        "Cores busy during the transfer",
        "cores",
        &size_rows(cells, Stream, "cpu_cores"),
        sys,
    );
    s += &t.render(
        "Estimated cycles per byte (CPU time × nominal MHz; no hardware counters here)",
        "cycles/B",
        &size_rows(cells, Stream, "est_cycles_per_byte"),
        sys,
    );
    s += &ratio_table(t, "Cost ratios", &c, &gg_tcp());
    s
}

/// B3: guest client against a native server.
fn b3(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    let mut s = String::new();
    use System::*;
    use Workload::*;
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
        "Canal end vs native end (guest→native: client under canal, native server; native→guest: server under canal, native client)",
        "",
        &rows,
        sys,
    );
    s += &ratio_table(
        t,
        "guest → native and native → guest ÷ native",
        &rows,
        &[
            (sys_col(CanalGN), sys_col(Tcp)),
            (sys_col(CanalNG), sys_col(Tcp)),
        ],
    );
    s
}

/// B4: many pairs at once.
fn b4(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    let mut s = String::new();
    use System::*;
    use Workload::*;
    let g = pair_rows(cells, Stream, "gbit_s");
    s += &t.render(
        "Aggregate stream throughput, 16 KiB messages",
        "Gbit/s",
        &g,
        sys,
    );
    let l = pair_rows(cells, Rr, "rtt_p50_us");
    s += &t.render("Mean over pairs of RTT p50, 64 B", "µs", &l, sys);
    s += &ratio_table(
        t,
        "canal ÷ kernel TCP",
        &g,
        &[(sys_col(CanalGG), sys_col(Tcp))],
    );
    s
}

/// B5: latency and idle CPU per notification mode.
fn b5(t: &mut Table, cells: &[Cell], cols: &[Col]) -> String {
    let mut s = String::new();
    use Workload::*;
    s += &t.render(
        "RR at 64 B: RTT p50",
        "µs",
        &size_rows(cells, Rr, "rtt_p50_us"),
        cols,
    );
    s += &t.render(
        "RR at 64 B: RTT p99",
        "µs",
        &size_rows(cells, Rr, "rtt_p99_us"),
        cols,
    );
    s += &t.render(
        "RR at 64 B: cores busy (all processes)",
        "cores",
        &size_rows(cells, Rr, "cpu_cores"),
        cols,
    );
    let mut idle = size_rows(cells, Idle, "daemon_cpu_pct");
    idle.iter_mut()
        .for_each(|r| r.label = "idle connection: canald CPU".into());
    let mut ig = size_rows(cells, Idle, "guests_cpu_pct");
    ig.iter_mut()
        .for_each(|r| r.label = "idle connection: client+server CPU".into());
    idle.extend(ig);
    s += &t.render("Idle CPU", "% of one core", &idle, cols);
    s
}

/// B8: one mechanism disabled at a time.
fn b8(t: &mut Table, cells: &[Cell], cols: &[Col]) -> String {
    let mut s = String::new();
    use System::*;
    use Workload::*;
    s += &t.render(
        "Stream throughput with one mechanism disabled",
        "Gbit/s",
        &size_rows(cells, Stream, "gbit_s"),
        cols,
    );
    s += &t.render(
        "RR p50 with one mechanism disabled",
        "µs",
        &size_rows(cells, Rr, "rtt_p50_us"),
        cols,
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
    s
}

/// B9: the coalescing split.
fn b9(t: &mut Table, cells: &[Cell], cols: &[Col]) -> String {
    let mut s = String::new();
    use Workload::*;
    // A split that delays wake-ups also lowers the round-trip rate:
    // compare the CPU per round trip, not only the cores busy.
    s += &t.render(
        "CPU per round trip (all processes) per split",
        "µs",
        &pair_rows(cells, Rr, "cpu_per_rt_us"),
        cols,
    );
    s += &t.render(
        "Cores busy (all processes) per split",
        "cores",
        &pair_rows(cells, Rr, "cpu_cores"),
        cols,
    );
    s += &t.render(
        "Mean RTT p50 per split",
        "µs",
        &pair_rows(cells, Rr, "rtt_p50_us"),
        cols,
    );
    s += &t.render(
        "Worst-case RTT (max) per split",
        "µs",
        &pair_rows(cells, Rr, "rtt_max_us"),
        cols,
    );
    s += &t.render(
        "RTT p99 per split",
        "µs",
        &pair_rows(cells, Rr, "rtt_p99_us"),
        cols,
    );
    s
}

/// B7: system calls per message.
fn b7(t: &mut Table, cells: &[Cell], sys: &[Col], aggs: &[CellAgg]) -> String {
    let mut s = String::new();
    use System::*;
    use Workload::*;
    let mut rows = size_rows(cells, SysRr, "syscalls_per_msg");
    rows.iter_mut()
        .for_each(|r| r.label = format!("RR {}: per round trip", r.label));
    let mut st = size_rows(cells, SysStream, "syscalls_per_msg");
    st.iter_mut()
        .for_each(|r| r.label = format!("stream {}: per send", r.label));
    rows.extend(st);
    let mut cols = sys.to_vec();
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
    s
}

/// B10: applications.
fn b10(t: &mut Table, sys: &[Col]) -> String {
    let mut s = String::new();
    use System::*;
    use Workload::*;
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
        mk(Memcached, "ops_rps", "memcached+memaslap ops/s"),
        mk(Postgres, "select_tps", "PostgreSQL pgbench select-only tps"),
        mk(Postgres, "tpcb_tps", "PostgreSQL pgbench TPC-B-like tps"),
    ];
    s += &t.render("Applications", "", &rows, sys);
    s += &ratio_table(
        t,
        "Application ratios",
        &rows,
        &[
            (sys_col(CanalGG), sys_col(Tcp)),
            (sys_col(CanalGN), sys_col(Tcp)),
            (sys_col(CanalNG), sys_col(Tcp)),
            (sys_col(Uds), sys_col(Tcp)),
        ],
    );
    s
}
