//! How much memory this host will still give a process: the kernel's
//! `MemAvailable` (`/proc/meminfo`), lowered to what the process's memory
//! cgroup still allows (v2 `memory.max`, v1 `memory.limit_in_bytes`, for
//! its cgroup and every ancestor) when that is less.
//!
//! Fallbacks: a kernel without `MemAvailable` (before Linux 3.14) is read
//! as `MemFree + Buffers + Cached`; a cgroup's usage counts its inactive
//! file pages (`inactive_file` in `memory.stat`) as free, since the kernel
//! reclaims them before it fails an allocation. Where none of these can
//! be read (not Linux, `/proc` not mounted), nothing is known: the check
//! is skipped and only the allocator's refusal guards the run.

use std::fs;
use std::path::{Path, PathBuf};

/// Bytes a process may still allocate, and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    /// `MemAvailable in /proc/meminfo`, `cgroup /sys/fs/cgroup/...`, ...
    pub source: String,
}

/// Where the figures are read: `/proc` and `/sys/fs/cgroup`, or a copy of
/// them (tests).
#[derive(Clone, Debug)]
pub struct Probe {
    pub proc_root: PathBuf,
    pub cgroup_root: PathBuf,
}

impl Default for Probe {
    fn default() -> Probe {
        Probe {
            proc_root: PathBuf::from("/proc"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

impl Probe {
    /// The least of what the host and this process's memory cgroups allow;
    /// `None` when nothing could be read.
    pub fn available(&self) -> Option<Available> {
        let host = fs::read_to_string(self.proc_root.join("meminfo"))
            .ok()
            .and_then(|text| meminfo_available(&text));
        let cgroups = fs::read_to_string(self.proc_root.join("self/cgroup"))
            .map(|text| self.cgroup_rooms(&text))
            .unwrap_or_default();
        host.into_iter().chain(cgroups).min_by_key(|a| a.bytes)
    }

    /// The room left in this process's memory cgroup and each ancestor.
    fn cgroup_rooms(&self, self_cgroup: &str) -> Vec<Available> {
        let mut rooms = Vec::new();
        for (version, path) in cgroup_paths(self_cgroup) {
            let (mount, limit, usage) = match version {
                2 => (self.cgroup_root.clone(), "memory.max", "memory.current"),
                _ => (
                    self.cgroup_root.join("memory"),
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                ),
            };
            for dir in ancestors(&mount, &path) {
                let read = |name: &str| fs::read_to_string(dir.join(name)).ok();
                let (Some(limit), Some(usage)) = (read(limit), read(usage)) else {
                    continue;
                };
                let stat = read("memory.stat").unwrap_or_default();
                if let Some(bytes) = cgroup_room(&limit, &usage, &stat) {
                    rooms.push(Available {
                        bytes,
                        source: format!("the memory cgroup {}", dir.display()),
                    });
                }
            }
        }
        rooms
    }
}

/// What `/proc/meminfo` says is available: `MemAvailable`, or
/// `MemFree + Buffers + Cached` on kernels without it.
pub fn meminfo_available(meminfo: &str) -> Option<Available> {
    let field = |name: &str| {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    if let Some(bytes) = field("MemAvailable") {
        return Some(Available {
            bytes,
            source: "MemAvailable in /proc/meminfo".into(),
        });
    }
    let bytes = field("MemFree")?
        .checked_add(field("Buffers")?)?
        .checked_add(field("Cached")?)?;
    Some(Available {
        bytes,
        source: "MemFree + Buffers + Cached in /proc/meminfo".into(),
    })
}

/// The room a cgroup leaves: its limit minus its usage, not counting
/// inactive file pages; `None` without a limit (`max`).
pub fn cgroup_room(limit: &str, usage: &str, stat: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok()?;
    let usage: u64 = usage.trim().parse().ok()?;
    let reclaimable = stat
        .lines()
        .find_map(|line| {
            let value = line.strip_prefix("inactive_file ")?;
            value.trim().parse::<u64>().ok()
        })
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(reclaimable)))
}

/// This process's memory cgroups from `/proc/self/cgroup`: `(2, path)` for
/// the unified hierarchy (`0::/path`), `(1, path)` for a v1 `memory` line.
pub fn cgroup_paths(self_cgroup: &str) -> Vec<(u8, String)> {
    self_cgroup
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            if id == "0" && controllers.is_empty() {
                Some((2, path.to_string()))
            } else if controllers.split(',').any(|c| c == "memory") {
                Some((1, path.to_string()))
            } else {
                None
            }
        })
        .collect()
}

/// `mount/path` and each of its parents down to `mount` itself.
fn ancestors(mount: &Path, path: &str) -> Vec<PathBuf> {
    let mut dirs = vec![mount.to_path_buf()];
    let mut dir = mount.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
        dir.push(part);
        dirs.push(dir.clone());
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_with_and_without_mem_available() {
        let new = "MemTotal:       24683584 kB\nMemFree:  100 kB\nMemAvailable:   22842376 kB\n";
        let got = meminfo_available(new).unwrap();
        assert_eq!(got.bytes, 22842376 * 1024);
        assert!(got.source.contains("MemAvailable"));
        let old = "MemFree: 10 kB\nBuffers: 2 kB\nCached: 3 kB\n";
        let got = meminfo_available(old).unwrap();
        assert_eq!(got.bytes, 15 * 1024);
        assert!(got.source.contains("MemFree"));
        assert_eq!(meminfo_available("MemTotal: 1 kB\n"), None);
        assert_eq!(meminfo_available("MemAvailable: lots\n"), None);
    }

    #[test]
    fn cgroup_room_counts_inactive_files_as_free() {
        assert_eq!(
            cgroup_room("1000\n", "600\n", "inactive_file 100\n"),
            Some(500)
        );
        assert_eq!(cgroup_room("1000", "1600", ""), Some(0));
        assert_eq!(cgroup_room("max\n", "600", ""), None);
        let stat = "active_file 5\ninactive_file 700\n";
        assert_eq!(cgroup_room("1000", "600", stat), Some(1000));
    }

    #[test]
    fn cgroup_lines_of_both_versions() {
        let text = "4:memory:/process_api/875d\n3:cpuset:/\n0::/user.slice\n";
        assert_eq!(
            cgroup_paths(text),
            vec![
                (1, "/process_api/875d".to_string()),
                (2, "/user.slice".to_string())
            ]
        );
        assert_eq!(cgroup_paths("garbage"), vec![]);
    }

    #[test]
    fn the_least_figure_wins_and_names_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_root, cgroup_root) = (dir.path().join("proc"), dir.path().join("cg"));
        let job = cgroup_root.join("jobs/one");
        fs::create_dir_all(proc_root.join("self")).unwrap();
        fs::create_dir_all(&job).unwrap();
        fs::write(proc_root.join("meminfo"), "MemAvailable: 1000 kB\n").unwrap();
        fs::write(proc_root.join("self/cgroup"), "0::/jobs/one\n").unwrap();
        fs::write(cgroup_root.join("memory.max"), "max\n").unwrap();
        fs::write(cgroup_root.join("memory.current"), "5\n").unwrap();
        fs::write(job.join("memory.max"), "4096\n").unwrap();
        fs::write(job.join("memory.current"), "1024\n").unwrap();
        let probe = Probe {
            proc_root,
            cgroup_root,
        };
        let got = probe.available().unwrap();
        assert_eq!(got.bytes, 3072);
        assert!(got.source.contains("jobs/one"), "{}", got.source);
        fs::write(job.join("memory.max"), "max\n").unwrap();
        let got = probe.available().unwrap();
        assert_eq!(got.bytes, 1000 * 1024);
        let nowhere = Probe {
            proc_root: dir.path().join("none"),
            cgroup_root: dir.path().join("none"),
        };
        assert_eq!(nowhere.available(), None);
    }
}
