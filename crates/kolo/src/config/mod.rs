//! The engine's settings: a builder first, `KOLO_*` environment variables
//! second (see `docs/configuration.md` for the table).

mod parse;

use crate::error::Error;
use kolo_coordinator::CoordinatorConfig;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Fusion threshold in bytes: [`Config::fusion_threshold`].
pub const FUSION_THRESHOLD: &str = "KOLO_FUSION_THRESHOLD";
/// Cycle time in milliseconds: [`Config::cycle_time`].
pub const CYCLE_TIME: &str = "KOLO_CYCLE_TIME";
/// Timeline path: [`Config::timeline`].
pub const TIMELINE: &str = "KOLO_TIMELINE";
/// Cycle markers in the timeline: [`Config::timeline_mark_cycles`].
pub const TIMELINE_MARK_CYCLES: &str = "KOLO_TIMELINE_MARK_CYCLES";
/// Response cache capacity: [`Config::cache_capacity`].
pub const CACHE_CAPACITY: &str = "KOLO_CACHE_CAPACITY";
/// Stall warning time in seconds: [`Config::stall_check`].
pub const STALL_CHECK_TIME_SECONDS: &str = "KOLO_STALL_CHECK_TIME_SECONDS";
/// Stall shutdown time in seconds: [`Config::stall_shutdown`].
pub const STALL_SHUTDOWN_TIME_SECONDS: &str = "KOLO_STALL_SHUTDOWN_TIME_SECONDS";
/// Log level: [`Config::log_level`].
pub const LOG_LEVEL: &str = "KOLO_LOG_LEVEL";
/// Backend: [`Config::backend`].
pub const BACKEND: &str = "KOLO_BACKEND";
/// Ask MPI for `MPI_THREAD_FUNNELED` instead of `MULTIPLE`:
/// [`Config::mpi_threads_disable`].
pub const MPI_THREADS_DISABLE: &str = "KOLO_MPI_THREADS_DISABLE";

/// Every variable [`Config::from_env`] reads.
pub const VARIABLES: [&str; 10] = [
    FUSION_THRESHOLD,
    CYCLE_TIME,
    TIMELINE,
    TIMELINE_MARK_CYCLES,
    CACHE_CAPACITY,
    STALL_CHECK_TIME_SECONDS,
    STALL_SHUTDOWN_TIME_SECONDS,
    LOG_LEVEL,
    BACKEND,
    MPI_THREADS_DISABLE,
];

/// The engine's settings. Build one with the builder methods (each
/// consumes and returns the config) or read the environment with
/// [`Config::from_env`]; the fields are public for reading.
///
/// ```
/// use std::time::Duration;
/// let config = kolo::Config::default()
///     .fusion_threshold(64 << 20)
///     .cycle_time(Duration::from_micros(500))
///     .cache_capacity(0);
/// assert_eq!(config.fusion_threshold, 64 << 20);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Largest fused buffer in bytes (128 MiB); 0 disables fusion.
    pub fusion_threshold: usize,
    /// How long an idle rank waits for work before it cycles anyway (1 ms).
    pub cycle_time: Duration,
    /// Where rank 0 writes a Chrome-trace timeline (none).
    pub timeline: Option<PathBuf>,
    /// Mark each background cycle in the timeline (off).
    pub timeline_mark_cycles: bool,
    /// Response cache entries (1024); 0 disables the cache.
    pub cache_capacity: usize,
    /// Warn about tensors that some ranks submitted and others did not
    /// after this long (60 s); `None` disables the warning.
    pub stall_check: Option<Duration>,
    /// Fail such tensors and shut down after this long (`None`: never).
    pub stall_shutdown: Option<Duration>,
    /// The most detailed level kolo's own log events are emitted at (warn).
    pub log_level: LogLevel,
    /// Which backend a launcher should use (threads); informational for
    /// [`crate::threads::run`], which always runs on threads.
    pub backend: BackendKind,
    /// MPI backend: request `MPI_THREAD_FUNNELED` rather than
    /// `MPI_THREAD_MULTIPLE` (off). Every MPI call then comes from the
    /// engine's background thread, which initialises MPI.
    pub mpi_threads_disable: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            fusion_threshold: 128 << 20,
            cycle_time: Duration::from_millis(1),
            timeline: None,
            timeline_mark_cycles: false,
            cache_capacity: 1024,
            stall_check: Some(Duration::from_secs(60)),
            stall_shutdown: None,
            log_level: LogLevel::Warn,
            backend: BackendKind::Threads,
            mpi_threads_disable: false,
        }
    }
}

impl Config {
    /// The defaults overridden by the `KOLO_*` environment variables that
    /// are set (and not empty). A malformed value is an [`Error::Config`]
    /// naming the variable and the value.
    pub fn from_env() -> Result<Config, Error> {
        Config::from_lookup(&|name| std::env::var(name).ok())
    }

    /// [`Config::from_env`] over any source of variables: `lookup(name)`
    /// returns the value of `name`, if set. Pure, so that tests need not
    /// touch the process environment.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, Error> {
        let read = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut config = Config::default();
        if let Some(v) = read(FUSION_THRESHOLD) {
            config.fusion_threshold = checked(FUSION_THRESHOLD, &v, parse::bytes)?;
        }
        if let Some(v) = read(CYCLE_TIME) {
            config.cycle_time = checked(CYCLE_TIME, &v, parse::millis)?;
        }
        if let Some(v) = read(TIMELINE) {
            config.timeline = Some(PathBuf::from(v));
        }
        if let Some(v) = read(TIMELINE_MARK_CYCLES) {
            config.timeline_mark_cycles = checked(TIMELINE_MARK_CYCLES, &v, parse::switch)?;
        }
        if let Some(v) = read(CACHE_CAPACITY) {
            config.cache_capacity = checked(CACHE_CAPACITY, &v, parse::count)?;
        }
        if let Some(v) = read(STALL_CHECK_TIME_SECONDS) {
            config.stall_check = checked(STALL_CHECK_TIME_SECONDS, &v, parse::seconds_or_never)?;
        }
        if let Some(v) = read(STALL_SHUTDOWN_TIME_SECONDS) {
            config.stall_shutdown =
                checked(STALL_SHUTDOWN_TIME_SECONDS, &v, parse::seconds_or_never)?;
        }
        if let Some(v) = read(LOG_LEVEL) {
            config.log_level = checked(LOG_LEVEL, &v, LogLevel::from_str)?;
        }
        if let Some(v) = read(BACKEND) {
            config.backend = checked(BACKEND, &v, BackendKind::from_str)?;
        }
        if let Some(v) = read(MPI_THREADS_DISABLE) {
            config.mpi_threads_disable = checked(MPI_THREADS_DISABLE, &v, parse::switch)?;
        }
        Ok(config)
    }

    /// Sets the fusion threshold in bytes (0 disables fusion).
    pub fn fusion_threshold(mut self, bytes: usize) -> Self {
        self.fusion_threshold = bytes;
        self
    }

    /// Sets the cycle time.
    pub fn cycle_time(mut self, cycle_time: Duration) -> Self {
        self.cycle_time = cycle_time;
        self
    }

    /// Makes rank 0 write a timeline to `path`.
    pub fn timeline(mut self, path: impl Into<PathBuf>) -> Self {
        self.timeline = Some(path.into());
        self
    }

    /// Marks each cycle in the timeline.
    pub fn timeline_mark_cycles(mut self, mark: bool) -> Self {
        self.timeline_mark_cycles = mark;
        self
    }

    /// Sets the response cache capacity (0 disables the cache).
    pub fn cache_capacity(mut self, entries: usize) -> Self {
        self.cache_capacity = entries;
        self
    }

    /// Sets the stall warning time (`None` disables the warning).
    pub fn stall_check(mut self, after: Option<Duration>) -> Self {
        self.stall_check = after;
        self
    }

    /// Sets the stall shutdown time (`None`: never).
    pub fn stall_shutdown(mut self, after: Option<Duration>) -> Self {
        self.stall_shutdown = after;
        self
    }

    /// Sets the log level.
    pub fn log_level(mut self, level: LogLevel) -> Self {
        self.log_level = level;
        self
    }

    /// Sets the backend.
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.backend = backend;
        self
    }

    /// MPI backend: request `MPI_THREAD_FUNNELED` instead of `MULTIPLE`.
    pub fn mpi_threads_disable(mut self, disable: bool) -> Self {
        self.mpi_threads_disable = disable;
        self
    }

    /// The coordinator's part of the settings.
    pub(crate) fn coordinator(&self) -> CoordinatorConfig {
        CoordinatorConfig {
            cache_capacity: self.cache_capacity,
            stall_warning: self.stall_check,
            stall_shutdown: self.stall_shutdown,
            // Only rank 0's timeline reads them.
            events: self.timeline.is_some(),
        }
    }
}

/// Parses `value` of `variable` with `parse`, naming both on failure.
fn checked<T>(
    variable: &str,
    value: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<T, Error> {
    parse(value).map_err(|reason| Error::Config {
        variable: variable.to_owned(),
        value: value.to_owned(),
        reason,
    })
}

/// How much kolo logs (through `tracing`), from most to least detailed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Every cycle and response.
    Trace,
    /// Engine start and stop, fused responses.
    Debug,
    /// Configuration at start.
    Info,
    /// Stalls and failed tensors (the default).
    Warn,
    /// Only failures of the engine itself.
    Error,
    /// Nothing.
    Off,
}

impl LogLevel {
    /// The `tracing` filter of this level.
    pub fn filter(self) -> tracing::level_filters::LevelFilter {
        use tracing::level_filters::LevelFilter;
        match self {
            LogLevel::Trace => LevelFilter::TRACE,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Off => LevelFilter::OFF,
        }
    }
}

impl FromStr for LogLevel {
    type Err = String;

    /// `trace`, `debug`, `info`, `warn` (or `warning`), `error` (or
    /// `fatal`), `off`; case-insensitive.
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "trace" => Ok(LogLevel::Trace),
            "debug" => Ok(LogLevel::Debug),
            "info" => Ok(LogLevel::Info),
            "warn" | "warning" => Ok(LogLevel::Warn),
            "error" | "fatal" => Ok(LogLevel::Error),
            "off" | "none" => Ok(LogLevel::Off),
            _ => Err("expected trace, debug, info, warn, error or off".into()),
        }
    }
}

/// The backend that carries the control and data planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Ranks as threads of one process, on shared memory (built in).
    Threads,
    /// One process per rank over MPI (the `kolo-mpi` backend).
    Mpi,
}

impl FromStr for BackendKind {
    type Err = String;

    /// `threads` or `mpi`, case-insensitive.
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "threads" => Ok(BackendKind::Threads),
            "mpi" => Ok(BackendKind::Mpi),
            _ => Err("expected threads or mpi".into()),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Threads => "threads",
            BackendKind::Mpi => "mpi",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from_map(vars: &[(&str, &str)]) -> Result<Config, Error> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&|name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_gives_the_defaults() {
        assert_eq!(from_map(&[]), Ok(Config::default()));
        assert_eq!(from_map(&[(FUSION_THRESHOLD, " ")]), Ok(Config::default()));
    }

    #[test]
    fn every_variable_is_read() {
        let config = from_map(&[
            (FUSION_THRESHOLD, "64M"),
            (CYCLE_TIME, "2.5"),
            (TIMELINE, "/tmp/t.json"),
            (TIMELINE_MARK_CYCLES, "1"),
            (CACHE_CAPACITY, "0"),
            (STALL_CHECK_TIME_SECONDS, "0"),
            (STALL_SHUTDOWN_TIME_SECONDS, "30"),
            (LOG_LEVEL, "DEBUG"),
            (BACKEND, "mpi"),
        ])
        .unwrap();
        let expected = Config::default()
            .fusion_threshold(64 << 20)
            .cycle_time(Duration::from_micros(2500))
            .timeline("/tmp/t.json")
            .timeline_mark_cycles(true)
            .cache_capacity(0)
            .stall_check(None)
            .stall_shutdown(Some(Duration::from_secs(30)))
            .log_level(LogLevel::Debug)
            .backend(BackendKind::Mpi);
        assert_eq!(config, expected);
    }

    #[test]
    fn a_malformed_value_names_variable_and_value() {
        for (variable, value) in [
            (FUSION_THRESHOLD, "lots"),
            (CYCLE_TIME, "-1"),
            (TIMELINE_MARK_CYCLES, "maybe"),
            (CACHE_CAPACITY, "1e3"),
            (STALL_CHECK_TIME_SECONDS, "soon"),
            (STALL_SHUTDOWN_TIME_SECONDS, "-5"),
            (LOG_LEVEL, "loud"),
            (BACKEND, "carrier-pigeon"),
        ] {
            match from_map(&[(variable, value)]) {
                Err(Error::Config {
                    variable: v,
                    value: got,
                    reason,
                }) => {
                    assert_eq!((v.as_str(), got.as_str()), (variable, value));
                    assert!(!reason.is_empty());
                }
                other => panic!("{variable}={value}: expected a config error, got {other:?}"),
            }
        }
    }

    #[test]
    fn the_coordinator_gets_its_part() {
        let config = Config::default()
            .cache_capacity(7)
            .stall_shutdown(Some(Duration::from_secs(3)));
        let c = config.coordinator();
        assert_eq!(c.cache_capacity, 7);
        assert_eq!(c.stall_warning, Some(Duration::from_secs(60)));
        assert_eq!(c.stall_shutdown, Some(Duration::from_secs(3)));
    }
}
