//! The floor under kolo's operations, for the benchmarks: one bare
//! `ncclAllReduce` with none of kolo's bookkeeping, and that bookkeeping
//! added back one piece at a time ([`Bare`]), so a benchmark can say where
//! the time of a small allreduce goes without touching NCCL itself.

use crate::error::NcclError;
use crate::reduce_plan::{NativeOp, NcclType, ReduceKind, ReducePlan};
use crate::safe::comm::NcclComm;
use cudarc::driver::DevicePtrMut;
use kolo_protocol::DataType;

/// What [`NcclComm::bare_all_reduce`] does after its `ncclAllReduce`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bare {
    /// Nothing: NCCL's own cost on this machine and mode.
    Call,
    /// Records one pooled event on the stream (what tracking an
    /// operation's completion costs the enqueuing thread).
    RecordEvent,
    /// kolo's whole tracking: the event record and a [`crate::Work`]
    /// handed to the completion thread (which polls it), then dropped.
    Track,
}

impl NcclComm {
    /// For benchmarks: one in-place f32 sum `ncclAllReduce` of `buf` on the
    /// communication stream, without what [`NcclComm::all_reduce`] adds
    /// (health check, context bind, planning, completion tracking unless
    /// `then` asks for it). cudarc still orders `buf` by its events, which
    /// cost nothing for a buffer allocated with event tracking off. Not
    /// part of the API: it exists so the benchmark's baseline needs no raw
    /// NCCL handle.
    #[doc(hidden)]
    pub fn bare_all_reduce(
        &mut self,
        buf: &mut impl DevicePtrMut<f32>,
        then: Bare,
    ) -> Result<(), NcclError> {
        self.check_device(buf, "bare allreduce buffer")?;
        let count = buf.len();
        let plan = ReducePlan {
            elem: DataType::F32,
            dtype: NcclType::Float32,
            kind: ReduceKind::Native(NativeOp::Sum),
            prescale: None,
            postscale: None,
        };
        let stream = self.device.stream().clone();
        let raw = self.raw()?;
        let op = raw.reduction(&plan)?;
        let (ptr, written) = buf.device_ptr_mut(&stream);
        // SAFETY: `ptr` holds `count` f32 of this device (checked), alive
        // until the stream reaches the call (cudarc's events, recorded when
        // `written` drops); `op` is `raw`'s built-in sum.
        let enqueued = unsafe { raw.all_reduce(ptr, ptr, count, plan.dtype, &op, &stream) };
        drop(written);
        if let Err(e) = enqueued {
            self.health.fail(&e);
            return Err(e);
        }
        match then {
            Bare::Call => Ok(()),
            Bare::RecordEvent => self.device.record().map(drop),
            Bare::Track => self.track("bare allreduce").map(drop),
        }
    }
}
