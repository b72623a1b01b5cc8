//! The `kolo-bench` command: see `kolo-bench --help` and the library docs.

use clap::Parser;
use kolo_bench::cli::Args;
use kolo_bench::report::Reporter;
use std::io::IsTerminal;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    let progress = !args.quiet && std::io::stderr().is_terminal();
    let reporter = Reporter::new(true, progress);
    match kolo_bench::run(&args, &reporter) {
        Ok(rows) if rows.iter().any(|r| r.wrong.is_some_and(|w| w > 0)) => {
            eprintln!("kolo-bench: some results were wrong (see #wrong)");
            ExitCode::FAILURE
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            reporter.clear_progress();
            eprintln!("kolo-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
