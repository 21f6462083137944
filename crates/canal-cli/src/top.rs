//! `canal top`: canald's guests and workers refreshed in the terminal, with rates
//! (requests, errors, bytes, wake-ups per second) from two listings an interval apart —
//! what `top` is for processes and `onload_stackdump` for Onload stacks.

use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub(crate) struct TopArgs {
    /// Control socket [default: as canal run finds it]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Seconds between refreshes
    #[arg(long, short = 'd', value_name = "SECS", default_value_t = 1.0)]
    interval: f64,
    /// Stop after N refreshes [default: until interrupted]
    #[arg(long, short = 'n', value_name = "N")]
    iterations: Option<u64>,
    /// Also list each guest's sockets
    #[arg(long)]
    sockets: bool,
}

/// One listing, and when it was taken.
struct Sample {
    at: Instant,
    json: Value,
}

fn fetch(path: &std::path::Path) -> Result<Sample, String> {
    let text = canald::fetch_stat(path, false).map_err(|e| e.to_string())?;
    let json = serde_json::from_str(&text).map_err(|e| format!("bad listing: {e}"))?;
    Ok(Sample {
        at: Instant::now(),
        json,
    })
}

pub(crate) fn run(a: &TopArgs) -> i32 {
    if !(a.interval > 0.0 && a.interval <= 3600.0) {
        eprintln!("canal top: --interval must be in (0, 3600] seconds");
        return 2;
    }
    let path = canald::spawn::locate(a.socket.as_deref());
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut prev = match fetch(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("canal top: no canald answers on {}: {e}", path.display());
            return 1;
        }
    };
    let mut n = 0u64;
    loop {
        std::thread::sleep(Duration::from_secs_f64(a.interval));
        let now = match fetch(&path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("canal top: canald on {} went away: {e}", path.display());
                return 1;
            }
        };
        let mut frame = String::new();
        if tty {
            frame.push_str("\x1b[H\x1b[2J");
        } else if n > 0 {
            frame.push('\n');
        }
        frame.push_str(&render(&prev, &now, a.sockets));
        let st = canald::output::print_or_fail("canal top", &frame);
        if st != 0 {
            return st;
        }
        n += 1;
        if a.iterations.is_some_and(|max| n >= max) {
            return 0;
        }
        prev = now;
    }
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// Per-second rate of counter `k` between two entries (0 when it went down: a restart).
fn rate(old: Option<&Value>, new: &Value, k: &str, secs: f64) -> f64 {
    let before = old.map_or(0, |o| u(o, k));
    u(new, k).saturating_sub(before) as f64 / secs
}

/// `1.2k`, `3.4M`: a rate in a narrow column.
fn human(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.1}G", x / 1e9),
        x if x >= 1e6 => format!("{:.1}M", x / 1e6),
        x if x >= 1e4 => format!("{:.1}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

fn render(prev: &Sample, now: &Sample, sockets: bool) -> String {
    let secs = now.at.duration_since(prev.at).as_secs_f64().max(1e-3);
    let (p, j) = (&prev.json, &now.json);
    let empty = Vec::new();
    let list = |v: &Value, k: &str| v.get(k).and_then(Value::as_array).unwrap_or(&empty).clone();
    let mut o = String::new();
    let d = &j["daemon"];
    let guests = list(j, "guests");
    let _ = writeln!(
        o,
        "canald pid {}  socket {}  guests {}  networks {}   (rates per second over {secs:.1} s)",
        u(d, "pid"),
        d["socket"].as_str().unwrap_or("?"),
        guests.len(),
        list(j, "networks").len()
    );
    let old_workers: HashMap<u64, Value> = list(&p["daemon"], "workers")
        .into_iter()
        .map(|w| (u(&w, "id"), w))
        .collect();
    let _ = writeln!(
        o,
        "\n{:>6} {:>6} {:>7} {:>7} {:>7} {:>9} {:>8} {:>8} {:>6}",
        "WORKER", "GUESTS", "SOCKETS", "REQ/s", "B/s", "ROUNDS/s", "SLEEPS/s", "WAKES/s", "SPIN%"
    );
    for w in list(d, "workers") {
        let old = old_workers.get(&u(&w, "id"));
        let spun = rate(old, &w, "spun_ns", secs) / 1e9 * 100.0;
        let _ = writeln!(
            o,
            "{:>6} {:>6} {:>7} {:>7} {:>7} {:>9} {:>8} {:>8} {:>5.1}%",
            u(&w, "id"),
            u(&w, "guests"),
            u(&w, "sockets"),
            human(rate(old, &w, "requests", secs)),
            human(rate(old, &w, "bytes", secs)),
            human(rate(old, &w, "rounds", secs)),
            human(rate(old, &w, "sleeps", secs)),
            human(rate(old, &w, "wakes", secs)),
            spun.min(100.0)
        );
    }
    let old_guests: HashMap<u64, Value> = list(p, "guests")
        .into_iter()
        .map(|g| (u(&g, "id"), g))
        .collect();
    let mut rows: Vec<(f64, String, Value)> = guests
        .into_iter()
        .map(|g| {
            let old = old_guests.get(&u(&g, "id"));
            let r = |k| rate(old, &g, k, secs);
            let (req, err, tx, rx, wk) = (
                r("requests"),
                r("errors"),
                r("tx_bytes"),
                r("rx_bytes"),
                r("wakes"),
            );
            let q = &g["quota"];
            let quota = format!(
                "{}/{}/{}",
                u(q, "denied"),
                u(q, "connect_waits"),
                u(q, "request_waits")
            );
            let net = g["network"]["name"].as_str().unwrap_or("host").to_string();
            let line = format!(
                "{:>5} {:>8} {:<15} {:<18} {:>5} {:>7} {:>6} {:>7} {:>7} {:>7} {:>9}",
                u(&g, "id"),
                u(&g, "pid"),
                trunc(g["comm"].as_str().unwrap_or("?"), 15),
                trunc(&net, 18),
                g["sockets"].as_array().map_or(0, Vec::len),
                human(req),
                human(err),
                human(tx),
                human(rx),
                human(wk),
                quota
            );
            (req + (tx + rx) / 1e3, line, g)
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let _ = writeln!(
        o,
        "\n{:>5} {:>8} {:<15} {:<18} {:>5} {:>7} {:>6} {:>7} {:>7} {:>7} {:>9}",
        "GUEST",
        "PID",
        "COMMAND",
        "NETWORK",
        "SOCKS",
        "REQ/s",
        "ERR/s",
        "TX B/s",
        "RX B/s",
        "WAKES/s",
        "QUOTA d/c/r"
    );
    for (_, line, g) in &rows {
        let _ = writeln!(o, "{line}");
        if sockets {
            for s in g["sockets"].as_array().unwrap_or(&empty) {
                let _ = writeln!(
                    o,
                    "        {:<13} {:<11} {:<24} {:<24} tx {} rx {}",
                    s["kind"].as_str().unwrap_or("?"),
                    s["state"].as_str().unwrap_or("?"),
                    s["local"].as_str().unwrap_or(""),
                    s["peer"].as_str().unwrap_or(""),
                    u(s, "tx_bytes"),
                    u(s, "rx_bytes")
                );
            }
        }
    }
    if rows.is_empty() {
        o.push_str("(no guests)\n");
    }
    o
}

fn trunc(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_between_listings() {
        let t0 = Instant::now();
        let a = Sample {
            at: t0,
            json: serde_json::json!({"daemon": {"pid": 1, "socket": "/s", "workers": [{"id": 0, "rounds": 100, "spun_ns": 0}]},
                "guests": [{"id": 7, "pid": 9, "comm": "nginx", "requests": 10, "tx_bytes": 0, "quota": {}, "sockets": []}],
                "networks": []}),
        };
        let b = Sample {
            at: t0 + Duration::from_secs(2),
            json: serde_json::json!({"daemon": {"pid": 1, "socket": "/s", "workers": [{"id": 0, "rounds": 300, "spun_ns": 500_000_000u64}]},
                "guests": [{"id": 7, "pid": 9, "comm": "nginx", "requests": 2010, "tx_bytes": 4_000_000, "quota": {"denied": 2}, "sockets": []}],
                "networks": []}),
        };
        let text = render(&a, &b, false);
        assert!(text.contains("nginx"), "{text}");
        let row = text.lines().find(|l| l.contains("nginx")).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[5], "1000", "{row}"); // requests per second
        assert_eq!(cols[7], "2.0M", "{row}"); // tx bytes per second
        assert_eq!(cols[10], "2/0/0", "{row}");
        let w = text
            .lines()
            .find(|l| l.trim_start().starts_with("0 "))
            .unwrap();
        assert!(w.contains("100") && w.contains("25.0%"), "{w}");
    }
}
