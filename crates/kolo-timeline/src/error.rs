//! The errors of the timeline.

use std::io;
use std::path::PathBuf;

/// Why the timeline could not be created or written.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    /// The timeline file could not be created.
    #[error("cannot create timeline file {}: {source}", path.display())]
    Create {
        /// The file asked for.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the writer thread of timeline {}: {source}", path.display())]
    Spawn {
        /// The timeline's file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// Writing the file failed (e.g. the disk is full). The writer stops
    /// writing after the first failure, so that the file keeps only whole
    /// records, and every later `flush()` returns this error again.
    #[error("writing timeline file {} failed: {source}", path.display())]
    Write {
        /// The timeline's file.
        path: PathBuf,
        /// The first error the writer thread met.
        #[source]
        source: io::Error,
    },
    /// The writer thread is no longer running (it panicked).
    #[error("the writer thread of timeline {} is gone", path.display())]
    WriterGone {
        /// The timeline's file.
        path: PathBuf,
    },
}
