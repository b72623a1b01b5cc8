//! kolo-timeline: a Chrome trace-event timeline of negotiation and
//! communication, written on its own thread and free when disabled.
//!
//! As in Horovod's timeline, every tensor is its own row (a trace "process"
//! named after the tensor), holding its negotiation (`NEGOTIATE_ALLREDUCE`,
//! with an instant tick per rank whose request arrived), its operation
//! (`ALLREDUCE`, whose end carries the dtype and shape) and the activities
//! nested inside it (`QUEUE`, `MEMCPY_IN_FUSION_BUFFER`, ...), plus optional
//! `CYCLE_START` markers across all rows. Calls stamp the time (microseconds
//! since creation, monotonic) and hand the event over a channel to a writer
//! thread that owns the file. The file is a JSON array left unterminated
//! (`[`, then one record per line followed by `,`), even after a clean close,
//! which Perfetto (ui.perfetto.dev) and chrome://tracing load after every
//! flush, even if the process died; [`parse_trace`] reads it back. The
//! writer flushes at least about once a second while events arrive, on
//! [`Timeline::flush`], and when the last handle is dropped. A
//! [`Timeline::disabled`] timeline costs one branch per call.
//!
//! ```
//! use kolo_timeline::{activity, parse_trace, Timeline};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("timeline.json");
//! let timeline = Timeline::create(&path, false)?;
//!
//! timeline.negotiate_start("grad/w1", "ALLREDUCE");
//! timeline.negotiate_rank_ready("grad/w1", 0);
//! timeline.negotiate_rank_ready("grad/w1", 1);
//! timeline.negotiate_end("grad/w1");
//! timeline.op_start("grad/w1", "ALLREDUCE");
//! timeline.activity_start("grad/w1", activity::MEMCPY_IN_FUSION_BUFFER);
//! timeline.activity_end("grad/w1");
//! timeline.op_end("grad/w1", "float32", &[2, 3]);
//! timeline.flush()?;
//!
//! let records = parse_trace(&std::fs::read_to_string(&path)?)?;
//! assert!(records.iter().any(|r| r["ph"] == "M" && r["args"]["name"] == "grad/w1"));
//! let op_end = records.iter().find(|r| r["ph"] == "E" && r["name"] == "ALLREDUCE").unwrap();
//! assert_eq!(op_end["args"]["shape"], serde_json::json!([2, 3]));
//!
//! // Disabled: records nothing, allocates nothing.
//! let off = Timeline::disabled();
//! off.op_start("grad/w1", "ALLREDUCE");
//! assert!(!off.is_enabled());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod activity;
mod error;
mod event;
mod pid_table;
mod record;
mod recorder;
mod timeline;
mod trace_file;
mod writer;

pub use error::TimelineError;
pub use timeline::Timeline;
pub use trace_file::parse_trace;
