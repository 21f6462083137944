//! `canald [--socket PATH] ...`: the canal host service in the foreground.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    let code = canald::cli_main(std::env::args().skip(1).collect());
    std::process::ExitCode::from(code.clamp(0, 255) as u8)
}
