//! System calls per message (B7): `strace -c` at two counts.
use crate::model::Cell;
use crate::runner::which;
use crate::runner::Outcome;
use crate::runner::Status;

use crate::runner::Runner;

impl Runner {
    /// System calls per message = (calls at N2 − calls at N1) / (N2 − N1): setup and
    /// teardown cancel out, only the steady state remains.
    pub(crate) fn run_syscalls(&mut self, cell: &Cell) -> Outcome {
        if which("strace").is_none() {
            return Outcome {
                status: Status::NotAvailable("strace is not installed".into()),
                metrics: vec![],
                raw_command: String::new(),
                detail: String::new(),
            };
        }
        let (n1, n2) = self.knobs.strace_counts;
        let mut tables = Vec::new();
        let mut raws = Vec::new();
        for n in [n1, n2] {
            let id = self.next_id();
            let out = self.tmp.join(format!("strace-{id}.txt"));
            let o = self.run_gen(cell, Some((n, &out)));
            raws.push(o.raw_command.clone());
            if o.status != Status::Ok {
                return o;
            }
            match std::fs::read_to_string(&out)
                .map_err(|e| e.to_string())
                .and_then(|t| parse_strace_c(&t))
            {
                Ok(t) => tables.push(t),
                Err(e) => return Outcome::fail(format!("strace -c output: {e}"), raws.join(" ; ")),
            }
        }
        let total = |t: &Vec<(String, f64)>| t.iter().map(|(_, c)| c).sum::<f64>();
        let per = (total(&tables[1]) - total(&tables[0])) / (n2 - n1) as f64;
        let mut diffs: Vec<(String, f64)> = tables[1]
            .iter()
            .map(|(name, c)| {
                let before = tables[0]
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|x| x.1)
                    .unwrap_or(0.0);
                (name.clone(), (c - before) / (n2 - n1) as f64)
            })
            .filter(|(_, d)| d.abs() >= 0.01)
            .collect();
        diffs.sort_by(|a, b| b.1.total_cmp(&a.1));
        let detail = diffs
            .iter()
            .take(4)
            .map(|(n, d)| format!("{n} {d:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        Outcome {
            status: Status::Ok,
            metrics: vec![("syscalls_per_msg".into(), per)],
            raw_command: raws.join(" ; "),
            detail,
        }
    }
}

/// `strace -c` table → (syscall, calls).
pub(crate) fn parse_strace_c(t: &str) -> Result<Vec<(String, f64)>, String> {
    let mut rows = Vec::new();
    for line in t.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f[0].parse::<f64>().is_err() {
            continue;
        }
        let name = f[f.len() - 1];
        if name == "total" {
            continue;
        }
        if let Ok(calls) = f[3].parse::<f64>() {
            rows.push((name.to_string(), calls));
        }
    }
    if rows.is_empty() {
        return Err("no syscall rows".into());
    }
    Ok(rows)
}
