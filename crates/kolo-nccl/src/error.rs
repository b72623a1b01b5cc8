//! Why an NCCL operation failed.

use cudarc::driver::DriverError;
use kolo_protocol::DataType;
use kolo_transport::TransportError;
use thiserror::Error;

/// The errors of kolo-nccl. Every failure of CUDA, NCCL, a peer or the
/// caller's arguments ends up here; nothing in this crate panics on them.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum NcclError {
    /// A shared library could not be loaded (no driver, no NCCL).
    #[error("{library} is not available: {hint}")]
    LibraryMissing {
        /// `libcuda` or `libnccl`.
        library: &'static str,
        /// What was tried and how to fix it.
        hint: String,
    },
    /// A library loaded but lacks a function kolo-nccl needs (too old).
    #[error("{library} has no symbol {symbol}: the library is too old for kolo-nccl")]
    SymbolMissing {
        /// The library's name or path.
        library: String,
        /// The missing function.
        symbol: String,
    },
    /// The driver loaded but there is no usable device for this rank.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// What the driver said, or which ordinal was missing.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA {call} failed: {message}")]
    Cuda {
        /// What kolo-nccl was doing (the driver call or a safe wrapper of it).
        call: &'static str,
        /// The driver's error name and text.
        message: String,
    },
    /// An NCCL call returned an error.
    #[error("{call} failed: {message} (ncclResult {code})")]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// Its `ncclResult_t`.
        code: i32,
        /// NCCL's description and last error message.
        message: String,
    },
    /// The arguments cannot work (lengths, ranks, devices); the message
    /// names the values.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operation has no device implementation for this dtype / op /
    /// scale (see the crate docs' table); `HostStaging` covers it on host
    /// buffers.
    #[error("{op} on {dtype} is not supported on the device: {reason}")]
    Unsupported {
        /// The operation, e.g. `allreduce(average)`.
        op: String,
        /// The element type.
        dtype: DataType,
        /// Why, and what to use instead.
        reason: String,
    },
    /// A bounded wait ran out.
    #[error("timed out after {seconds:.1} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The bound.
        seconds: f64,
    },
    /// Creating the communicator failed on some rank; every rank reports it.
    #[error("bootstrap failed on rank {rank}: {message}")]
    Bootstrap {
        /// The rank that failed first.
        rank: usize,
        /// Its error.
        message: String,
    },
    /// An earlier failure (an asynchronous NCCL error, a timeout, a failed
    /// launch) left the communicator unusable; it will be aborted.
    #[error("the NCCL communicator of rank {rank} is broken: {cause}")]
    Broken {
        /// This rank.
        rank: usize,
        /// The first failure.
        cause: String,
    },
    /// The communicator was shut down before the operation completed.
    #[error("the NCCL communicator was shut down")]
    ShutDown,
    /// The completion thread's watchdog aborted the communicator
    /// (`ncclCommAbort`) after an operation timed out or NCCL reported an
    /// asynchronous error; that first failure is what the pending
    /// operations failed with.
    #[error("the NCCL communicator was aborted after an earlier failure")]
    Aborted,
    /// The control plane (the borrowed [`kolo_transport::Controller`]) failed.
    #[error("control plane: {0}")]
    Control(#[from] TransportError),
}

impl NcclError {
    /// A CUDA driver error of `call` (cudarc's [`DriverError`]), with the
    /// driver's name and text of it: for callers that mix their own cudarc
    /// calls (copies, allocations) with kolo-nccl's.
    pub fn cuda(call: &'static str, error: DriverError) -> NcclError {
        NcclError::Cuda {
            call,
            message: driver_message(error),
        }
    }

    /// [`NcclError::cuda`] for `map_err`:
    /// `stream.clone_htod(&host).map_err(NcclError::on_cuda("cuMemcpyHtoDAsync"))`.
    pub fn on_cuda(call: &'static str) -> impl FnOnce(DriverError) -> NcclError {
        move |e| NcclError::cuda(call, e)
    }
}

impl From<NcclError> for TransportError {
    fn from(e: NcclError) -> Self {
        match e {
            NcclError::InvalidArgument(m) => TransportError::InvalidArgument(m),
            NcclError::Timeout { .. } => TransportError::Timeout(e.to_string()),
            NcclError::ShutDown => TransportError::ShutDown,
            NcclError::Control(inner) => inner,
            NcclError::Unsupported { .. } => TransportError::Unsupported(e.to_string()),
            other => TransportError::Backend(other.to_string()),
        }
    }
}

/// The driver's name and text of `error`.
pub(crate) fn driver_message(error: DriverError) -> String {
    let name = error.error_name().map(|n| n.to_string_lossy().into_owned());
    let text = error
        .error_string()
        .map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(name), Ok(text)) => format!("{name}: {text}"),
        _ => format!("{:?}", error.0),
    }
}

/// `Result` with [`NcclError`].
pub type Result<T, E = NcclError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_onto_transport_errors_keeping_the_kind() {
        let bad = NcclError::InvalidArgument("recv holds 3 elements, counts sum to 4".into());
        assert_eq!(
            TransportError::from(bad),
            TransportError::InvalidArgument("recv holds 3 elements, counts sum to 4".into())
        );
        assert_eq!(
            TransportError::from(NcclError::ShutDown),
            TransportError::ShutDown
        );
        let late = NcclError::Timeout {
            what: "allreduce".into(),
            seconds: 2.0,
        };
        assert!(
            matches!(TransportError::from(late), TransportError::Timeout(m) if m.contains("allreduce"))
        );
        let missing = NcclError::LibraryMissing {
            library: "libnccl",
            hint: "set KOLO_NCCL_LIBRARY".into(),
        };
        assert!(
            matches!(TransportError::from(missing), TransportError::Backend(m) if m.contains("libnccl is not available"))
        );
        let sixteen = NcclError::Unsupported {
            op: "allreduce(sum)".into(),
            dtype: DataType::I16,
            reason: "no NCCL type".into(),
        };
        assert!(
            matches!(TransportError::from(sixteen), TransportError::Unsupported(m) if m.contains("allreduce(sum) on i16")),
        );
    }
}
