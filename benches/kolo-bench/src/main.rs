//! The `kolo-bench` command: see `kolo-bench --help` and the library docs.

use clap::Parser;
use kolo_bench::cli::Args;
use kolo_bench::error::BenchError;
use kolo_bench::report::{say, Reporter};
use std::io::IsTerminal;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    let terminal = std::io::stderr().is_terminal();
    if !terminal && std::env::var_os("NO_COLOR").is_none() {
        // kolo's log lines (tracing-subscriber) are coloured unless
        // NO_COLOR is set (https://no-color.org); escape codes in a file or
        // a pipe (every rank under mpirun) are noise. Set before any
        // thread starts, so nothing reads the environment meanwhile.
        std::env::set_var("NO_COLOR", "1");
    }
    // Stall warnings and the engine's other events reach the user, at
    // KOLO_LOG_LEVEL. A bad KOLO_* value is an error, not a fallback.
    match kolo::Config::from_env() {
        Ok(config) => {
            kolo::init_logging(config.log_level);
        }
        Err(e) => {
            say(&format!("kolo-bench: {e}"));
            return ExitCode::FAILURE;
        }
    }
    let progress = !args.quiet && terminal;
    let reporter = Reporter::new(true, progress);
    match kolo_bench::run(&args, &reporter) {
        Ok(rows) if rows.iter().any(|r| r.wrong.is_some_and(|w| w > 0)) => {
            say("kolo-bench: some results were wrong (see #wrong)");
            ExitCode::FAILURE
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(BenchError::Said(_)) => ExitCode::FAILURE,
        Err(e) => {
            reporter.clear_progress();
            say(&format!("kolo-bench: {e}"));
            ExitCode::FAILURE
        }
    }
}
