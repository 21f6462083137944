//! `canal-bench-gen`: blocking-socket ping-pong and stream generator (see canal_bench::gen).
use std::process::ExitCode;

fn main() -> ExitCode {
    let g = match canal_bench::gen::parse_args(std::env::args().skip(1)) {
        Ok(g) => g,
        Err(e) => e.exit(),
    };
    match canal_bench::gen::run(&g) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("canal-bench-gen: {e}");
            ExitCode::FAILURE
        }
    }
}
