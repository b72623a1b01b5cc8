//! The GPU checks shared by the thread-mode and MPI-mode test binaries:
//! every device operation against a host reference, transactions, the
//! conformance suite through `HostStaging`, and error paths. Each check
//! prints one line; [`Report`] counts failures.

pub mod batched_copy;
pub mod device_ops;
pub mod peer_wired;
pub mod scaling;
pub mod transactions;
pub mod watchdog;

use cudarc::driver::{CudaSlice, CudaStream};
use kolo_conformance::{run_suite, SuiteOptions};
use kolo_nccl::{DeviceElement, HostStaging, NcclComm, NcclError, Teardown};
use kolo_transport::{Controller, Element, Topology};
use std::sync::Arc;
use std::time::Duration;

/// The bound on every GPU operation in the tests: a hang fails, it does
/// not stall the run.
pub const OP_TIMEOUT: Duration = Duration::from_secs(120);

/// The teardown bound of the tests: ranks may reach teardown seconds apart.
pub const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Passed and failed checks of one rank.
#[derive(Debug, Default)]
pub struct Report {
    pub rank: usize,
    pub passed: usize,
    pub failed: Vec<String>,
}

impl Report {
    pub fn new(rank: usize) -> Self {
        Report {
            rank,
            ..Report::default()
        }
    }

    /// Records one check and prints its line.
    pub fn check(&mut self, name: &str, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.passed += 1;
                println!("rank {}: ok   {name}", self.rank);
            }
            Err(why) => {
                println!("rank {}: FAIL {name}: {why}", self.rank);
                self.failed.push(format!("{name}: {why}"));
            }
        }
    }

    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }
}

/// Why there is nothing to run here, or the number of visible GPUs.
pub fn gpus_or_skip() -> Result<usize, String> {
    match kolo_nccl::probe::platform() {
        Ok(p) => {
            println!(
                "CUDA driver {}.{}, {} GPU(s), NCCL {} from {}",
                p.driver_version / 1000,
                (p.driver_version % 1000) / 10,
                p.devices,
                kolo_nccl::probe::version_string(p.nccl_version),
                p.nccl_library
            );
            Ok(p.devices)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A small integer-valued input, exact in every tested dtype.
pub fn value<T: Element>(rank: usize, i: usize, salt: usize) -> T {
    T::from_f64(((rank * 7 + i * 3 + salt) % 11) as f64 - 5.0)
}

/// Inputs for products: 1, 2 or -1, so products stay exact.
pub fn factor<T: Element>(rank: usize, i: usize) -> T {
    T::from_f64([1.0, 2.0, -1.0][(rank + i) % 3])
}

pub fn to_device<T: DeviceElement>(
    stream: &Arc<CudaStream>,
    host: &[T],
) -> Result<CudaSlice<T>, String> {
    if host.is_empty() {
        return stream
            .alloc_zeros::<T>(1)
            .map_err(|e| format!("alloc: {e:?}"));
    }
    stream.clone_htod(host).map_err(|e| format!("htod: {e:?}"))
}

pub fn to_host<T: DeviceElement>(
    stream: &Arc<CudaStream>,
    dev: &CudaSlice<T>,
    len: usize,
) -> Result<Vec<T>, String> {
    if len == 0 {
        return Ok(Vec::new());
    }
    stream
        .clone_dtoh(&dev.slice(..len))
        .map_err(|e| format!("dtoh: {e:?}"))
}

/// Compares element by element: exact for integers, relative `tol` for floats.
pub fn compare<T: Element>(got: &[T], want: &[T], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, expected {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        let ok = if T::DTYPE.is_float() {
            (g - w).abs() <= tol * w.abs().max(1.0)
        } else {
            g == w
        };
        if !ok {
            return Err(format!("index {i}: got {g}, expected {w}"));
        }
    }
    Ok(())
}

/// Float tolerance per dtype.
pub fn tolerance<T: Element>() -> f64 {
    match T::DTYPE {
        kolo_protocol::DataType::F16 | kolo_protocol::DataType::BF16 => 2e-2,
        kolo_protocol::DataType::F32 => 1e-5,
        _ => 1e-12,
    }
}

pub fn err(e: NcclError) -> String {
    e.to_string()
}

/// Every check on `comm` (device operations for f32, f64, f16, bf16, i32;
/// scaled reductions; transactions; the conformance suite through
/// `HostStaging`).
pub fn run_all<C: Controller + ?Sized>(comm: &mut NcclComm, ctrl: &mut C, report: &mut Report) {
    device_ops::run::<f32>(comm, report);
    device_ops::run::<f64>(comm, report);
    device_ops::run::<half::f16>(comm, report);
    device_ops::run::<half::bf16>(comm, report);
    device_ops::run::<i32>(comm, report);
    batched_copy::run(comm, report);
    scaling::scaled(comm, report);
    scaling::errors(comm, report);
    transactions::run(comm, report);
    peer_wired::run(comm, ctrl, report);
    let opts = SuiteOptions {
        unordered_p2p: false,
        ..SuiteOptions::default()
    };
    let outcome = {
        let mut staging = HostStaging::new(comm, ctrl);
        run_suite(&mut staging, &opts)
    };
    report.check(
        "conformance suite via HostStaging",
        outcome
            .map(|r| println!("rank {}: conformance: {r}", comm.rank()))
            .map_err(|f| f.to_string()),
    );
    report.check(
        "communicator healthy after all checks",
        comm.check_health().map_err(err),
    );
}

/// Closes `comm` and checks it finalized cleanly.
pub fn close(comm: NcclComm, report: &mut Report) {
    let outcome = comm.close();
    report.check(
        "teardown finalizes",
        if outcome == Teardown::Finalized {
            Ok(())
        } else {
            Err(format!("{outcome:?}"))
        },
    );
}
