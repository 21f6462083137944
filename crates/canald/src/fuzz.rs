//! Fuzz entry point for the request consumer (placeholder filled below).
#![forbid(unsafe_code)]
