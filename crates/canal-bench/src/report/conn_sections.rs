//! The Markdown sections of the connection experiments: B12 (connection rate) and B13
//! (many connections held), each beside kernel TCP measured in the same run; and B15
//! (UDP), beside kernel UDP.
use crate::model::{Cell, System, Workload};
use crate::report::table::{ratio_table, size_rows, sys_col, Col, RowSpec, Table};

/// Every canal placement against kernel TCP.
fn against_tcp() -> Vec<(Col, Col)> {
    use System::*;
    [CanalGG, CanalGN, CanalNG]
        .into_iter()
        .map(|s| (sys_col(s), sys_col(Tcp)))
        .collect()
}

/// Rows by the size column, relabelled as a count of `what`.
fn count_rows(cells: &[Cell], w: Workload, metric: &str, what: &str) -> Vec<RowSpec> {
    let mut rows = size_rows(cells, w, metric);
    for r in &mut rows {
        r.label = format!("{} {what}", r.size);
    }
    rows
}

/// B12: connections per second with 1 and 16 concurrent clients.
pub(crate) fn b12(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    let mut s = String::new();
    let rate = count_rows(cells, Workload::ConnRate, "conns_s", "client(s)");
    s += &t.render(
        "Connection rate (connect, 1-byte echo, close)",
        "connections/s",
        &rate,
        sys,
    );
    s += &t.render(
        "One connection's life, p50",
        "µs",
        &count_rows(cells, Workload::ConnRate, "conn_p50_us", "client(s)"),
        sys,
    );
    s += &ratio_table(t, "Connection rate ÷ kernel TCP", &rate, &against_tcp());
    s
}

/// B13: RR latency among n idle connections, and memory per idle connection.
pub(crate) fn b13(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    let mut s = String::new();
    let rtt = count_rows(cells, Workload::Hold, "rtt_p50_us", "idle connections");
    s += &t.render(
        "RR p50 at 64 B on one connection among n idle ones",
        "µs",
        &rtt,
        sys,
    );
    let mem: Vec<RowSpec> = count_rows(
        cells,
        Workload::Hold,
        "mem_per_conn_kib",
        "idle connections",
    )
    .into_iter()
    .filter(|r| r.size > 0)
    .collect();
    s += &t.render(
        "Memory per idle connection: PSS of client, server and canald plus the kernel's slab (but /proc's inodes and TIME_WAIT sockets) and TCP pages",
        "KiB",
        &mem,
        sys,
    );
    s += &ratio_table(t, "RR p50 ÷ kernel TCP", &rtt, &against_tcp());
    s += &ratio_table(
        t,
        "Memory per connection ÷ kernel TCP",
        &mem,
        &against_tcp(),
    );
    s
}

/// B15: UDP request-response and stream, beside kernel UDP (the `tcp` column's system
/// runs the same generator over UDP).
pub(crate) fn b15(t: &mut Table, cells: &[Cell], sys: &[Col]) -> String {
    use System::*;
    let mut s = String::new();
    let rtt = size_rows(cells, Workload::UdpRr, "rtt_p50_us");
    s += &t.render(
        "UDP request-response p50 (the tcp column: kernel UDP)",
        "µs",
        &rtt,
        sys,
    );
    let per = |a: System| (sys_col(a), sys_col(Tcp));
    s += &ratio_table(
        t,
        "UDP RR p50 ÷ kernel UDP",
        &rtt,
        &[per(CanalGG), per(CanalGN)],
    );
    let bw = size_rows(cells, Workload::UdpStream, "gbit_s");
    s += &t.render(
        "UDP stream, what arrived (the tcp column: kernel UDP)",
        "Gbit/s",
        &bw,
        sys,
    );
    s += &ratio_table(
        t,
        "UDP stream ÷ kernel UDP",
        &bw,
        &[per(CanalGG), per(CanalGN)],
    );
    s += &t.render(
        "UDP stream: datagrams lost",
        "%",
        &size_rows(cells, Workload::UdpStream, "lost_pct"),
        sys,
    );
    s
}
