//! kolo-run from Python: `python -m kolo.run -n 4 train.py` (the same
//! launcher as the `kolo-run` binary, with torchrun's variables), and
//! `run_job` for tests and tools that check what each rank printed.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::Path;
use std::time::Duration;

/// What one rank of [`run_job`] did: its rank, exit code (None: killed
/// at the timeout or by a signal), stdout and stderr.
type RankResult = (usize, Option<i32>, String, String);

/// Runs `argv` as `ranks` processes of a job on this host with `env`
/// added; returns `(rank, exit code or None, stdout, stderr)` per rank,
/// killing those still running after `timeout` seconds.
#[pyfunction]
#[pyo3(signature = (ranks, argv, env=Vec::new(), timeout=300.0))]
pub(crate) fn run_job(
    py: Python<'_>,
    ranks: usize,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    timeout: f64,
) -> PyResult<Vec<RankResult>> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| PyValueError::new_err("run_job: an empty command"))?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bound = Duration::from_secs_f64(timeout.clamp(0.0, 86_400.0));
    let outputs = py
        .detach(|| kolo_run::run_captured(ranks, Path::new(program), &args, &env, bound))
        .map_err(PyValueError::new_err)?;
    Ok(outputs
        .into_iter()
        .map(|r| {
            let code = r.status.and_then(|s| s.code());
            (r.rank, code, r.stdout, r.stderr)
        })
        .collect())
}

/// Starts `program` as `nproc_per_node` processes of this host (of
/// `nnodes`), watches them, and returns the launcher's exit code (0: all
/// succeeded; otherwise it names the rank that failed on stderr).
#[pyfunction]
#[pyo3(signature = (program, nproc_per_node=1, nnodes=1, node_rank=0,
    master_addr="127.0.0.1".to_owned(), master_port=kolo_rendezvous::DEFAULT_PORT, token=None, grace=10.0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    py: Python<'_>,
    program: Vec<String>,
    nproc_per_node: usize,
    nnodes: usize,
    node_rank: usize,
    master_addr: String,
    master_port: u16,
    token: Option<String>,
    grace: f64,
) -> PyResult<u8> {
    let token = token.or_else(|| std::env::var("KOLO_RENDEZVOUS_TOKEN").ok());
    let plan = kolo_run::plan::Plan::new(
        nproc_per_node,
        nnodes,
        node_rank,
        &master_addr,
        master_port,
        token,
    )
    .map_err(|why| PyValueError::new_err(format!("kolo-run: {why}")))?;
    let grace = Duration::from_secs_f64(grace.clamp(0.0, 3600.0));
    Ok(
        py.detach(|| match kolo_run::launch::run(&plan, &program, grace) {
            Ok(()) => 0,
            Err(failure) => {
                eprintln!("kolo-run: {failure}");
                failure.code()
            }
        }),
    )
}
