//! Device transactions (LLMQ): begin after a ready event or a stream,
//! schedule reduce-scatters, all-gathers, sends, receives and destructive
//! all-to-alls, then execute them as one NCCL group (plus one copy-engine
//! round in thread mode) and signal a done event the caller's stream can
//! wait on.
//!
//! Every rank executes its transaction (possibly empty) when copy engines
//! are on: the copy-engine round is collective. The destructive
//! all-to-all runs after the group as `size - 1` grouped steps (see
//! [`crate::plan::destructive_all_to_all`]) and always through NCCL.

use crate::error::NcclError;
use crate::reduce_plan::{plan_reduce, ReducePlan};
use crate::safe::comm::NcclComm;
use cudarc::driver::{
    sys::CUdeviceptr, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop,
};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Scale, Topology};
use std::marker::PhantomData;

/// A read-only device buffer with its element type erased.
pub(crate) trait ErasedBuf {
    fn ptr<'s>(&'s self, stream: &'s CudaStream) -> (CUdeviceptr, SyncOnDrop<'s>);
}

/// A writable device buffer with its element type erased.
pub(crate) trait ErasedBufMut {
    fn ptr_mut<'s>(&'s mut self, stream: &'s CudaStream) -> (CUdeviceptr, SyncOnDrop<'s>);
}

struct Ro<'a, T, D>(&'a D, PhantomData<T>);
struct Rw<'a, T, D>(&'a mut D, PhantomData<T>);

impl<T, D: DevicePtr<T>> ErasedBuf for Ro<'_, T, D> {
    fn ptr<'s>(&'s self, stream: &'s CudaStream) -> (CUdeviceptr, SyncOnDrop<'s>) {
        self.0.device_ptr(stream)
    }
}

impl<T, D: DevicePtrMut<T>> ErasedBufMut for Rw<'_, T, D> {
    fn ptr_mut<'s>(&'s mut self, stream: &'s CudaStream) -> (CUdeviceptr, SyncOnDrop<'s>) {
        self.0.device_ptr_mut(stream)
    }
}

/// One scheduled operation. `send: None` means in place within `recv`.
pub(crate) enum Item<'a> {
    ReduceScatter {
        send: Option<Box<dyn ErasedBuf + 'a>>,
        recv: Box<dyn ErasedBufMut + 'a>,
        count: usize,
        elem: usize,
        plan: ReducePlan,
    },
    AllGather {
        send: Option<Box<dyn ErasedBuf + 'a>>,
        recv: Box<dyn ErasedBufMut + 'a>,
        bytes: usize,
    },
    Send {
        buf: Box<dyn ErasedBuf + 'a>,
        bytes: usize,
        peer: usize,
    },
    Recv {
        buf: Box<dyn ErasedBufMut + 'a>,
        bytes: usize,
        peer: usize,
    },
    DestructiveAllToAll {
        buf: Box<dyn ErasedBufMut + 'a>,
        block: usize,
    },
}

/// Operations collected on one communicator, issued together by
/// [`DeviceTransaction::execute`]. Created by [`NcclComm::begin`] and its
/// `begin_after_*` variants.
pub struct DeviceTransaction<'a> {
    pub(crate) comm: &'a mut NcclComm,
    pub(crate) items: Vec<Item<'a>>,
}

impl NcclComm {
    /// Begins a transaction; its operations wait for everything enqueued on
    /// the communication stream before.
    pub fn begin(&mut self) -> Result<DeviceTransaction<'_>, NcclError> {
        self.check_health()?;
        Ok(DeviceTransaction {
            comm: self,
            items: Vec::new(),
        })
    }

    /// Begins a transaction whose operations wait, on the GPU, for `ready`.
    pub fn begin_after_event(
        &mut self,
        ready: &CudaEvent,
    ) -> Result<DeviceTransaction<'_>, NcclError> {
        self.wait_event(ready)?;
        self.begin()
    }

    /// Begins a transaction whose operations wait, on the GPU, for the work
    /// enqueued on `stream` so far.
    pub fn begin_after_stream(
        &mut self,
        stream: &CudaStream,
    ) -> Result<DeviceTransaction<'_>, NcclError> {
        self.wait_stream(stream)?;
        self.begin()
    }
}

impl<'a> DeviceTransaction<'a> {
    fn size(&self) -> usize {
        self.comm.size()
    }

    fn even(&self, what: &str, whole: usize, part: usize) -> Result<(), NcclError> {
        crate::plan::even_blocks(what, self.size(), whole, part)
    }

    /// Schedules an even reduce-scatter: `send` (`size * recv.len()`
    /// elements) reduced, block `rank` into `recv`.
    pub fn reduce_scatter<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &mut self,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<&mut Self, NcclError> {
        self.comm.check_device(send, "reduce_scatter send buffer")?;
        self.comm.check_device(recv, "reduce_scatter recv buffer")?;
        self.even("reduce_scatter", send.len(), recv.len())?;
        let plan = plan_reduce(T::DTYPE, op, scale, self.size())?;
        self.comm.prepare_kernels(&plan)?;
        let count = recv.len();
        self.push(
            Item::ReduceScatter {
                send: Some(Box::new(Ro(send, PhantomData))),
                recv: Box::new(Rw(recv, PhantomData)),
                count,
                elem: std::mem::size_of::<T>(),
                plan,
            },
            count,
        )
    }

    /// Schedules an even reduce-scatter of `count` elements per rank of the
    /// run-time `dtype`, held in buffers of any static type.
    pub(crate) fn reduce_scatter_dyn<U: 'a, S: DevicePtr<U>, R: DevicePtrMut<U>>(
        &mut self,
        send: &'a S,
        recv: &'a mut R,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
    ) -> Result<&mut Self, NcclError> {
        let elem = dtype.size();
        if send.num_bytes() < count * elem * self.size() || recv.num_bytes() < count * elem {
            return Err(NcclError::InvalidArgument(format!(
                "reduce_scatter of {count} {dtype} per rank: send has {} bytes, recv {}",
                send.num_bytes(),
                recv.num_bytes()
            )));
        }
        let plan = plan_reduce(dtype, op, Scale::NONE, self.size())?;
        self.comm.prepare_kernels(&plan)?;
        self.push(
            Item::ReduceScatter {
                send: Some(Box::new(Ro(send, PhantomData))),
                recv: Box::new(Rw(recv, PhantomData)),
                count,
                elem,
                plan,
            },
            count * elem,
        )
    }

    /// Schedules an in-place reduce-scatter of `buf` (`size` equal blocks):
    /// afterwards block `rank` holds the reduced block (LLMQ's gradient
    /// sharding); the other blocks are unspecified.
    pub fn reduce_scatter_in_place<T: Element, B: DevicePtrMut<T>>(
        &mut self,
        buf: &'a mut B,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<&mut Self, NcclError> {
        self.comm.check_device(buf, "reduce_scatter buffer")?;
        let count = buf.len() / self.size();
        self.even("reduce_scatter", buf.len(), count)?;
        let plan = plan_reduce(T::DTYPE, op, scale, self.size())?;
        self.comm.prepare_kernels(&plan)?;
        self.push(
            Item::ReduceScatter {
                send: None,
                recv: Box::new(Rw(buf, PhantomData)),
                count,
                elem: std::mem::size_of::<T>(),
                plan,
            },
            count,
        )
    }

    /// Schedules an even all-gather of every rank's `send` into `recv`.
    pub fn all_gather<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &mut self,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<&mut Self, NcclError> {
        self.comm.check_device(send, "all_gather send buffer")?;
        self.comm.check_device(recv, "all_gather recv buffer")?;
        self.even("all_gather", recv.len(), send.len())?;
        let bytes = send.num_bytes();
        self.push(
            Item::AllGather {
                send: Some(Box::new(Ro(send, PhantomData))),
                recv: Box::new(Rw(recv, PhantomData)),
                bytes,
            },
            bytes,
        )
    }

    /// Schedules an in-place all-gather: block `rank` of `buf` is sent,
    /// every other block received (LLMQ's weight gathering).
    pub fn all_gather_in_place<T: Element, B: DevicePtrMut<T>>(
        &mut self,
        buf: &'a mut B,
    ) -> Result<&mut Self, NcclError> {
        self.comm.check_device(buf, "all_gather buffer")?;
        let count = buf.len() / self.size();
        self.even("all_gather", buf.len(), count)?;
        self.push(
            Item::AllGather {
                send: None,
                recv: Box::new(Rw(buf, PhantomData)),
                bytes: count * std::mem::size_of::<T>(),
            },
            count,
        )
    }

    /// Schedules a send of `buf` to `peer` (matched in order by the peer's
    /// receives from this rank).
    pub fn send<T: Element, S: DevicePtr<T>>(
        &mut self,
        buf: &'a S,
        peer: usize,
    ) -> Result<&mut Self, NcclError> {
        self.comm.check_device(buf, "send buffer")?;
        self.check_peer(peer)?;
        let bytes = buf.num_bytes();
        self.push(
            Item::Send {
                buf: Box::new(Ro(buf, PhantomData)),
                bytes,
                peer,
            },
            bytes,
        )
    }

    /// Schedules a receive of `buf.len()` elements from `peer`.
    pub fn recv<T: Element, R: DevicePtrMut<T>>(
        &mut self,
        buf: &'a mut R,
        peer: usize,
    ) -> Result<&mut Self, NcclError> {
        self.comm.check_device(buf, "recv buffer")?;
        self.check_peer(peer)?;
        let bytes = buf.num_bytes();
        self.push(
            Item::Recv {
                buf: Box::new(Rw(buf, PhantomData)),
                bytes,
                peer,
            },
            bytes,
        )
    }

    /// Schedules LLMQ's destructive all-to-all of `buf` (`size` blocks,
    /// block p for rank p): this rank's own block is not preserved and the
    /// block from rank s lands in slot [`crate::destructive_slot`].
    pub fn destructive_all_to_all<T: Element, B: DevicePtrMut<T>>(
        &mut self,
        buf: &'a mut B,
    ) -> Result<&mut Self, NcclError> {
        self.comm.check_device(buf, "all_to_all buffer")?;
        let count = buf.len() / self.size();
        self.even("destructive all_to_all", buf.len(), count)?;
        self.push(
            Item::DestructiveAllToAll {
                buf: Box::new(Rw(buf, PhantomData)),
                block: count * std::mem::size_of::<T>(),
            },
            count,
        )
    }

    /// Schedules `item` unless it moves nothing (every rank skips the same
    /// empty collectives; both ends skip an empty message).
    fn push(&mut self, item: Item<'a>, bytes: usize) -> Result<&mut Self, NcclError> {
        if bytes > 0 {
            self.items.push(item);
        }
        Ok(self)
    }

    fn check_peer(&self, peer: usize) -> Result<(), NcclError> {
        if peer >= self.size() {
            return Err(NcclError::InvalidArgument(format!(
                "transaction peer {peer} of {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    /// Number of scheduled operations.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}
