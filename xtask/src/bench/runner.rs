//! What every sweep needs: kolo-bench built in release mode, a folder for
//! the raw output, the commands run (under SCHED_FIFO when allowed) with
//! everything they print kept, and the numbers read from kolo-bench's
//! table rows.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The release binaries of kolo-bench.
pub(crate) struct Binaries {
    pub kolo_bench: PathBuf,
    pub memory_floor: PathBuf,
}

/// Builds kolo-bench in release mode with `features` and returns its
/// binaries, wherever the cargo configuration puts them.
pub(crate) fn build_kolo_bench(root: &Path, features: &[&str]) -> Result<Binaries> {
    let mut args = vec!["build", "--release", "-p", "kolo-bench"];
    let joined = features.join(",");
    if !features.is_empty() {
        args.extend(["--features", &joined]);
    }
    args.push("--message-format=json-render-diagnostics");
    eprintln!("xtask: cargo {}", args.join(" "));
    let out = Command::new(cargo())
        .args(&args)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let find = |name: &str| -> Result<PathBuf> {
        executables(&stdout)
            .find(|(target, _)| target == name)
            .map(|(_, path)| path)
            .with_context(|| format!("cargo built no `{name}` binary of kolo-bench"))
    };
    Ok(Binaries {
        kolo_bench: find("kolo-bench")?,
        memory_floor: find("memory-floor")?,
    })
}

/// The (target name, executable) of every binary in cargo's JSON messages.
fn executables(json: &str) -> impl Iterator<Item = (String, PathBuf)> + '_ {
    json.lines()
        .filter(|line| line.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|line| {
            // The first "name" of an artifact message is its target's.
            let name = string_field(line, "name")?;
            let path = string_field(line, "executable")?;
            Some((name, PathBuf::from(path)))
        })
}

/// The string value of the first `"key":"..."` in `line` (cargo writes
/// its JSON without spaces; paths with escapes are not expected).
fn string_field(line: &str, key: &str) -> Option<String> {
    let tag = format!("\"{key}\":\"");
    let start = line.find(&tag)? + tag.len();
    let end = line[start..].find('"')?;
    Some(line[start..start + end].to_string())
}

/// The workspace's target directory (`CARGO_TARGET_DIR` or `target/`),
/// as cargo itself resolves it.
pub(crate) fn target_dir(root: &Path) -> Result<PathBuf> {
    let out = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed ({})", out.status);
    }
    string_field(&String::from_utf8_lossy(&out.stdout), "target_directory")
        .map(PathBuf::from)
        .context("cargo metadata gave no target_directory")
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// One sweep's run: its output folder, the raw log every command's output
/// goes to, and whether commands run under `chrt -f 10`.
pub(crate) struct Session {
    out: PathBuf,
    raw: File,
    realtime: bool,
}

impl Session {
    /// Opens `out` (created if missing; `raw.txt` there replaced). With
    /// `realtime`, commands run under `chrt -f 10` when this user may:
    /// the backend's waits yield the CPU, and under the normal scheduler a
    /// yield hands it to any other runnable process, so a build running
    /// next to the benchmark would be timed with it.
    pub(crate) fn open(out: PathBuf, realtime: bool) -> Result<Session> {
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let raw_path = out.join("raw.txt");
        let raw = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&raw_path)
            .with_context(|| format!("creating {}", raw_path.display()))?;
        let realtime = realtime
            && Command::new("chrt")
                .args(["-f", "10", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        let mut session = Session { out, raw, realtime };
        let scheduler = if session.realtime {
            "SCHED_FIFO 10"
        } else {
            "default"
        };
        session.say(&machine())?;
        session.say(&format!("# scheduler: {scheduler}"))?;
        Ok(session)
    }

    /// Prints `line` and keeps it in the raw log.
    pub(crate) fn say(&mut self, line: &str) -> Result<()> {
        println!("{line}");
        self.log(line)
    }

    fn log(&mut self, text: &str) -> Result<()> {
        writeln!(self.raw, "{text}").context("writing raw.txt")
    }

    /// Runs `program args` (under `chrt -f 10` when the session is
    /// real-time) and returns its stdout; the command line, its stdout
    /// and its stderr go to the raw log. A failed run is an error showing
    /// what it printed.
    pub(crate) fn capture(&mut self, program: &Path, args: &[String]) -> Result<String> {
        let mut command = if self.realtime {
            let mut c = Command::new("chrt");
            c.args(["-f", "10"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.args(args);
        let line = command_line(&command);
        let out = command
            .output()
            .with_context(|| format!("running {line}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        self.log(&format!("$ {line}\n{stdout}{stderr}"))?;
        if !out.status.success() {
            bail!("{line} failed ({}):\n{stdout}{stderr}", out.status);
        }
        Ok(stdout)
    }

    /// Runs `command` with its stdout shown as it comes (stderr passes
    /// through) and kept in the raw log and in `file` of the output
    /// folder; returns the stdout.
    pub(crate) fn stream(&mut self, mut command: Command, file: &str) -> Result<String> {
        let line = command_line(&command);
        self.log(&format!("$ {line}"))?;
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {line}"))?;
        let mut stdout = String::new();
        if let Some(pipe) = child.stdout.take() {
            for text in BufReader::new(pipe).lines() {
                let text = text.with_context(|| format!("reading the output of {line}"))?;
                println!("{text}");
                self.log(&text)?;
                stdout.push_str(&text);
                stdout.push('\n');
            }
        }
        let status = child
            .wait()
            .with_context(|| format!("waiting for {line}"))?;
        self.write(file, &stdout)?;
        if !status.success() {
            bail!("{line} failed ({status})");
        }
        Ok(stdout)
    }

    /// Writes `text` to `name` in the output folder.
    pub(crate) fn write(&self, name: &str, text: &str) -> Result<()> {
        let path = self.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Prints the summary, keeps it as `summary.txt` and says where the
    /// raw output is.
    pub(crate) fn finish(mut self, summary: &str) -> Result<()> {
        println!("\n{summary}");
        self.log(&format!("\n{summary}"))?;
        self.write("summary.txt", &format!("{summary}\n"))?;
        eprintln!("xtask: raw output in {}", self.out.display());
        Ok(())
    }
}

/// The machine, as a comment line: host name, cores, load average (the
/// numbers depend on all three).
fn machine() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let host = read("/proc/sys/kernel/hostname");
    let load = read("/proc/loadavg");
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "# host {}: {cores} cores, load average {}",
        host.trim(),
        load.join(" ")
    )
}

fn command_line(command: &Command) -> String {
    let mut parts = vec![command.get_program().to_string_lossy().into_owned()];
    parts.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Column `column` (0-based) of the table row for `bytes` in `stdout`
/// (kolo-bench's, memory-floor's and the MPI baseline's rows begin with
/// the size in bytes; comment lines begin with `#`).
pub(crate) fn row_value(stdout: &str, bytes: usize, column: usize) -> Option<f64> {
    stdout
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.first().and_then(|f| f.parse::<usize>().ok()) == Some(bytes))
        .and_then(|fields| fields.get(column)?.parse().ok())
}

/// The time column of kolo-bench's row for `bytes` (µs), or an error
/// showing what `what` printed instead.
pub(crate) fn time_us(stdout: &str, bytes: usize, what: &str) -> Result<f64> {
    row_value(stdout, bytes, 4)
        .with_context(|| format!("{what} printed no row of {bytes} B:\n{stdout}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
# allreduce: threads backend, 2 ranks, kolo engine, 1000 tensor(s) per step
#       size         count   type   redop        time    algbw    busbw  #wrong
#        (B)    (elements)                       (us)   (GB/s)   (GB/s)
     4096000       1024000    f32     sum      371.25   11.033   11.033       0
#   per step (rank 0): 1.00 data-plane operations carrying 1000.0 tensors
";

    #[test]
    fn rows_are_found_by_size() {
        assert_eq!(row_value(TABLE, 4096000, 4), Some(371.25));
        assert_eq!(row_value(TABLE, 4096000, 6), Some(11.033));
        assert_eq!(row_value(TABLE, 4, 4), None);
        assert_eq!(row_value(TABLE, 4096000, 9), None);
        let err = time_us(TABLE, 8, "kolo-bench").unwrap_err().to_string();
        assert!(err.starts_with("kolo-bench printed no row of 8 B"), "{err}");
    }

    #[test]
    fn cargo_messages_name_the_binaries() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/benches/kolo-bench#0.1.0","#,
            r#""target":{"kind":["bin"],"name":"memory-floor"},"executable":"/t/release/memory-floor","fresh":true}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"kolo_bench"},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        let found: Vec<_> = executables(json).collect();
        assert_eq!(
            found,
            [(
                "memory-floor".to_string(),
                PathBuf::from("/t/release/memory-floor")
            )]
        );
    }
}
