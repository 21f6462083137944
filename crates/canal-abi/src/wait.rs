//! How a waiting side (canald's pollers, a guest's threads) waits for work: one setting
//! shared by canald (`--notify`) and the guest library (`CANAL_NOTIFY`).

/// The notification mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NotifyMode {
    /// Never sleeps: spins forever (measurement only — it burns a core).
    Poll,
    /// Sleeps as soon as there is nothing to do (no spinning).
    Sleep,
    /// Spins for an adaptive budget, then sleeps (the default).
    #[default]
    Hybrid,
}

impl NotifyMode {
    /// `poll`, `sleep` or `hybrid`.
    pub fn parse(s: &[u8]) -> Option<NotifyMode> {
        match s {
            b"poll" => Some(NotifyMode::Poll),
            b"sleep" => Some(NotifyMode::Sleep),
            b"hybrid" => Some(NotifyMode::Hybrid),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NotifyMode::Poll => "poll",
            NotifyMode::Sleep => "sleep",
            NotifyMode::Hybrid => "hybrid",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in [NotifyMode::Poll, NotifyMode::Sleep, NotifyMode::Hybrid] {
            assert_eq!(NotifyMode::parse(m.name().as_bytes()), Some(m));
        }
        assert_eq!(NotifyMode::parse(b"spin"), None);
        assert_eq!(NotifyMode::default(), NotifyMode::Hybrid);
    }
}
