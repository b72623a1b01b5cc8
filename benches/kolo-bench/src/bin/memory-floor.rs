//! `memory-floor`: the memory floor of an in-place allreduce on thread
//! ranks (see `kolo_bench::floor`), to set next to kolo-bench's numbers.
//!
//! ```text
//! memory-floor --ranks 2 --bytes 4000K --run 4K
//! ```

use clap::Parser;
use kolo_bench::floor::{measure, FloorSpec};
use kolo_bench::size::parse_size;
use kolo_bench::stats::median;
use std::process::ExitCode;

/// The least memory traffic an in-place allreduce of thread ranks moves,
/// with no library: each rank adds its chunk of every peer's buffer into
/// its own, run by run, and copies the sum into every peer's.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Thread ranks.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Bytes per rank's buffer (f32 elements; K, M, G suffixes).
    #[arg(long, default_value = "4000K", value_parser = parse_size)]
    bytes: usize,
    /// Bytes per run (kolo-threads cuts its chunk into blocks of 8 KiB,
    /// and at segment ends: 4 KiB for kolo-bench's 1,000 x 4 KiB step).
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    run: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 10)]
    warmup: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let spec = FloorSpec {
        ranks: args.ranks,
        bytes: args.bytes,
        run_bytes: args.run,
        iters: args.iters,
        warmup: args.warmup,
    };
    match measure(&spec) {
        Ok(floor) if floor.wrong > 0 => {
            eprintln!("memory-floor: {} elements were wrong", floor.wrong);
            ExitCode::FAILURE
        }
        Ok(floor) => {
            let us = median(&floor.times_us).unwrap_or(f64::NAN);
            println!(
                "# memory floor: {} ranks, {} B per rank, runs of {} B, {} steps",
                spec.ranks, spec.bytes, spec.run_bytes, spec.iters
            );
            println!("{:>12} {:>12}", "size (B)", "time (us)");
            println!("{:>12} {:>12.2}", spec.bytes, us);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("memory-floor: {e}");
            ExitCode::FAILURE
        }
    }
}
