//! Metrics: the listing as Prometheus text (`prom`) and its HTTP endpoint (`http`).
pub mod http;
pub(crate) mod prom;
