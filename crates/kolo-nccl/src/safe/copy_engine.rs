//! Copy-engine collectives for thread mode: all-gather and send/recv as
//! device-to-device copies between the GPUs of one process
//! (`cuMemcpyPeerAsync` over NVLink / PCIe), run by the DMA engines,
//! leaving the SMs to compute.
//!
//! Direct GPU-to-GPU copies need two grants, made once per communicator:
//! peer access between the contexts (`cuCtxEnablePeerAccess`, for memory
//! from `cuMemAlloc`) and access of every peer device to this device's
//! stream-ordered memory pools (`cuMemPoolSetAccess`, for memory from
//! `cuMemAllocAsync`, where cudarc allocates). Without the second the
//! driver silently stages every peer copy through the host, at a fraction
//! of the NVLink bandwidth.
//!
//! One *round* moves everything of a transaction (or one all-gather):
//!
//! 1. record this rank's `ready` event (its buffers are ready) and post its
//!    pointers, sizes and the event through the [`Board`];
//! 2. every rank checks every rank's posts (so all reach the same verdict,
//!    see [`crate::copy_plan`]) and pulls its data: the copies from each
//!    source rank run on that source's own *lane* (a stream of this rank),
//!    which waits on the GPU for this rank's and the source's `ready`
//!    events, so the copies from every peer and the local ones overlap,
//!    and every GPU pulls at once (both directions of each link busy);
//! 3. the communication stream waits for every lane, records `done`, the
//!    ranks swap `done` events through the board, and the stream waits on
//!    the GPU for every peer's `done`: no rank reuses a buffer a peer is
//!    still reading. The CPU never waits for the GPU.
//!
//! The events are dedicated to the communicator, not pooled: a rank
//! re-records `ready` only after the next board round, which every peer
//! enters after issuing its waits on the previous record (the same holds
//! for `done`; a lane's `joined` event is waited on right after it is
//! recorded), so no wait ever sees a later record than intended.

use crate::board::Board;
use crate::copy_plan::{plan_pulls, Post, Posts, Pull};
use crate::error::NcclError;
use crate::result::driver;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;
use std::time::Duration;

/// One stream of this rank that carries the copies from one source rank.
struct Lane {
    stream: Arc<CudaStream>,
    /// Recorded after the lane's copies; the communication stream waits on it.
    joined: CudaEvent,
}

/// The thread-mode state for copy-engine rounds.
pub(crate) struct CopyEngines {
    board: Arc<Board>,
    /// Every rank's context, by rank (this rank's own included).
    peers: Vec<Arc<CudaContext>>,
    /// One lane per source rank (this rank's own for local copies).
    lanes: Vec<Lane>,
    /// Per rank: whether this device reaches its memory directly (peer to
    /// peer); otherwise the driver stages those copies.
    direct: Vec<bool>,
    ready: CudaEvent,
    done: CudaEvent,
    timeout: Duration,
}

impl CopyEngines {
    /// Retains every peer device's primary context, enables peer access
    /// from `ctx` and lets every peer device reach this device's memory
    /// pools where the hardware allows (otherwise copies still work,
    /// staged by the driver), and creates one lane per rank at `priority`.
    /// Leaves `ctx` current. Collective in effect: every rank grants its
    /// own pools, so the communicator is usable once all ranks returned
    /// (`NcclComm::init` agrees on that over the control plane).
    pub(crate) fn new(
        board: Arc<Board>,
        ctx: &Arc<CudaContext>,
        ordinals: &[usize],
        timeout: Duration,
        priority: i32,
    ) -> Result<Self, NcclError> {
        let mut peers = Vec::with_capacity(ordinals.len());
        for &ordinal in ordinals {
            if ordinal == ctx.ordinal() {
                peers.push(ctx.clone());
                continue;
            }
            peers.push(
                CudaContext::new(ordinal)
                    .map_err(NcclError::on_cuda("cuDevicePrimaryCtxRetain"))?,
            );
        }
        ctx.bind_to_thread()
            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
        let mut readers = Vec::new();
        let mut direct = vec![true; peers.len()];
        for (rank, peer) in peers.iter().enumerate() {
            if peer.ordinal() == ctx.ordinal() {
                continue;
            }
            direct[rank] = driver::can_access_peer(ctx.cu_device(), peer.cu_device())?;
            if direct[rank] {
                // SAFETY: `peer` is a live (retained) context and `ctx`, the
                // one gaining access, is current on this thread.
                unsafe { driver::enable_peer_access(peer.cu_ctx()) }?;
            }
            let ordinal = peer.ordinal() as std::ffi::c_int;
            if driver::can_access_peer(peer.cu_device(), ctx.cu_device())?
                && !readers.contains(&ordinal)
            {
                readers.push(ordinal);
            }
        }
        if ctx.has_async_alloc() {
            driver::share_pools(ctx.cu_device(), &readers)?;
        }
        let event = || {
            ctx.new_event(None)
                .map_err(NcclError::on_cuda("cuEventCreate"))
        };
        let mut lanes = Vec::with_capacity(peers.len());
        for _ in &peers {
            lanes.push(Lane {
                stream: ctx
                    .new_stream_with_priority(priority)
                    .map_err(NcclError::on_cuda("cuStreamCreateWithPriority"))?,
                joined: event()?,
            });
        }
        Ok(CopyEngines {
            board,
            peers,
            lanes,
            direct,
            ready: event()?,
            done: event()?,
            timeout,
        })
    }

    /// Runs one round (see the module docs) on `stream` of `rank`.
    /// `gathers` are (send pointer, receive pointer, bytes per rank).
    pub(crate) fn round(
        &self,
        rank: usize,
        stream: &CudaStream,
        gathers: &[(u64, u64, u64)],
        sends: Vec<Post>,
        recvs: Vec<Post>,
    ) -> Result<(), NcclError> {
        let out = self.round_inner(rank, stream, gathers, sends, recvs);
        if out.is_err() {
            // Peers waiting in the board must not wait out the timeout.
            self.board.leave(rank);
        }
        out
    }

    fn round_inner(
        &self,
        rank: usize,
        stream: &CudaStream,
        gathers: &[(u64, u64, u64)],
        sends: Vec<Post>,
        recvs: Vec<Post>,
    ) -> Result<(), NcclError> {
        self.ready
            .record(stream)
            .map_err(NcclError::on_cuda("cuEventRecord"))?;
        let mine = Posts {
            ready_event: self.ready.cu_event() as u64,
            gathers: gathers
                .iter()
                .map(|&(src, _, bytes)| (src, bytes))
                .collect(),
            sends,
            recvs,
        };
        let all = self.board.allgather(rank, mine.encode(), self.timeout)?;
        let posts = all
            .iter()
            .map(|b| Posts::decode(b))
            .collect::<Result<Vec<_>, _>>()?;
        let dsts: Vec<u64> = gathers.iter().map(|&(_, dst, _)| dst).collect();
        let pulls = plan_pulls(rank, &posts, &dsts)?;
        for (source, peer_posts) in posts.iter().enumerate() {
            let copies: Vec<&Pull> = pulls
                .iter()
                .filter(|p| p.src_rank == source && !(source == rank && p.src == p.dst))
                .collect();
            if copies.is_empty() {
                continue;
            }
            self.pull_from(source, rank, peer_posts.ready_event, &copies, stream)?;
        }
        self.done
            .record(stream)
            .map_err(NcclError::on_cuda("cuEventRecord"))?;
        let dones = self.board.allgather(
            rank,
            (self.done.cu_event() as u64).to_le_bytes().to_vec(),
            self.timeout,
        )?;
        for (p, event) in dones.iter().enumerate().filter(|(p, _)| *p != rank) {
            let handle = <[u8; 8]>::try_from(event.as_slice())
                .map(u64::from_le_bytes)
                .map_err(|_| {
                    NcclError::InvalidArgument(format!("rank {p} posted a malformed done event"))
                })?;
            // SAFETY: the stream is live; the handle is the peer's `done`
            // event, alive while its communicator is (it is inside this
            // round, and its next `done` record comes after the next board
            // round).
            unsafe { driver::stream_wait(stream.cu_stream(), handle as sys::CUevent) }?;
        }
        Ok(())
    }

    /// Issues `copies` from rank `source` on its lane, after this rank's
    /// and the source's `ready` events; `stream` waits for them.
    fn pull_from(
        &self,
        source: usize,
        rank: usize,
        source_ready: u64,
        copies: &[&Pull],
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let missing = || NcclError::InvalidArgument(format!("no lane for rank {source}"));
        let lane = self.lanes.get(source).ok_or_else(missing)?;
        let src_ctx = self.peers.get(source).ok_or_else(missing)?;
        let own = self.own()?;
        lane.stream
            .wait(&self.ready)
            .map_err(NcclError::on_cuda("cuStreamWaitEvent"))?;
        if source != rank {
            // SAFETY: the lane is live; the handle is the source's `ready`
            // event, alive while its communicator is (it is inside this
            // round).
            unsafe { driver::stream_wait(lane.stream.cu_stream(), source_ready as sys::CUevent) }?;
        }
        for pull in copies {
            // SAFETY: `dst` lies in a buffer this rank borrowed for the
            // operation; `src` in one its owner borrowed and keeps readable
            // until it has waited for this rank's `done` event, which
            // follows this lane's `joined`; both were checked to be `bytes`
            // long by `plan_pulls`.
            unsafe {
                driver::copy(
                    own.cu_ctx(),
                    pull.dst,
                    src_ctx.cu_ctx(),
                    pull.src,
                    pull.bytes as usize,
                    lane.stream.cu_stream(),
                )
            }?;
        }
        lane.joined
            .record(&lane.stream)
            .map_err(NcclError::on_cuda("cuEventRecord"))?;
        stream
            .wait(&lane.joined)
            .map_err(NcclError::on_cuda("cuStreamWaitEvent"))
    }

    /// Per rank: whether copies from it go directly GPU to GPU.
    pub(crate) fn direct(&self) -> &[bool] {
        &self.direct
    }

    fn own(&self) -> Result<&Arc<CudaContext>, NcclError> {
        let ordinal = self.ready.context().ordinal();
        self.peers
            .iter()
            .find(|p| p.ordinal() == ordinal)
            .ok_or_else(|| {
                NcclError::InvalidArgument("this rank's context is not among its peers".into())
            })
    }
}
