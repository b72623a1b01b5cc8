//! Executing a [`DeviceTransaction`]: resolve every buffer's address,
//! issue one NCCL group, the copy-engine round and the destructive
//! all-to-all steps, then signal.

use crate::copy_plan::Post;
use crate::error::NcclError;
use crate::plan;
use crate::reduce_plan::ReducePlan;
use crate::safe::raw_comm::{grouped, RawComm};
use crate::safe::transaction::{DeviceTransaction, Item};
use crate::safe::work::Work;
use cudarc::driver::{sys::CUdeviceptr, CudaEvent, CudaStream, SyncOnDrop};
use kolo_transport::Topology;
use std::time::Duration;

/// An item with its device addresses resolved.
#[derive(Clone, Copy)]
enum Resolved {
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        plan: ReducePlan,
        in_place: bool,
    },
    AllGather {
        send: u64,
        recv: u64,
        bytes: usize,
    },
    Send {
        ptr: u64,
        bytes: usize,
        peer: usize,
    },
    Recv {
        ptr: u64,
        bytes: usize,
        peer: usize,
    },
    Destructive {
        base: u64,
        block: usize,
    },
}

impl DeviceTransaction<'_> {
    /// Issues everything: one NCCL group, the copy-engine round (thread
    /// mode with copy engines), the destructive all-to-all steps; in
    /// thread mode without a copy-engine round, a CPU barrier among the
    /// threads keeps their launch queues in step (LLMQ). Returns the
    /// handle of the whole transaction.
    pub fn execute(self) -> Result<Work, NcclError> {
        self.execute_inner(None)
    }

    /// As [`Self::execute`], then records `signal` (an event of this
    /// device's context) on the communication stream, for the caller's
    /// stream to wait on.
    pub fn execute_and_signal(self, signal: &CudaEvent) -> Result<Work, NcclError> {
        self.execute_inner(Some(signal))
    }

    fn execute_inner(self, signal: Option<&CudaEvent>) -> Result<Work, NcclError> {
        let DeviceTransaction { comm, mut items } = self;
        let what = format!("transaction of {} operations", items.len());
        let (rank, size) = (comm.rank(), comm.size());
        comm.run(what, |comm| {
            let stream = comm.device.stream().clone();
            let mut guards = Vec::new();
            let mut resolved = Vec::with_capacity(items.len());
            for item in items.iter_mut() {
                resolved.push(resolve(item, rank, &stream, &mut guards));
            }
            // Prescales run before the group (in place, or into scratch
            // memory freed in stream order after it), postscales after.
            let mut scratch = Vec::new();
            for r in resolved.iter_mut() {
                if let Resolved::ReduceScatter {
                    send,
                    count,
                    plan,
                    in_place,
                    ..
                } = r
                {
                    if let Some(factor) = plan.prescale {
                        let whole = size * *count;
                        let dst = if *in_place {
                            *send
                        } else {
                            let (buf, ptr) = comm.scratch(whole * plan.elem.size())?;
                            scratch.push(buf);
                            ptr
                        };
                        // SAFETY: `send` spans `size * count` elements of
                        // this device (checked when scheduled), as does the
                        // destination (the same buffer, or scratch of that
                        // size); both live until the stream reaches the kernel.
                        unsafe { comm.scale_on_stream(plan.elem, dst, *send, whole, factor) }?;
                        *send = dst;
                    }
                }
            }
            let use_copy = comm.copy.is_some();
            let raw = comm.raw()?;
            let nccl: Vec<&Resolved> = resolved
                .iter()
                .filter(|r| match r {
                    Resolved::ReduceScatter { .. } => true,
                    Resolved::AllGather { .. } | Resolved::Send { .. } | Resolved::Recv { .. } => {
                        !use_copy
                    }
                    Resolved::Destructive { .. } => false,
                })
                .collect();
            if !nccl.is_empty() {
                issue_group(&raw, &nccl, &stream)?;
            }
            for r in &resolved {
                if let Resolved::ReduceScatter {
                    recv, count, plan, ..
                } = *r
                {
                    if let Some(factor) = plan.postscale {
                        // SAFETY: `recv` spans `count` elements (checked when
                        // scheduled), alive until the stream reaches the kernel.
                        unsafe { comm.scale_on_stream(plan.elem, recv, recv, count, factor) }?;
                    }
                }
            }
            drop(scratch);
            if let Some(copy) = &comm.copy {
                let mut gathers = Vec::new();
                let (mut sends, mut recvs) = (Vec::new(), Vec::new());
                for r in &resolved {
                    match *r {
                        Resolved::AllGather { send, recv, bytes } => {
                            gathers.push((send, recv, bytes as u64))
                        }
                        Resolved::Send { ptr, bytes, peer } => sends.push(Post {
                            peer,
                            ptr,
                            bytes: bytes as u64,
                        }),
                        Resolved::Recv { ptr, bytes, peer } => recvs.push(Post {
                            peer,
                            ptr,
                            bytes: bytes as u64,
                        }),
                        _ => {}
                    }
                }
                copy.round(rank, &stream, &gathers, sends, recvs)?;
            } else if let Some(board) = &comm.board {
                board.allgather(
                    rank,
                    Vec::new(),
                    comm.options().op_timeout.max(Duration::from_secs(1)),
                )?;
            }
            let destructive: Vec<(u64, usize)> = resolved
                .iter()
                .filter_map(|r| match *r {
                    Resolved::Destructive { base, block } => Some((base, block)),
                    _ => None,
                })
                .collect();
            let steps = if destructive.is_empty() {
                Vec::new()
            } else {
                plan::destructive_all_to_all(rank, size)
            };
            for step in steps {
                grouped(|| {
                    for &(base, block) in &destructive {
                        let send = base + (step.send_slot * block) as u64;
                        let recv = base + (step.recv_slot * block) as u64;
                        // SAFETY: both slots lie within the scheduled buffer
                        // (`size` blocks of `block` bytes), alive until the
                        // stream reaches the step (cudarc's events); the
                        // step's peers are ranks.
                        unsafe {
                            raw.send(send, block, step.dst, &stream)?;
                            raw.recv(recv, block, step.src, &stream)
                        }?;
                    }
                    Ok(())
                })?;
            }
            drop(guards);
            if let Some(signal) = signal {
                signal
                    .record(&stream)
                    .map_err(NcclError::on_cuda("cuEventRecord"))?;
            }
            Ok(())
        })
    }
}

/// Resolves `item`'s device addresses; the guards record the buffers'
/// read / write events when dropped (after everything is enqueued).
fn resolve<'s>(
    item: &'s mut Item<'_>,
    rank: usize,
    stream: &'s CudaStream,
    guards: &mut Vec<SyncOnDrop<'s>>,
) -> Resolved {
    let mut keep = |(ptr, guard): (CUdeviceptr, SyncOnDrop<'s>)| {
        guards.push(guard);
        ptr
    };
    match item {
        Item::ReduceScatter {
            send,
            recv,
            count,
            elem,
            plan,
        } => {
            let recv_base = keep(recv.ptr_mut(stream));
            let send_is_none = send.is_none();
            let (send, recv) = match send {
                Some(send) => (keep(send.ptr(stream)), recv_base),
                // In place: NCCL's convention recv = send + rank * count.
                None => (recv_base, recv_base + (rank * *count * *elem) as u64),
            };
            Resolved::ReduceScatter {
                send,
                recv,
                count: *count,
                plan: *plan,
                in_place: send_is_none,
            }
        }
        Item::AllGather { send, recv, bytes } => {
            let recv = keep(recv.ptr_mut(stream));
            let send = match send {
                Some(send) => keep(send.ptr(stream)),
                None => recv + (rank * *bytes) as u64,
            };
            Resolved::AllGather {
                send,
                recv,
                bytes: *bytes,
            }
        }
        Item::Send { buf, bytes, peer } => Resolved::Send {
            ptr: keep(buf.ptr(stream)),
            bytes: *bytes,
            peer: *peer,
        },
        Item::Recv { buf, bytes, peer } => Resolved::Recv {
            ptr: keep(buf.ptr_mut(stream)),
            bytes: *bytes,
            peer: *peer,
        },
        Item::DestructiveAllToAll { buf, block } => Resolved::Destructive {
            base: keep(buf.ptr_mut(stream)),
            block: *block,
        },
    }
}

/// Issues `items` as one NCCL group; PreMulSum operations are created
/// first and destroyed after the group has ended.
fn issue_group(raw: &RawComm, items: &[&Resolved], stream: &CudaStream) -> Result<(), NcclError> {
    let ops = items
        .iter()
        .map(|item| match **item {
            Resolved::ReduceScatter { plan, .. } => raw.reduction(&plan).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let out = grouped(|| {
        for (item, op) in items.iter().zip(&ops) {
            match (**item, op) {
                (
                    Resolved::ReduceScatter {
                        send,
                        recv,
                        count,
                        plan,
                        ..
                    },
                    Some(op),
                ) => {
                    // SAFETY: `send` spans `size * count` and `recv` `count`
                    // elements of this device (checked when scheduled), alive
                    // until the stream reaches the group; `op` is `raw`'s
                    // and outlives the group.
                    unsafe { raw.reduce_scatter(send, recv, count, plan.dtype, op, stream) }?
                }
                (Resolved::AllGather { send, recv, bytes }, _) => {
                    // SAFETY: `send` spans `bytes`, `recv` `size * bytes` (checked).
                    unsafe { raw.all_gather(send, recv, bytes, stream) }?
                }
                (Resolved::Send { ptr, bytes, peer }, _) => {
                    // SAFETY: `ptr` spans `bytes` (the buffer's size); peer checked.
                    unsafe { raw.send(ptr, bytes, peer, stream) }?
                }
                (Resolved::Recv { ptr, bytes, peer }, _) => {
                    // SAFETY: `ptr` spans `bytes` (the buffer's size); peer checked.
                    unsafe { raw.recv(ptr, bytes, peer, stream) }?
                }
                (Resolved::ReduceScatter { .. }, None) | (Resolved::Destructive { .. }, _) => {}
            }
        }
        Ok(())
    });
    drop(ops);
    out
}
