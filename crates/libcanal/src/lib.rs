//! libcanal (being written).
