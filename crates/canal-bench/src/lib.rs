//! Benchmark harness (issue 4). Entry point used by `canal bench`.
pub fn cli_main(_args: Vec<String>) -> i32 {
    eprintln!("canal bench: not built yet");
    2
}
