//! `cargo xtask bench plain-async`: the API's plain asynchronous call
//! against the backend's direct call, in the same run. One tensor per
//! step, one size (16 MiB unless told), 2 ranks: kolo-bench in direct
//! mode and in engine mode (one `Scope::allreduce_async`, reduced in
//! place), alternating round by round, on the threads backend and, under
//! `mpirun -np 2`, on MPI (kolo-bench built with the `mpi` feature). The
//! summary gives each backend's medians and the median of the per-round
//! ratios engine / direct.

use super::flags::{Flag, Flags, NO_RT, OUT};
use super::runner::{build_kolo_bench, time_us, Session};
use super::stats::{median, median_ratio};
use super::Sweep;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

pub(crate) const SWEEP: Sweep = Sweep {
    name: "plain-async",
    about: "one tensor through the engine's plain async call against the direct backend call, threads and MPI",
    flags: &[
        Flag {
            name: "--bytes",
            value: Some("SIZE"),
            help: "the tensor's size, K/M/G suffixes (default 16M)",
        },
        Flag {
            name: "--rounds",
            value: Some("N"),
            help: "interleaved rounds per backend (default 12)",
        },
        Flag {
            name: "--no-mpi",
            value: None,
            help: "only the threads backend",
        },
        NO_RT,
        OUT,
    ],
    run,
};

/// kolo-bench's timing of each run.
const TIMING: [&str; 4] = ["--iters", "30", "--warmup", "5"];

fn run(root: &Path, flags: &Flags, out: PathBuf) -> Result<()> {
    let size: String = flags.value("--bytes", "16M".to_string())?;
    let bytes = parse_size(&size).with_context(|| format!("--bytes {size}"))?;
    let rounds = flags.count("--rounds", 12)?;
    let mpi = !flags.switch("--no-mpi");
    let bench = build_kolo_bench(root, if mpi { &["mpi"] } else { &[] })?.kolo_bench;
    let mut session = Session::open(out, !flags.switch("--no-rt"))?;
    let sized = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["--min-bytes", &size, "--max-bytes", &size]
            .iter()
            .chain(&TIMING)
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        args.push("--no-check".into());
        args
    };
    let mut lines = Vec::new();
    let mut backends: Vec<(&str, PathBuf, Vec<String>)> = vec![(
        "threads",
        bench.clone(),
        vec!["--ranks".to_string(), "2".to_string()],
    )];
    if mpi {
        let mpirun = PathBuf::from("mpirun");
        let mut prefix: Vec<String> = ["--allow-run-as-root", "--oversubscribe", "-np", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        prefix.push(bench.display().to_string());
        prefix.extend(["--backend".to_string(), "mpi".to_string()]);
        backends.push(("mpi", mpirun, prefix));
    }
    for (name, program, prefix) in backends {
        session.say(&format!("# {name}: round, direct, engine (us)"))?;
        let (mut direct, mut engine) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let mut args = prefix.clone();
            args.extend(sized(&[]));
            let d = time_us(&session.capture(&program, &args)?, bytes, "kolo-bench")?;
            let mut args = prefix.clone();
            args.extend(sized(&["--engine"]));
            let e = time_us(&session.capture(&program, &args)?, bytes, "kolo-bench")?;
            session.say(&format!("{round} {d:.1} {e:.1}"))?;
            direct.push(d);
            engine.push(e);
        }
        lines.push(summary(name, bytes, &direct, &engine));
    }
    session.finish(&lines.join("\n"))
}

/// One backend's line of the summary.
fn summary(name: &str, bytes: usize, direct: &[f64], engine: &[f64]) -> String {
    format!(
        "{name}: {bytes} B, direct {:.1} us, engine (plain async) {:.1} us, engine / direct {:.3} (median of {} rounds)",
        median(direct),
        median(engine),
        median_ratio(direct, engine),
        direct.len()
    )
}

/// Bytes in `text`: digits with an optional 1024-based K, M or G.
fn parse_size(text: &str) -> Option<usize> {
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 10),
        b'M' | b'm' => (&text[..text.len() - 1], 20),
        b'G' | b'g' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("16M"), Some(16 << 20));
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn the_summary_is_the_median_ratio() {
        let line = summary(
            "threads",
            16,
            &[100.0, 200.0, 300.0],
            &[110.0, 200.0, 360.0],
        );
        assert!(line.contains("direct 200.0 us, engine (plain async) 200.0 us"));
        assert!(line.contains("engine / direct 1.100"), "{line}");
    }
}
