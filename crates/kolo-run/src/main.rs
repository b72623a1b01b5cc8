//! `kolo-run`: starts the processes of a kolo job on this host with the
//! variables torchrun sets (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, ...), so
//! that a program runs under either launcher, and watches them: when one
//! fails (a non-zero exit, a signal) the others are stopped and
//! `kolo-run` exits non-zero naming the rank.
//!
//! ```text
//! kolo-run -n 4 ./train --backend ucx
//! kolo-run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 -n 8 ./train
//! ```

use clap::Parser;
use kolo_run::{launch, plan};
use std::process::ExitCode;

/// Starts `-n` processes of `PROGRAM` on this host as ranks of a job of
/// `--nnodes` hosts, with torchrun's variables.
#[derive(Debug, Parser)]
#[command(name = "kolo-run", version, trailing_var_arg = true)]
struct Args {
    /// Processes on this host (torchrun's --nproc-per-node).
    #[arg(short = 'n', long = "nproc-per-node", default_value_t = 1)]
    nproc_per_node: usize,
    /// Hosts in the job.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This host's place among them, from 0.
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// The host of rank 0 (which serves the rendezvous store).
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
    /// Its port; 0 picks a free one (one host only).
    #[arg(long, default_value_t = kolo_rendezvous::DEFAULT_PORT)]
    master_port: u16,
    /// The job's token (KOLO_RENDEZVOUS_TOKEN); the same on every host.
    /// Default: the environment's, or a random one on a single host.
    #[arg(long)]
    token: Option<String>,
    /// Seconds to wait, once one process failed, before killing the
    /// others that did not stop.
    #[arg(long, default_value_t = 10.0)]
    grace: f64,
    /// The program and its arguments.
    #[arg(required = true)]
    program: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = match plan::Plan::new(
        args.nproc_per_node,
        args.nnodes,
        args.node_rank,
        &args.master_addr,
        args.master_port,
        args.token
            .or_else(|| std::env::var("KOLO_RENDEZVOUS_TOKEN").ok()),
    ) {
        Ok(plan) => plan,
        Err(why) => {
            eprintln!("kolo-run: {why}");
            return ExitCode::from(2);
        }
    };
    let grace = std::time::Duration::from_secs_f64(args.grace.clamp(0.0, 3600.0));
    match launch::run(&plan, &args.program, grace) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("kolo-run: {failure}");
            ExitCode::from(failure.code())
        }
    }
}
