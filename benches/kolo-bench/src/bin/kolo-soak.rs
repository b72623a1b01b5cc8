//! `kolo-soak`: random operations through kolo's engine for a given time,
//! every result checked (see `kolo_bench::soak`). On thread ranks in this
//! process (`--ranks`), or as one rank of a job started by kolo-run or
//! torchrun (the launcher's variables pick the backend, as `Kolo::init`
//! does):
//!
//! ```text
//! kolo-soak --ranks 8 --seconds 60
//! kolo-run -n 4 kolo-soak --seconds 60
//! ```
//!
//! Rank 0 prints one summary line; the exit status is non-zero when a
//! result was wrong, an operation failed, or (runs of 10 minutes or more)
//! the mean resident memory of the last five minutes, sampled after every
//! rank released its fusion buffers, is not within 5% of that of minutes
//! five to ten. (The samples with the buffers follow the sizes the last
//! steps fused; `--print-rss` prints both.)

use clap::Parser;
use kolo_bench::soak::{soak_rank, SoakOptions, SoakReport};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "kolo-soak", version)]
struct Args {
    /// Thread ranks in this process (ignored under a launcher).
    #[arg(long, default_value_t = 8)]
    ranks: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// The seed of the random plan.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The largest tensor in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    max_bytes: usize,
    /// Also print rank 0's resident-memory samples (seconds, MiB).
    #[arg(long)]
    print_rss: bool,
}

/// The change of the mean resident memory (after the release of the
/// fusion buffers) of the last five minutes over minutes five to ten, if
/// the run was long enough to tell.
fn growth(report: &SoakReport, seconds: f64) -> Option<f64> {
    if seconds < 600.0 {
        return None;
    }
    let mean = |from: f64, to: f64| {
        let v: Vec<f64> = report
            .rss
            .iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|&(_, kib)| kib as f64)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    Some(mean(seconds - 300.0, f64::INFINITY)? / mean(300.0, 600.0)? - 1.0)
}

fn main() -> ExitCode {
    kolo_bench::soak::settle_allocator();
    let args = Args::parse();
    let config = match kolo::Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("kolo-soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    kolo::init_logging(config.log_level);
    let options = SoakOptions {
        duration: Duration::from_secs_f64(args.seconds.max(0.0)),
        seed: args.seed,
        max_bytes: args.max_bytes,
        sample_every: Duration::from_secs(10),
    };
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    let reports = if launched {
        kolo::Kolo::init(config).and_then(|kolo| {
            let report = soak_rank(&kolo, &options);
            kolo.shutdown()?;
            Ok(vec![report?])
        })
    } else {
        kolo::threads::run(args.ranks, config, |kolo| soak_rank(kolo, &options))
    };
    let reports = match reports {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("kolo-soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    let wrong: u64 = reports.iter().map(|r| r.wrong).sum();
    let first = &reports[0];
    let rss = |r: &SoakReport| r.rss.last().map_or(0, |&(_, kib)| kib >> 10);
    let growth = growth(first, args.seconds);
    if first.rss.is_empty() && wrong == 0 {
        // Not rank 0 of a launched job: rank 0 reports.
        return ExitCode::SUCCESS;
    }
    println!(
        "soak: {} steps, {} operations on each rank, {wrong} wrong, resident {} MiB at the end{}",
        first.steps,
        first.operations,
        rss(first),
        growth.map_or(String::new(), |g| format!(
            ", last 5 min {:+.1}% against minutes 5-10 (without fusion buffers)",
            g * 100.0
        ))
    );
    if args.print_rss {
        let samples: Vec<String> = first
            .rss
            .iter()
            .map(|&(t, kib)| format!("{t:.0}s {} MiB", kib >> 10))
            .collect();
        println!(
            "soak: resident memory after releasing the fusion buffers: {}",
            samples.join(", ")
        );
        let cached: Vec<String> = first
            .rss_cached
            .iter()
            .map(|&kib| format!("{} MiB", kib >> 10))
            .collect();
        println!("soak: resident memory before: {}", cached.join(", "));
        let heap: Vec<String> = first
            .heap
            .iter()
            .map(|&kib| format!("{:.1} MiB", kib as f64 / 1024.0))
            .collect();
        println!("soak: live heap after releasing: {}", heap.join(", "));
        // The fusion buffers of this process's ranks together, per sample.
        let fusion: Vec<String> = (0..first.fusion_kib.len())
            .map(|i| {
                let kib: u64 = reports.iter().filter_map(|r| r.fusion_kib.get(i)).sum();
                format!("{} MiB", kib >> 10)
            })
            .collect();
        println!("soak: fusion buffers: {}", fusion.join(", "));
    }
    for r in &reports {
        if let Some(what) = &r.first_wrong {
            eprintln!("kolo-soak: first wrong result: {what}");
        }
    }
    if wrong > 0 || growth.is_some_and(|g| g.abs() > 0.05) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
