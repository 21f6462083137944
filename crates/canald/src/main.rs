//! `canald [OPTIONS]`: the canal host service in the foreground (`canald --help`).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    let code = canald::cli_main();
    std::process::ExitCode::from(code.clamp(0, 255) as u8)
}
