//! canald (being written).
