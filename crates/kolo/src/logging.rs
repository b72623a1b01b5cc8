//! Printing kolo's log events (`KOLO_LOG_LEVEL`) from a binary.
//!
//! kolo logs through `tracing` and, as a library, never installs a
//! subscriber itself: an application that has one sees kolo's events there.
//! A binary without one calls [`init_logging`] once.

use crate::config::LogLevel;

/// Installs a `tracing` subscriber that prints events at `level` and above
/// to stderr (e.g. `kolo::init_logging(config.log_level)` for
/// `KOLO_LOG_LEVEL`), in colour only when stderr is a terminal (a log
/// file or a pipe gets plain text). Returns false, changing nothing, when
/// the process already has a global subscriber.
pub fn init_logging(level: LogLevel) -> bool {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_max_level(level.filter())
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init()
        .is_ok()
}
