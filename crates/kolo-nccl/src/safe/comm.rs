//! [`NcclComm`]: one rank's NCCL communicator on one GPU, bootstrapped over
//! any kolo control plane, with its stream, completion thread and teardown.

use crate::board::{self, Board};
use crate::bootstrap::{
    agree, check_layout, choose_mode, decode_unique_id, encode_status, mode_code, u64_from,
};
use crate::crossover::Thresholds;
use crate::error::NcclError;
use crate::options::{CopyEngine, Mode, NcclOptions};
use crate::outbox::Outbox;
use crate::probe;
use crate::safe::completion::{Completer, Entry, Watch};
use crate::safe::copy_engine::CopyEngines;
use crate::safe::device::{Device, EventFence};
use crate::safe::peer_buffers::PeerBuffers;
use crate::safe::raw_comm::{InUse, RawComm, Watchdog};
use crate::safe::teardown::{teardown, Teardown};
use crate::safe::work::{Health, Work};
use cudarc::driver::{CudaContext, CudaSlice};
use kolo_transport::{Controller, Topology};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A device's [`Watchdog`], the context its abort runs in, and the health
/// it reports the abort to.
struct DeviceWatch {
    watchdog: Watchdog,
    ctx: Arc<CudaContext>,
    health: Arc<Health>,
}

impl Watch for DeviceWatch {
    fn check(&mut self) -> Option<NcclError> {
        self.watchdog.check()
    }

    /// Aborts on a thread of its own, waited for a bounded while:
    /// `ncclCommAbort` also waits for what the communicator's stream waits
    /// on, which may be work of the application's that ends late or never
    /// (a stream held by a host function, say), and this thread must stay
    /// free to be stopped by the teardown. An abort that ends after the
    /// wait still marks the health.
    fn abort(&mut self) -> bool {
        let mut watchdog = self.watchdog.clone();
        let (ctx, health) = (self.ctx.clone(), self.health.clone());
        let (tx, rx) = crossbeam_channel::bounded(1);
        let spawned = std::thread::Builder::new()
            .name("kolo-nccl-abort".into())
            .spawn(move || {
                let _ = ctx.bind_to_thread();
                let aborted = watchdog.abort(ABORT_WAIT);
                if aborted {
                    health.note_aborted();
                }
                let _ = tx.send(aborted);
            });
        match spawned {
            Ok(_detached) => rx.recv_timeout(ABORT_WAIT * 2).unwrap_or(false),
            Err(_) => self.watchdog.abort(ABORT_WAIT),
        }
    }
}

/// How long the watchdog waits for a call into the communicator under way
/// before it aborts beneath it (see [`Watchdog::abort`]).
const ABORT_WAIT: Duration = Duration::from_secs(1);

/// One rank of an NCCL communicator, bound to one GPU.
///
/// Built by [`NcclComm::init`] over a control plane (e.g. MPI's in process
/// mode, kolo-threads' in thread mode), which carries NCCL's unique id from
/// rank 0. Owns a non-blocking stream at the device's highest priority;
/// every operation is enqueued there after GPU-side waits for its buffers'
/// last writes, and returns a [`Work`] completed by the device's
/// completion thread.
///
/// The communicator is `Send` but not `Sync`: use it from one thread at a
/// time (create it on the thread that will drive the device, as NCCL
/// recommends). Dropping it drains pending work within
/// [`NcclOptions::teardown_timeout`], then finalizes it if healthy and
/// aborts it otherwise, never blocking longer than that bound.
pub struct NcclComm {
    pub(crate) device: Device,
    pub(crate) raw: Option<RawComm>,
    pub(crate) completer: Completer<EventFence>,
    pub(crate) copy: Option<CopyEngines>,
    pub(crate) board: Option<Arc<Board>>,
    pub(crate) health: Arc<Health>,
    /// Sends of the device data plane (`Collectives<Cuda>`) waiting for
    /// this rank's next group (see `outbox.rs`).
    pub(crate) staged: Outbox<CudaSlice<u8>>,
    /// Every rank's registered buffer for the peer allreduce kernels, when
    /// all ranks reach each other's (see `peer_buffers.rs`).
    pub(crate) peer: Option<PeerBuffers>,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    mode: Mode,
    options: NcclOptions,
    closed: Option<Teardown>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .field("mode", &self.mode)
            .field("copy_engine", &self.copy_engine())
            .finish()
    }
}

impl NcclComm {
    /// Creates this rank's communicator. Collective over `ctrl`: every rank
    /// calls it with equivalent options. A failure on any rank (no driver,
    /// no NCCL, no device, a failed `ncclCommInitRank`) is returned on
    /// every rank as [`NcclError::Bootstrap`] naming the rank.
    pub fn init<C: Controller + ?Sized>(
        ctrl: &mut C,
        options: NcclOptions,
    ) -> Result<NcclComm, NcclError> {
        let (rank, size) = (ctrl.rank(), ctrl.size());
        let (local_rank, local_size) = (ctrl.local_rank(), ctrl.local_size());
        let ordinal = options.device.unwrap_or(local_rank);
        let device = probe::platform().and_then(|_| Device::open(ordinal));
        agree(
            ctrl,
            "opening the device",
            device.as_ref().map(|_| ()).map_err(Clone::clone),
        )?;
        let device = device?;

        // Thread mode: every rank finds rank 0's board in its own process.
        let mine = (rank == 0).then(|| Arc::new(Board::new(size)));
        let id = mine.as_ref().map(board::register).unwrap_or(0);
        let id = u64_from(&ctrl.broadcast_bytes(&id.to_le_bytes(), 0)?)?;
        let shared = mine.or_else(|| board::lookup(id));
        let found = ctrl.allgather_bytes(&[u8::from(shared.is_some()), mode_code(options.mode)])?;
        let mode = choose_mode(&found, options.copy_engine)?;
        let board = shared.filter(|_| mode == Mode::ThreadPerGpu);

        let ordinals = ctrl
            .allgather_bytes(&(ordinal as u64).to_le_bytes())?
            .iter()
            .map(|b| u64_from(b).map(|o| o as usize))
            .collect::<Result<Vec<_>, _>>()?;
        check_layout(mode, options.copy_engine, &ordinals)?;

        let id = if rank == 0 {
            encode_status(RawComm::unique_id())
        } else {
            Vec::new()
        };
        let id = decode_unique_id(&ctrl.broadcast_bytes(&id, 0)?)?;
        device.bind()?;
        let raw = RawComm::init(size, &id, rank);
        agree(
            ctrl,
            "ncclCommInitRank",
            raw.as_ref().map(|_| ()).map_err(Clone::clone),
        )?;
        let raw = raw?;

        let copy = match (options.copy_engine, &board) {
            (CopyEngine::On, Some(board)) => Some(CopyEngines::new(
                board.clone(),
                device.context(),
                &ordinals,
                options.op_timeout,
                device.priority(),
            )),
            _ => None,
        }
        .transpose();
        agree(
            ctrl,
            "enabling peer access",
            copy.as_ref().map(|_| ()).map_err(Clone::clone),
        )?;
        let copy = copy?;

        // The peer allreduce's buffers, for the largest tensor the
        // crossover gives a kernel; a failure leaves them unused on every
        // rank.
        let peer = PeerBuffers::register(
            ctrl,
            device.context(),
            mode,
            &ordinals,
            Thresholds::DEFAULT.max_bytes(),
            options.peer_allreduce,
        )?;
        device.bind()?;

        let health = Arc::new(Health::new(rank));
        let watchdog = raw.watchdog();
        let ctx = device.context().clone();
        let completer = Completer::start(
            format!("kolo-nccl-done-{rank}"),
            options.op_timeout,
            health.clone(),
            Box::new(move || {
                ctx.bind_to_thread()
                    .map_err(NcclError::on_cuda("cuCtxSetCurrent"))
            }),
            Box::new(DeviceWatch {
                watchdog,
                ctx: device.context().clone(),
                health: health.clone(),
            }),
        )?;
        Ok(NcclComm {
            device,
            raw: Some(raw),
            completer,
            copy,
            board,
            health,
            staged: Outbox::default(),
            peer,
            rank,
            size,
            local_rank,
            local_size,
            mode,
            options,
            closed: None,
        })
    }

    /// Process or thread mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether copy engines serve all-gather and transaction send / recv.
    pub fn copy_engine(&self) -> CopyEngine {
        if self.copy.is_some() {
            CopyEngine::On
        } else {
            CopyEngine::Off
        }
    }

    /// With copy engines on: per rank, whether this GPU copies from it
    /// directly (peer access over NVLink or PCIe) rather than through host
    /// memory staged by the driver. `None` with copy engines off.
    pub fn copy_engine_direct(&self) -> Option<Vec<bool>> {
        self.copy.as_ref().map(|c| c.direct().to_vec())
    }

    /// The options this communicator was built with.
    pub fn options(&self) -> &NcclOptions {
        &self.options
    }

    /// The GPU, its stream and events.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The communication stream.
    pub fn stream(&self) -> &Arc<cudarc::driver::CudaStream> {
        self.device.stream()
    }

    /// Later operations wait, on the GPU, for `event` (e.g. recorded on the
    /// compute stream when a gradient is ready).
    pub fn wait_event(&self, event: &cudarc::driver::CudaEvent) -> Result<(), NcclError> {
        self.health.check()?;
        self.device.wait_event(event)
    }

    /// Later operations wait, on the GPU, for everything enqueued on `stream`.
    pub fn wait_stream(&self, stream: &cudarc::driver::CudaStream) -> Result<(), NcclError> {
        self.health.check()?;
        self.device.wait_stream(stream)
    }

    /// `stream` waits, on the GPU, for every operation enqueued so far.
    pub fn join_into(&self, stream: &cudarc::driver::CudaStream) -> Result<(), NcclError> {
        self.device.join_into(stream)
    }

    /// `Ok` while usable; the first failure otherwise.
    pub fn check_health(&self) -> Result<(), NcclError> {
        self.health.check()
    }

    /// A handle completed when everything enqueued so far has run.
    pub fn flush(&self) -> Result<Work, NcclError> {
        self.health.check()?;
        self.device.bind()?;
        self.track("flush")
    }

    /// The NCCL communicator for this thread's calls: the completion
    /// thread's watchdog does not abort it until the guard is dropped.
    pub(crate) fn raw(&self) -> Result<InUse<'_>, NcclError> {
        self.raw.as_ref().ok_or(NcclError::ShutDown)?.enter()
    }

    /// Records a pooled event after the work enqueued so far and hands it
    /// to the completion thread.
    pub(crate) fn track(&self, what: impl Into<String>) -> Result<Work, NcclError> {
        self.device.check_recorded()?;
        let event = self.device.record()?;
        let (work, state) = Work::pending();
        self.completer.track(Entry {
            fence: EventFence { event },
            work: state,
            what: what.into(),
            since: Instant::now(),
        });
        Ok(work)
    }

    /// Runs `enqueue` (which issues NCCL / CUDA calls on the stream) and
    /// tracks its completion. Argument errors leave the communicator
    /// usable; a failed NCCL or CUDA call breaks it (ranks may now disagree
    /// about what was issued).
    pub(crate) fn run(
        &mut self,
        what: String,
        enqueue: impl FnOnce(&mut Self) -> Result<(), NcclError>,
    ) -> Result<Work, NcclError> {
        self.health.check()?;
        self.device.bind()?;
        match enqueue(self).and_then(|()| self.track(what)) {
            Ok(work) => Ok(work),
            Err(e @ (NcclError::InvalidArgument(_) | NcclError::Unsupported { .. })) => Err(e),
            Err(e) => {
                self.health.fail(&e);
                Err(e)
            }
        }
    }

    /// Drains, stops the completion thread, and finalizes (healthy) or
    /// aborts the communicator, within the teardown bound. Dropping does the
    /// same; this reports how it went.
    pub fn close(mut self) -> Teardown {
        self.close_inner()
    }

    fn close_inner(&mut self) -> Teardown {
        if let Some(done) = &self.closed {
            return done.clone();
        }
        let bound = self.options.teardown_timeout;
        self.issue_staged();
        let healthy = !self.health.is_broken() && self.drain(bound).is_ok();
        self.completer.stop();
        // Thread mode: every rank finalizes at the same time, each from its
        // own thread (NCCL may synchronize the ranks of a process while
        // finalizing); a rank that cannot, leaves at once so the others
        // abort instead of waiting.
        let together = match &self.board {
            Some(board) => healthy && board.allgather(self.rank, Vec::new(), bound).is_ok(),
            None => healthy,
        };
        if !together {
            if let Some(board) = &self.board {
                board.leave(self.rank);
            }
            self.health.fail(&NcclError::ShutDown);
        }
        // Releasing the peers' contexts leaves one of them current: make
        // this device's current again for the caller.
        self.copy = None;
        let _ = self.device.bind();
        let healthy = together && !self.health.is_broken();
        let outcome = match self.raw.take() {
            Some(raw) => teardown(raw, self.device.context().clone(), healthy, bound),
            None => Teardown::Aborted,
        };
        if let (true, Some(board)) = (together, &self.board) {
            // ...and no rank returns before every rank is done: the last
            // rank's finalize frees what the process's ranks share and so
            // synchronizes every device; a rank that ran ahead and queued
            // work on another communicator, which waits for this one, would
            // stall it until the bound.
            let _ = board.allgather(self.rank, Vec::new(), bound);
            board.leave(self.rank);
        }
        // Every rank's work is done (drained, and in thread mode agreed
        // above): nobody reads the registered buffers any more. After a
        // failure a peer's kernel may still spin on them: they are leaked
        // rather than freed under it.
        match self.peer.take() {
            Some(peer) if !healthy => std::mem::forget(peer),
            other => drop(other),
        }
        let _ = self.device.bind();
        self.closed = Some(outcome.clone());
        outcome
    }

    /// Issues the device data plane's staged sends, for peers still to
    /// receive them; the drain that follows waits for them (bounded).
    fn issue_staged(&mut self) {
        let staged = self.staged.take_all();
        if staged.is_empty() || self.health.is_broken() {
            return;
        }
        let sends: Vec<(&CudaSlice<u8>, usize)> = staged.iter().map(|(p, b)| (b, *p)).collect();
        // A failure breaks the communicator, which is then aborted.
        let _ = self.send_recv_many(&sends, &mut []);
    }

    /// Waits (bounded) until everything enqueued has run.
    fn drain(&self, bound: Duration) -> Result<(), NcclError> {
        self.device.bind()?;
        let work = self.track("drain")?;
        work.wait_timeout(bound)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        self.close_inner();
    }
}

impl Topology for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_size(&self) -> usize {
        self.local_size
    }
}
