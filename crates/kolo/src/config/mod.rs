//! The engine's settings: a builder first, `KOLO_*` environment variables
//! second (see `docs/configuration.md` for the table). Every count and
//! duration has a bound (the `MAX_*` constants); the environment is read
//! as bytes, and only a path may be other than UTF-8.

mod bounds;
mod parse;
mod source;
#[cfg(all(test, unix))]
mod tests;

use crate::error::Error;
use kolo_coordinator::CoordinatorConfig;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub use bounds::{MAX_CACHE_CAPACITY, MAX_CYCLE_TIME, MAX_FUSION_THRESHOLD, MAX_STALL_TIME};

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
/// Whether [`crate::Kolo::init`] may start a GPU engine: [`Config::gpu`].
pub const GPU: &str = "KOLO_GPU";
/// The bound on an engine's start in seconds: [`Config::start_timeout`].
pub const START_TIMEOUT: &str = "KOLO_START_TIMEOUT";
/// The bound on an operation in seconds: [`Config::timeout`].
pub const TIMEOUT: &str = "KOLO_TIMEOUT";
/// Tune the fusion threshold and cycle time by measurement:
/// [`Config::autotune`].
pub const AUTOTUNE: &str = "KOLO_AUTOTUNE";

/// Every variable [`Config::from_env`] reads.
pub const VARIABLES: [&str; 14] = [
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
    GPU,
    START_TIMEOUT,
    TIMEOUT,
    AUTOTUNE,
];

/// The engine's settings. Build one with the builder methods (each
/// consumes and returns the config) or read the environment with
/// [`Config::from_env`]; the fields are public for reading.
/// [`Config::validate`] checks every value against its bound (the engine
/// does when it starts); what [`Config::from_env`] returns always passes.
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
    /// Largest fused buffer in bytes (128 MiB); 0 disables fusion. At most
    /// [`MAX_FUSION_THRESHOLD`].
    pub fusion_threshold: usize,
    /// How long an idle rank waits for work before it cycles anyway (1 ms).
    /// At most [`MAX_CYCLE_TIME`].
    pub cycle_time: Duration,
    /// Where rank 0 writes a Chrome-trace timeline (none).
    pub timeline: Option<PathBuf>,
    /// Mark each background cycle in the timeline (off).
    pub timeline_mark_cycles: bool,
    /// Response cache entries (1024); 0 disables the cache. At most
    /// [`MAX_CACHE_CAPACITY`]; memory grows with the entries used.
    pub cache_capacity: usize,
    /// Warn about tensors that some ranks submitted and others did not
    /// after this long (60 s); `None` disables the warning. Longer than 0
    /// and at most [`MAX_STALL_TIME`].
    pub stall_check: Option<Duration>,
    /// Fail such tensors and shut down after this long (`None`: never).
    /// Longer than 0 and at most [`MAX_STALL_TIME`].
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
    /// [`crate::Kolo::init`] starts the GPU engine (device tensors through
    /// NCCL) where kolo is built with the `nccl` feature and this
    /// process's host has a GPU for each of its ranks (on); off keeps it to the host.
    pub gpu: bool,
    /// How long starting an engine may take: its backend's start (MPI's
    /// initialisation, the UCX rendezvous, NCCL's bootstrap) (300 s;
    /// `None`, or 0 in the environment: no bound). A
    /// start that takes longer fails with [`Error::Start`] instead of
    /// hanging, for instance when a process of an `mpirun` job exited
    /// without initialising MPI. Longer than 0 and at most
    /// [`MAX_STALL_TIME`].
    pub start_timeout: Option<Duration>,
    /// How long an operation may take from its submission to its
    /// completion (300 s; `None`, or 0 in the environment: no bound). A
    /// handle not completed in time fails with [`Error::Timeout`] naming
    /// the tensor and carrying this rank's desync report, and the engine
    /// stops on every rank it can reach, each with the same cause (see
    /// `docs/reliability.md`). Tensors that some ranks submitted and others
    /// did not fail this way on every rank alike (the stall inspector's
    /// shutdown, at the shorter of this and
    /// [`Config::stall_shutdown`]); an operation stuck in the backend (a
    /// peer that stopped answering, a lost link) fails on the ranks that
    /// wait for it. Longer than 0 and at most [`MAX_STALL_TIME`].
    pub timeout: Option<Duration>,
    /// Choose the fusion threshold and cycle time by measurement during
    /// the first training steps, starting from the two settings above,
    /// and keep them once they settle (off). Every rank must use the same
    /// value (the start fails on every rank otherwise). See
    /// [`crate::Kolo::autotune`] and `docs/configuration.md`.
    pub autotune: bool,
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
            gpu: true,
            start_timeout: Some(Duration::from_secs(300)),
            timeout: Some(Duration::from_secs(300)),
            autotune: false,
        }
    }
}

impl Config {
    /// The defaults overridden by the `KOLO_*` environment variables that
    /// are set (and not blank). A malformed value, one out of its bound, or
    /// one that is not UTF-8 (other than the path of `KOLO_TIMELINE`, which
    /// keeps its bytes) is an [`Error::Config`] naming the variable and the
    /// value. The result passes [`Config::validate`].
    pub fn from_env() -> Result<Config, Error> {
        Config::from_lookup(&|name| std::env::var_os(name))
    }

    /// [`Config::from_env`] over any source of variables: `lookup(name)`
    /// returns the raw value of `name`, if set. Pure, so that tests need
    /// not touch the process environment.
    ///
    /// ```
    /// let config = kolo::Config::from_lookup(&|name| {
    ///     (name == "KOLO_CYCLE_TIME").then(|| "2.5".into())
    /// })?;
    /// assert_eq!(config.cycle_time, std::time::Duration::from_micros(2500));
    /// # Ok::<(), kolo::Error>(())
    /// ```
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Config, Error> {
        let read = |name: &str| source::text(name, lookup(name));
        let mut config = Config::default();
        if let Some(v) = read(FUSION_THRESHOLD)? {
            config.fusion_threshold =
                checked(FUSION_THRESHOLD, &v, parse::bytes, bounds::fusion_threshold)?;
        }
        if let Some(v) = read(CYCLE_TIME)? {
            config.cycle_time = checked(CYCLE_TIME, &v, parse::millis, bounds::cycle_time)?;
        }
        if let Some(path) = source::path(lookup(TIMELINE)) {
            config.timeline = Some(path);
        }
        if let Some(v) = read(TIMELINE_MARK_CYCLES)? {
            config.timeline_mark_cycles =
                checked(TIMELINE_MARK_CYCLES, &v, parse::switch, unbounded)?;
        }
        if let Some(v) = read(CACHE_CAPACITY)? {
            config.cache_capacity =
                checked(CACHE_CAPACITY, &v, parse::count, bounds::cache_capacity)?;
        }
        if let Some(v) = read(STALL_CHECK_TIME_SECONDS)? {
            config.stall_check = checked(
                STALL_CHECK_TIME_SECONDS,
                &v,
                parse::seconds_or_never,
                bounds::stall_time,
            )?;
        }
        if let Some(v) = read(STALL_SHUTDOWN_TIME_SECONDS)? {
            config.stall_shutdown = checked(
                STALL_SHUTDOWN_TIME_SECONDS,
                &v,
                parse::seconds_or_never,
                bounds::stall_time,
            )?;
        }
        if let Some(v) = read(LOG_LEVEL)? {
            config.log_level = checked(LOG_LEVEL, &v, LogLevel::from_str, unbounded)?;
        }
        if let Some(v) = read(BACKEND)? {
            config.backend = checked(BACKEND, &v, BackendKind::from_str, unbounded)?;
        }
        if let Some(v) = read(MPI_THREADS_DISABLE)? {
            config.mpi_threads_disable =
                checked(MPI_THREADS_DISABLE, &v, parse::switch, unbounded)?;
        }
        if let Some(v) = read(GPU)? {
            config.gpu = checked(GPU, &v, parse::switch, unbounded)?;
        }
        if let Some(v) = read(START_TIMEOUT)? {
            config.start_timeout = checked(
                START_TIMEOUT,
                &v,
                parse::seconds_or_never,
                bounds::stall_time,
            )?;
        }
        if let Some(v) = read(TIMEOUT)? {
            config.timeout = checked(TIMEOUT, &v, parse::seconds_or_never, bounds::stall_time)?;
        }
        if let Some(v) = read(AUTOTUNE)? {
            config.autotune = checked(AUTOTUNE, &v, parse::switch, unbounded)?;
        }
        Ok(config)
    }

    /// Checks every count and duration against its bound (the `MAX_*`
    /// constants of [`crate::config`]): the first one out of it is an
    /// [`Error::Config`] whose `variable` names the builder setting
    /// (`"Config::cache_capacity"`, ...), with the value and the bound.
    /// Builder methods and public fields take any value; the engine calls
    /// this before it starts.
    pub fn validate(&self) -> Result<(), Error> {
        let threshold = self.fusion_threshold;
        setting(
            "Config::fusion_threshold",
            threshold,
            bounds::fusion_threshold,
        )?;
        setting("Config::cycle_time", self.cycle_time, bounds::cycle_time)?;
        setting(
            "Config::cache_capacity",
            self.cache_capacity,
            bounds::cache_capacity,
        )?;
        setting("Config::stall_check", self.stall_check, bounds::stall_time)?;
        setting(
            "Config::stall_shutdown",
            self.stall_shutdown,
            bounds::stall_time,
        )?;
        setting(
            "Config::start_timeout",
            self.start_timeout,
            bounds::stall_time,
        )?;
        setting("Config::timeout", self.timeout, bounds::stall_time)
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

    /// Whether [`crate::Kolo::init`] may start a GPU engine.
    pub fn gpu(mut self, gpu: bool) -> Self {
        self.gpu = gpu;
        self
    }

    /// Sets the bound on an engine's start (`None`: no bound).
    pub fn start_timeout(mut self, bound: Option<Duration>) -> Self {
        self.start_timeout = bound;
        self
    }

    /// Sets the bound on an operation, from its submission to its
    /// completion ([`Duration::ZERO`]: no bound; see [`Config::timeout`]).
    pub fn timeout(mut self, after: Duration) -> Self {
        self.timeout = (!after.is_zero()).then_some(after);
        self
    }

    /// Tunes the fusion threshold and cycle time by measurement (see
    /// [`Config::autotune`]).
    pub fn autotune(mut self, tune: bool) -> Self {
        self.autotune = tune;
        self
    }

    /// True when the stall inspector's shutdown of a tensor that some ranks
    /// did not submit is the operation timeout's (it comes no later than
    /// [`Config::stall_shutdown`]): the tensor then fails with
    /// [`Error::Timeout`].
    pub(crate) fn stall_is_timeout(&self) -> bool {
        match (self.timeout, self.stall_shutdown) {
            (Some(timeout), Some(stall)) => timeout <= stall,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The coordinator's part of the settings.
    pub(crate) fn coordinator(&self) -> CoordinatorConfig {
        CoordinatorConfig {
            cache_capacity: self.cache_capacity,
            stall_warning: self.stall_check,
            // The timeout of a tensor that some ranks did not submit is
            // the stall inspector's shutdown: rank 0 decides, so every
            // rank fails it alike.
            stall_shutdown: match (self.stall_shutdown, self.timeout) {
                (Some(stall), Some(timeout)) => Some(stall.min(timeout)),
                (stall, timeout) => stall.or(timeout),
            },
            // Only rank 0's timeline reads them.
            events: self.timeline.is_some(),
        }
    }
}

/// Parses `value` of `variable` with `parse` and checks it with `bound`,
/// naming both on failure.
fn checked<T: Copy>(
    variable: &str,
    value: &str,
    parse: impl Fn(&str) -> Result<T, String>,
    bound: impl Fn(T) -> Result<(), String>,
) -> Result<T, Error> {
    parse(value)
        .and_then(|parsed| bound(parsed).map(|()| parsed))
        .map_err(|reason| Error::Config {
            variable: variable.to_owned(),
            value: value.to_owned(),
            reason,
        })
}

/// The bound of a value that has none beyond its type.
fn unbounded<T>(_: T) -> Result<(), String> {
    Ok(())
}

/// Checks the builder `setting`'s `value` with `bound`.
fn setting<T: Copy + fmt::Debug>(
    setting: &str,
    value: T,
    bound: impl Fn(T) -> Result<(), String>,
) -> Result<(), Error> {
    bound(value).map_err(|reason| Error::Config {
        variable: setting.to_owned(),
        value: format!("{value:?}"),
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
    /// One process per rank over UCX (the `kolo-ucx` backend), started by
    /// any launcher that sets torchrun's variables.
    Ucx,
}

impl FromStr for BackendKind {
    type Err = String;

    /// `threads`, `mpi` or `ucx`, case-insensitive.
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "threads" => Ok(BackendKind::Threads),
            "mpi" => Ok(BackendKind::Mpi),
            "ucx" => Ok(BackendKind::Ucx),
            _ => Err("expected threads, mpi or ucx".into()),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Threads => "threads",
            BackendKind::Mpi => "mpi",
            BackendKind::Ucx => "ucx",
        })
    }
}
