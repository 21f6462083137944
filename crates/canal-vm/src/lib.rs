//! VM harness (issue 6). Entry point used by `canal vm`.
pub fn cli_main(_args: Vec<String>) -> i32 {
    eprintln!("canal vm: not built yet");
    2
}
