//! How a cell ended: the one word and reason every report shows.

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Status {
    Ok,
    /// It ran and failed (includes canal not working yet).
    Failed(String),
    /// The mechanism or switch does not exist in this build.
    NotAvailable(String),
    /// Not attempted, e.g. after repeated failures of the same system.
    Skipped(String),
}

impl Status {
    pub(crate) fn word(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed(_) => "failed",
            Status::NotAvailable(_) => "not available",
            Status::Skipped(_) => "skipped",
        }
    }
    pub(crate) fn reason(&self) -> &str {
        match self {
            Status::Ok => "",
            Status::Failed(r) | Status::NotAvailable(r) | Status::Skipped(r) => r,
        }
    }
}
