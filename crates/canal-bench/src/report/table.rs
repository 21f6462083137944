//! Markdown tables: rows by size or pairs, columns by system or variant, ratio tables.
use crate::report::csv::CellAgg;
use crate::report::format::fmt_num;
use crate::report::format::fmt_size;

use crate::model::{Cell, System, Workload};
use crate::runner::Status;
use std::fmt::Write as _;

#[derive(Clone)]
pub(crate) struct Col {
    pub(crate) label: String,
    pub(crate) system: System,
    pub(crate) variant: String,
}

pub(crate) struct RowSpec {
    pub(crate) label: String,
    pub(crate) workload: Workload,
    pub(crate) size: usize,
    pub(crate) pairs: usize,
    pub(crate) metric: String,
}

pub(crate) struct Table<'a, 'n> {
    pub(crate) aggs: &'a [CellAgg<'a>],
    pub(crate) notes: &'n mut Vec<String>,
}

impl<'a> Table<'a, '_> {
    pub(crate) fn find(&self, r: &RowSpec, c: &Col) -> Option<&'a CellAgg<'a>> {
        self.aggs.iter().find(|a| {
            a.cell.workload == r.workload
                && a.cell.size == r.size
                && a.cell.pairs == r.pairs
                && a.cell.system == c.system
                && a.cell.variant == c.variant
        })
    }

    pub(crate) fn note(&mut self, reason: &str) -> usize {
        if let Some(i) = self.notes.iter().position(|n| n == reason) {
            return i + 1;
        }
        self.notes.push(reason.to_string());
        self.notes.len()
    }

    pub(crate) fn median(&self, r: &RowSpec, c: &Col) -> Option<f64> {
        self.find(r, c)
            .and_then(|a| a.summary(&r.metric))
            .map(|s| s.median)
    }

    /// One Markdown table: a row per RowSpec, a column per Col, then ratio columns.
    pub(crate) fn render(
        &mut self,
        title: &str,
        unit: &str,
        rows: &[RowSpec],
        cols: &[Col],
    ) -> String {
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
pub(crate) fn ratio_table(
    t: &Table,
    title: &str,
    rows: &[RowSpec],
    pairs: &[(Col, Col)],
) -> String {
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

pub(crate) fn sys_col(s: System) -> Col {
    Col {
        label: s.label().into(),
        system: s,
        variant: "default".into(),
    }
}

pub(crate) fn var_col(s: System, v: &str) -> Col {
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

pub(crate) fn size_rows(cells: &[Cell], w: Workload, metric: &str) -> Vec<RowSpec> {
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

pub(crate) fn pair_rows(cells: &[Cell], w: Workload, metric: &str) -> Vec<RowSpec> {
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

pub(crate) fn systems_in(cells: &[Cell]) -> Vec<System> {
    let mut s: Vec<System> = cells.iter().map(|c| c.system).collect();
    s.sort();
    s.dedup();
    s
}

pub(crate) fn variants_in(cells: &[Cell]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for c in cells {
        if !v.contains(&c.variant) {
            v.push(c.variant.clone());
        }
    }
    v
}
