//! Rank 0's output while a sweep runs: each op's table on stdout, row by
//! row as sizes complete, and a `\r`-updated progress line on stderr.

use crate::error::BenchError;
use crate::op::BenchOp;
use crate::row::{table_header, table_line, table_title, Row, RunInfo};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Prints the table as it grows. Shared by the ranks of a process; only
/// rank 0 calls it.
#[derive(Debug)]
pub struct Reporter {
    table: bool,
    progress: bool,
    progress_shown: AtomicBool,
}

impl Reporter {
    /// `table`: print the rows on stdout; `progress`: show the progress line
    /// on stderr (meant for terminals).
    pub fn new(table: bool, progress: bool) -> Reporter {
        Reporter {
            table,
            progress,
            progress_shown: AtomicBool::new(false),
        }
    }

    /// A reporter that prints nothing.
    pub fn silent() -> Reporter {
        Reporter::new(false, false)
    }

    /// Opens the table of `op`.
    pub fn begin_op(&self, op: BenchOp, info: &RunInfo, ranks: usize) -> Result<(), BenchError> {
        self.print(&format!(
            "{}\n{}",
            table_title(op, info, ranks),
            table_header()
        ))
    }

    /// Shows that `op` is now measuring `bytes`, the `index`-th of `total`
    /// sizes.
    pub fn progress(&self, op: BenchOp, bytes: usize, index: usize, total: usize) {
        if !self.progress {
            return;
        }
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop the run.
        let _ = write!(err, "\r\x1b[K{op}: {bytes} B ({}/{total})", index + 1);
        let _ = err.flush();
        self.progress_shown.store(true, Ordering::Relaxed);
    }

    /// Prints one finished row (clearing the progress line first).
    pub fn row(&self, row: &Row) -> Result<(), BenchError> {
        self.clear_progress();
        self.print(&table_line(row))
    }

    /// Clears the progress line, if one is shown.
    pub fn clear_progress(&self) {
        if self.progress_shown.swap(false, Ordering::Relaxed) {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }

    /// Prints `text` and a newline on stdout when the table is on.
    pub fn print(&self, text: &str) -> Result<(), BenchError> {
        if !self.table {
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "{text}")
            .and_then(|()| out.flush())
            .map_err(|source| BenchError::Output {
                path: "stdout".to_string(),
                source,
            })
    }
}

/// Writes `line` to stderr in one write: under mpirun every rank's stderr
/// is merged, and a line written in pieces interleaves with another
/// rank's.
pub fn say(line: &str) {
    let mut bytes = line.as_bytes().to_vec();
    bytes.push(b'\n');
    // Nothing is left to tell the user if stderr itself is gone.
    let _ = std::io::stderr().lock().write_all(&bytes);
}
