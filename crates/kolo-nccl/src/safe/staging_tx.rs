//! Host transactions on [`HostStaging`]: every operation staged on the
//! device, issued as one [`crate::DeviceTransaction`], copied back.

use crate::error::NcclError;
use crate::options::CopyEngine;
use crate::safe::staging::{carrier_bytes, from_carrier, HostStaging};
use crate::widen;
use cudarc::driver::CudaSlice;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{byte_view, Controller, Element, Scale, Topology, Transaction, TxOp};

fn uneven(what: &str, size: usize, part: usize, whole: usize) -> NcclError {
    NcclError::InvalidArgument(format!(
        "transaction {what}: {size} blocks of {part} elements do not make {whole}"
    ))
}

/// A host operation of a transaction with its device buffers.
enum Staged<'h, T> {
    ReduceScatter {
        send: CudaSlice<u8>,
        recv: CudaSlice<u8>,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        scale: Scale,
        out: &'h mut [T],
    },
    AllGather {
        send: CudaSlice<u8>,
        recv: CudaSlice<u8>,
        out: &'h mut [T],
    },
    Send {
        buf: CudaSlice<u8>,
        peer: usize,
        bytes: usize,
    },
    Recv {
        buf: CudaSlice<u8>,
        peer: usize,
        out: &'h mut [T],
    },
}

impl<C: Controller + ?Sized> HostStaging<'_, C> {
    pub(crate) fn execute_host<T: Element>(
        &mut self,
        tx: Transaction<'_, T>,
    ) -> Result<(), NcclError> {
        let size = self.comm.size();
        let mut staged = Vec::new();
        for op in tx.into_ops() {
            staged.push(match op {
                TxOp::ReduceScatter {
                    send,
                    recv,
                    op,
                    scale,
                } => {
                    if recv.len().checked_mul(size) != Some(send.len()) {
                        return Err(uneven("reduce_scatter", size, recv.len(), send.len()));
                    }
                    let mut input = send.to_vec();
                    T::scale(&mut input, scale.prescale);
                    let (dtype, bytes) = carrier_bytes(&input);
                    let count = recv.len();
                    Staged::ReduceScatter {
                        send: self.upload(&bytes)?,
                        recv: self.alloc(count * dtype.size())?,
                        dtype,
                        count,
                        op,
                        scale,
                        out: recv,
                    }
                }
                TxOp::AllGather { send, recv } => {
                    if send.len().checked_mul(size) != Some(recv.len()) {
                        return Err(uneven("all_gather", size, send.len(), recv.len()));
                    }
                    let bytes = byte_view::as_bytes(send);
                    Staged::AllGather {
                        send: self.upload(bytes)?,
                        recv: self.alloc(bytes.len() * size)?,
                        out: recv,
                    }
                }
                TxOp::Send { buf, peer, .. } => {
                    self.check_peer(peer)?;
                    let bytes = byte_view::as_bytes(buf);
                    Staged::Send {
                        buf: self.upload(bytes)?,
                        peer,
                        bytes: bytes.len(),
                    }
                }
                TxOp::Recv { buf, peer, .. } => {
                    self.check_peer(peer)?;
                    Staged::Recv {
                        buf: self.alloc(std::mem::size_of_val(buf))?,
                        peer,
                        out: buf,
                    }
                }
            });
        }
        if !self.staged.is_empty() && self.comm.copy_engine() == CopyEngine::On {
            return Err(NcclError::InvalidArgument(
                "a copy-engine transaction cannot carry earlier staged sends; receive them first"
                    .into(),
            ));
        }
        let earlier = self.staged.take_all();
        {
            let mut dtx = self.comm.begin()?;
            for (peer, buf) in &earlier {
                dtx.send(buf, *peer)?;
            }
            for s in staged.iter_mut() {
                match s {
                    Staged::ReduceScatter {
                        send,
                        recv,
                        dtype,
                        count,
                        op,
                        ..
                    } if *count > 0 => {
                        dtx.reduce_scatter_dyn(
                            &*send,
                            recv,
                            *dtype,
                            *count,
                            widen::device_op(*op),
                        )?;
                    }
                    Staged::AllGather { send, recv, out } if !out.is_empty() => {
                        dtx.all_gather(&*send, recv)?;
                    }
                    Staged::Send { buf, peer, bytes } if *bytes > 0 => {
                        dtx.send(&*buf, *peer)?;
                    }
                    Staged::Recv { buf, peer, out } if !out.is_empty() => {
                        dtx.recv(buf, *peer)?;
                    }
                    _ => {}
                }
            }
            dtx.execute()?.wait()?;
        }
        for s in staged {
            match s {
                Staged::ReduceScatter {
                    recv,
                    dtype,
                    count,
                    op,
                    scale,
                    out,
                    ..
                } => {
                    let mut bytes = vec![0u8; count * dtype.size()];
                    self.download(&recv, &mut bytes)?;
                    from_carrier(&bytes, out)
                        .map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
                    T::scale(out, scale.postscale_for(op, size));
                }
                Staged::AllGather { recv, out, .. } | Staged::Recv { buf: recv, out, .. } => {
                    let mut bytes = vec![0u8; std::mem::size_of_val(out)];
                    self.download(&recv, &mut bytes)?;
                    byte_view::copy_from_bytes(out, &bytes)
                        .map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
                }
                Staged::Send { .. } => {}
            }
        }
        Ok(())
    }
}
