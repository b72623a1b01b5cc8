//! `kolo-rendezvous-check`: joins the job its launcher describes (see
//! `kolo_rendezvous::LaunchVars`), exchanges each rank's host name with
//! every other rank, prints one line, and leaves. A check that a
//! launcher's variables, the network between hosts and the token let a
//! job's processes meet: `kolo-run -n 4 kolo-rendezvous-check`.

use kolo_rendezvous::Rendezvous;
use std::process::ExitCode;

fn main() -> ExitCode {
    match check() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kolo-rendezvous-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check() -> kolo_rendezvous::Result<String> {
    let mut rendezvous = Rendezvous::from_env()?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    let all = rendezvous.allgather("host", host.as_bytes())?;
    let line = format!(
        "rank {} of {} (local {} of {}) met {} ranks on {}",
        rendezvous.rank(),
        rendezvous.world_size(),
        rendezvous.local_rank(),
        rendezvous.local_world_size(),
        all.len(),
        hosts(&all)
    );
    rendezvous.close()?;
    Ok(line)
}

/// The distinct host names among `all`.
fn hosts(all: &[Vec<u8>]) -> String {
    let mut names: Vec<String> = all
        .iter()
        .map(|h| String::from_utf8_lossy(h).into_owned())
        .collect();
    names.sort();
    names.dedup();
    names.join(", ")
}
