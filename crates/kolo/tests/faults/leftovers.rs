//! Processes a job left behind: `kolo_run::run_captured` starts each rank
//! as the leader of its own process group, so anything still in one of
//! those groups once every rank was reaped is a leftover (a helper a rank
//! started, or a rank that escaped its wait).

use std::time::{Duration, Instant};

/// How long leftovers get to finish exiting (a child of a rank that just
/// died may be on its way out).
const GRACE: Duration = Duration::from_secs(2);

/// The processes (pid, command name) in any of `groups` that are not
/// zombies, after waiting up to [`GRACE`] for them to go. Those found are
/// killed (they are this test's), and returned for the report.
pub fn leftovers(groups: &[u32]) -> Vec<(u32, String)> {
    let deadline = Instant::now() + GRACE;
    loop {
        let found = in_groups(groups);
        if found.is_empty() || Instant::now() >= deadline {
            for (pid, _) in &found {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
            }
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every live process whose group is one of `groups`, from `/proc`.
fn in_groups(groups: &[u32]) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((name, state, group)) = parse_stat(&stat) {
            if state != 'Z' && groups.contains(&group) {
                found.push((pid, name.to_owned()));
            }
        }
    }
    found
}

/// The command name, state and process group of a `/proc/PID/stat` line
/// (`pid (comm) state ppid pgrp ...`; the name may hold spaces and
/// parentheses, so the fields after it start at the last `)`).
fn parse_stat(stat: &str) -> Option<(&str, char, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let mut fields = stat.get(close + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((name, state, group))
}
