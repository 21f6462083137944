//! Rows of every run, their per-cell aggregates, and both CSV files.
use crate::report::format::csv_line;

use crate::model::Cell;
use crate::runner::{metric_unit, Outcome, Status};
use crate::stats::{summarize, Summary};
use std::collections::BTreeMap;

pub(crate) struct Row {
    pub(crate) cell: Cell,
    pub(crate) exps: String,
    pub(crate) rep: usize,
    pub(crate) outcome: Outcome,
    pub(crate) repro: String,
}

/// Facts recorded with every row.
pub(crate) struct RunInfo {
    pub(crate) machine: String,
    pub(crate) machine_long: Vec<(String, String)>,
    pub(crate) command: String,
    pub(crate) placement_note: String,
    pub(crate) reps: usize,
    pub(crate) mode: String,
}

/// The columns that name a cell, first in both results.csv and summary.csv.
const CELL_COLUMNS: [&str; 7] = [
    "experiments",
    "system",
    "system_label",
    "workload",
    "size_bytes",
    "pairs",
    "variant",
];

/// A header line: the cell's columns, then `rest`.
fn header(rest: &[&str]) -> String {
    csv_line(
        &CELL_COLUMNS
            .iter()
            .chain(rest)
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    )
}

/// The values of CELL_COLUMNS for `c` (run by experiments `exps`).
fn cell_fields(exps: &str, c: &Cell) -> Vec<String> {
    vec![
        exps.to_string(),
        c.system.id().into(),
        c.system.label().into(),
        c.workload.id().into(),
        c.size.to_string(),
        c.pairs.to_string(),
        c.variant.clone(),
    ]
}

pub(crate) fn write_results_csv(rows: &[Row], info: &RunInfo) -> String {
    let mut out = header(&[
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
    ]);
    for r in rows {
        let c = &r.cell;
        let base = |metric: &str, value: String, unit: &str| {
            let mut v = cell_fields(&r.exps, c);
            v.extend([
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
            ]);
            v
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
pub(crate) struct CellAgg<'a> {
    pub(crate) cell: &'a Cell,
    pub(crate) rows: Vec<&'a Row>,
}

impl CellAgg<'_> {
    pub(crate) fn summary(&self, metric: &str) -> Option<Summary> {
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
    pub(crate) fn status(&self) -> Status {
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
    pub(crate) fn failed_reps(&self) -> Vec<&Status> {
        self.rows
            .iter()
            .map(|r| &r.outcome.status)
            .filter(|s| **s != Status::Ok)
            .collect()
    }
}

pub(crate) fn aggregate(rows: &[Row]) -> Vec<CellAgg<'_>> {
    let mut map: BTreeMap<&Cell, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        map.entry(&r.cell).or_default().push(r);
    }
    map.into_iter()
        .map(|(cell, rows)| CellAgg { cell, rows })
        .collect()
}

pub(crate) fn write_summary_csv(aggs: &[CellAgg]) -> String {
    let mut out = header(&[
        "metric", "unit", "n", "median", "min", "max", "p25", "p75", "status", "reason", "repro",
    ]);
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
        let head = cell_fields(&first.exps, c);
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
