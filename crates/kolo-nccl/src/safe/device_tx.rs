//! kolo's transactions on device memory: a `Transaction<T, Cuda>` run as
//! one [`DeviceTransaction`], the staged sends of the device data plane
//! leading its group.

use crate::error::NcclError;
use crate::options::CopyEngine;
use crate::safe::access::{Accesses, Raw};
use crate::safe::comm::NcclComm;
use crate::safe::memory::Cuda;
use crate::safe::transaction::DeviceTransaction;
use cudarc::driver::CudaSlice;
use kolo_protocol::ReduceOp;
use kolo_transport::{Element, Scale, Transaction, TxOp};

/// One operation of the transaction with its memory resolved.
enum Resolved<'v, T> {
    ReduceScatter {
        send: Raw<'v, T>,
        recv: Raw<'v, T>,
        op: ReduceOp,
        scale: Scale,
    },
    AllGather {
        send: Raw<'v, T>,
        recv: Raw<'v, T>,
    },
    Send {
        buf: Raw<'v, T>,
        peer: usize,
    },
    Recv {
        buf: Raw<'v, T>,
        peer: usize,
    },
}

impl NcclComm {
    /// Runs `tx` as one device transaction (one NCCL group, plus the
    /// copy-engine round in thread mode); tags are not matched.
    pub(crate) fn execute_views<T: Element>(
        &mut self,
        tx: Transaction<'_, T, Cuda>,
    ) -> Result<(), NcclError> {
        if !self.staged.is_empty() && self.copy_engine() == CopyEngine::On {
            return Err(NcclError::InvalidArgument(format!(
                "a copy-engine transaction cannot carry the {} sends staged before it; receive them first",
                self.staged.len()
            )));
        }
        let ops = tx.into_ops();
        let mut access = Accesses::new(self)?;
        let mut resolved = Vec::with_capacity(ops.len());
        for op in &ops {
            resolved.push(match op {
                TxOp::ReduceScatter {
                    send,
                    recv,
                    op,
                    scale,
                } => Resolved::ReduceScatter {
                    send: access.read(*send, "reduce_scatter send buffer")?,
                    recv: access.write(recv, "reduce_scatter recv buffer")?,
                    op: *op,
                    scale: *scale,
                },
                TxOp::AllGather { send, recv } => Resolved::AllGather {
                    send: access.read(*send, "all_gather send buffer")?,
                    recv: access.write(recv, "all_gather recv buffer")?,
                },
                TxOp::Send { buf, peer, .. } => Resolved::Send {
                    buf: access.read(*buf, "send buffer")?,
                    peer: *peer,
                },
                TxOp::Recv { buf, peer, .. } => Resolved::Recv {
                    buf: access.write(buf, "recv buffer")?,
                    peer: *peer,
                },
            });
        }
        let earlier = self.staged.take_all();
        let executed = self
            .begin()
            .and_then(|dtx| schedule(dtx, &earlier, &mut resolved))
            .map(DeviceTransaction::execute);
        match executed {
            Ok(work) => {
                work?;
                drop(access);
                Ok(())
            }
            Err(e) => {
                // Nothing was issued: the staged sends wait for the next group.
                self.staged.put_back(earlier);
                Err(e)
            }
        }
    }
}

/// Schedules the staged sends, then every resolved operation, into `dtx`.
fn schedule<'a, T: Element>(
    mut dtx: DeviceTransaction<'a>,
    earlier: &'a [(usize, CudaSlice<u8>)],
    ops: &'a mut [Resolved<'_, T>],
) -> Result<DeviceTransaction<'a>, NcclError> {
    for (peer, buf) in earlier {
        dtx.send(buf, *peer)?;
    }
    for op in ops.iter_mut() {
        match op {
            Resolved::ReduceScatter {
                send,
                recv,
                op,
                scale,
            } => dtx.reduce_scatter(&*send, recv, *op, *scale)?,
            Resolved::AllGather { send, recv } => dtx.all_gather(&*send, recv)?,
            Resolved::Send { buf, peer } => dtx.send(&*buf, *peer)?,
            Resolved::Recv { buf, peer } => dtx.recv(buf, *peer)?,
        };
    }
    Ok(dtx)
}
