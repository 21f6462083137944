//! Shared-memory ABI (being written).
