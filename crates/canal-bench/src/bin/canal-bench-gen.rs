//! `canal-bench-gen`: blocking-socket ping-pong and stream generator (see canal_bench::gen).
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args[0] == "-h" || args[0] == "--help" {
        println!("{}", canal_bench::gen::USAGE);
        return ExitCode::from(if args.is_empty() { 2 } else { 0 });
    }
    let g = match canal_bench::gen::parse_args(&args) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("canal-bench-gen: {e}\n{}", canal_bench::gen::USAGE);
            return ExitCode::from(2);
        }
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
