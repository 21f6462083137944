//! Quotas and policy per guest (docs/operations.md, "Limit"): the table of the
//! configuration (`table`), destination rules (`rules`), rate buckets (`bucket`), and
//! what a guest has in force (`enforce`).
mod bucket;
mod enforce;
mod rules;
mod table;

pub use bucket::Bucket;
pub(crate) use enforce::Rates;
pub use enforce::{GuestPolicy, Hit};
pub use rules::{DestPolicy, DestRule};
pub use table::{cgroup_of, Limits, QuotaTable, Who};
