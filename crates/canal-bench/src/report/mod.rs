//! Results → CSV (every run and a per-cell summary), a Markdown report, and the inputs of
//! the plotting script. One file per job; this facade re-exports what the harness uses.

mod conn_sections;
mod csv;
mod format;
mod markdown;
mod sections;
mod table;

pub(crate) use csv::{aggregate, write_results_csv, write_summary_csv, Row, RunInfo};
pub(crate) use format::fmt_num;
pub(crate) use markdown::{markdown, readme_snippet, verdicts};
