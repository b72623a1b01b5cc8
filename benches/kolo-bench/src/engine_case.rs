//! One rank's buffers for one [`Spec`] in engine mode: the same arrays as
//! direct mode, split into K tensors (`t0`, `t1`, ...) that are submitted
//! together as one step and then waited for, so the engine can fuse them.
//!
//! Each tensor takes part i of every rank block (of the whole buffer for
//! allreduce and broadcast); the results are put back where direct mode
//! would have them, so the same reference checks them.

use crate::buffer::{self, Pattern};
use crate::case::wrong_elements;
use crate::error::BenchError;
use crate::op::BenchOp;
use crate::reference::Spec;
use kolo::{Element, Error, Handle, Kolo};
use std::ops::Range;

/// `len` elements split into `parts` contiguous ranges as evenly as
/// possible, the first ranges one longer (kolo's `split_rows`).
pub fn partition(len: usize, parts: usize) -> Vec<Range<usize>> {
    let mut start = 0;
    kolo::split_rows(len, parts)
        .into_iter()
        .map(|n| {
            start += n;
            start - n..start
        })
        .collect()
}

/// Splits `buf` into the disjoint mutable slices `ranges` (contiguous, in
/// order, covering `buf` from its start).
fn split_mut<'a, T>(mut buf: &'a mut [T], ranges: &[Range<usize>]) -> Vec<&'a mut [T]> {
    let mut slices = Vec::with_capacity(ranges.len());
    for range in ranges {
        let at = range.len().min(buf.len());
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(at);
        slices.push(head);
        buf = tail;
    }
    slices
}

/// The elements each tensor takes a part of: the whole buffer for
/// allreduce and broadcast, a rank block for the gathered ops.
fn split_len(spec: &Spec) -> usize {
    match spec.op {
        BenchOp::Allreduce | BenchOp::Broadcast | BenchOp::Sendrecv => spec.layout.count,
        BenchOp::Allgather | BenchOp::Reducescatter | BenchOp::Alltoall => spec.layout.block,
    }
}

/// Why `spec` cannot be split into `tensors` tensors (every rank skips the
/// same sizes), or `None` when it can.
pub fn skip_reason(spec: &Spec, tensors: usize) -> Option<String> {
    let len = split_len(spec);
    if tensors > 0 && len >= tensors {
        return None;
    }
    let what = match spec.op {
        BenchOp::Allreduce | BenchOp::Broadcast | BenchOp::Sendrecv => "element(s)",
        BenchOp::Allgather | BenchOp::Reducescatter | BenchOp::Alltoall => {
            "element(s) per rank block"
        }
    };
    Some(format!(
        "{} B skipped: {len} {what} cannot make {tensors} tensors of at least one element \
         (use fewer --tensors or a larger size)",
        spec.layout.bytes
    ))
}

/// How a step submits its allreduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Submission {
    /// One group (a `kolo::TensorGroup` made once, submitted step after
    /// step in a scope) instead of K separate allreduces.
    pub grouped: bool,
    /// The group submitted with the blocking `Kolo::allreduce_group`
    /// instead (implies `grouped`).
    pub tensor_group: bool,
    /// How allreduce data travels (`--compression`).
    pub compression: kolo::Compression,
}

/// The buffers of one rank for one spec, split into tensors.
#[derive(Debug)]
pub struct EngineCase<T> {
    spec: Spec,
    rank: usize,
    /// How allreduces are submitted.
    submission: Submission,
    names: Vec<String>,
    /// The names as one group (`--tensor-group`).
    group: Option<kolo::TensorGroup>,
    /// Tensor i's part of a rank block (of the whole buffer for allreduce
    /// and broadcast).
    parts: Vec<Range<usize>>,
    /// The input, from which allreduce and broadcast refill `recv`.
    pattern: Pattern<T>,
    /// Allgather's send buffer (empty for the other ops).
    send: Vec<T>,
    /// As in direct mode: where the results land (the in-place buffer of
    /// allreduce and broadcast).
    recv: Vec<T>,
    /// Reduce-scatter and alltoall inputs: tensor i is part i of every
    /// block of this rank's input, block after block.
    staged: Vec<Vec<T>>,
    /// Gathered outputs waiting to be put in place (after the timing).
    pending: Vec<Vec<T>>,
}

impl<T: Element> EngineCase<T> {
    /// Rank `rank`'s buffers for `spec` split into `tensors` tensors;
    /// `Ok(None)` when a tensor would be empty ([`skip_reason`] says why),
    /// an error when the allocator refuses a buffer.
    pub fn new(
        spec: Spec,
        rank: usize,
        tensors: usize,
        submission: Submission,
    ) -> Result<Option<EngineCase<T>>, BenchError> {
        if skip_reason(&spec, tensors).is_some() {
            return Ok(None);
        }
        let layout = spec.layout;
        let parts = partition(split_len(&spec), tensors);
        let pattern = Pattern::new(&spec, rank);
        let send = match spec.op {
            BenchOp::Allgather => buffer::input(&spec, &pattern, 0, layout.send)?,
            _ => Vec::new(),
        };
        let recv = match spec.op {
            BenchOp::Allreduce | BenchOp::Broadcast => {
                buffer::input(&spec, &pattern, 0, layout.recv)?
            }
            _ => buffer::zeroed(&spec, layout.recv)?,
        };
        // Tensor i of reduce-scatter and alltoall: part i of every block.
        let staged = match spec.op {
            BenchOp::Reducescatter | BenchOp::Alltoall => parts
                .iter()
                .map(|part| {
                    let blocks =
                        (0..spec.ranks).map(|q| (q * layout.block + part.start, part.len()));
                    buffer::gathered_input(&spec, &pattern, blocks)
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => Vec::new(),
        };
        let names: Vec<String> = (0..tensors).map(|i| format!("t{i}")).collect();
        let group = if submission.grouped {
            Some(
                kolo::TensorGroup::new(&names).map_err(|source| BenchError::Engine {
                    op: "TensorGroup::new",
                    bytes: layout.bytes,
                    rank,
                    source,
                })?,
            )
        } else {
            None
        };
        Ok(Some(EngineCase {
            spec,
            rank,
            submission,
            names,
            group,
            parts,
            pattern,
            send,
            recv,
            staged,
            pending: Vec::new(),
        }))
    }

    /// Prepares the next step (untimed), as [`crate::case::Case::prepare`].
    pub fn prepare(&mut self, last: bool) {
        match self.spec.op {
            BenchOp::Allreduce => self.pattern.fill(&mut self.recv, 0),
            BenchOp::Broadcast if last => self.pattern.fill(&mut self.recv, 0),
            _ if last => self.recv.fill(T::default()),
            _ => {}
        }
    }

    /// One step: submits every tensor, then waits for all of them.
    pub fn step(&mut self, kolo: &Kolo) -> Result<(), Error> {
        let op = self.spec.redop;
        match self.spec.op {
            BenchOp::Allreduce => {
                let op = kolo::ReduceOptions::new(op).compression(self.submission.compression);
                let slices = split_mut(&mut self.recv, &self.parts);
                if let Some(group) = &self.group {
                    if self.submission.tensor_group {
                        return kolo.allreduce_group(group, slices, op);
                    }
                    return kolo.scope(|s| s.allreduce_group_async(group, slices, op)?.wait());
                }
                let names = &self.names;
                kolo.scope(|s| {
                    let handles = names
                        .iter()
                        .zip(slices)
                        .map(|(name, slice)| s.allreduce_async(name, slice, op))
                        .collect::<Result<Vec<_>, _>>()?;
                    wait_all(handles).map(drop)
                })
            }
            BenchOp::Broadcast => {
                let slices = split_mut(&mut self.recv, &self.parts);
                let names = &self.names;
                kolo.scope(|s| {
                    let handles = names
                        .iter()
                        .zip(slices)
                        .map(|(name, slice)| s.broadcast_async(name, slice, 0))
                        .collect::<Result<Vec<_>, _>>()?;
                    wait_all(handles).map(drop)
                })
            }
            BenchOp::Allgather => {
                let (names, parts, send) = (&self.names, &self.parts, &self.send);
                self.pending = kolo.scope(|s| {
                    let handles = names
                        .iter()
                        .zip(parts)
                        .map(|(name, part)| s.allgather_async(name, &send[part.clone()]))
                        .collect::<Result<Vec<_>, _>>()?;
                    wait_all(handles)
                })?;
                Ok(())
            }
            BenchOp::Reducescatter => {
                let slices = split_mut(&mut self.recv, &self.parts);
                let (names, staged) = (&self.names, &self.staged);
                kolo.scope(|s| {
                    let handles = names
                        .iter()
                        .zip(staged)
                        .zip(slices)
                        .map(|((name, input), out)| s.reduce_scatter_async(name, input, out, op))
                        .collect::<Result<Vec<_>, _>>()?;
                    wait_all(handles).map(drop)
                })
            }
            BenchOp::Alltoall => {
                let n = self.spec.ranks;
                let (names, staged, parts) = (&self.names, &self.staged, &self.parts);
                let received = kolo.scope(|s| {
                    let handles = names
                        .iter()
                        .zip(staged)
                        .zip(parts)
                        .map(|((name, input), part)| {
                            s.alltoall_async(name, input, &vec![part.len(); n])
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    wait_all(handles)
                })?;
                self.pending = received.into_iter().map(|r| r.data).collect();
                Ok(())
            }
            BenchOp::Sendrecv => Err(Error::InvalidArgument {
                tensor: self.names.first().cloned().unwrap_or_default(),
                reason: "sendrecv has no engine operation".to_string(),
            }),
        }
    }

    /// Puts gathered outputs where direct mode has them (untimed): tensor
    /// i brought part i of every rank's block, rank after rank.
    pub fn finish(&mut self) {
        let block = self.spec.layout.block;
        for (out, part) in self.pending.iter().zip(&self.parts) {
            for (q, chunk) in out.chunks(part.len().max(1)).enumerate() {
                let start = q * block + part.start;
                if let Some(dst) = self.recv.get_mut(start..start + chunk.len()) {
                    dst.copy_from_slice(chunk);
                }
            }
        }
        self.pending.clear();
    }

    /// How many elements of the result differ from the reference.
    pub fn wrong(&self) -> u64 {
        wrong_elements(&self.spec, self.rank, &self.recv)
    }
}

/// Waits for every handle, in order; the first error wins.
fn wait_all<O>(handles: Vec<Handle<'_, O>>) -> Result<Vec<O>, Error> {
    handles.into_iter().map(Handle::wait).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_too_small_for_the_tensors_say_why() {
        use kolo_protocol::{DataType, ReduceOp};
        let spec = |op: BenchOp, bytes| Spec {
            op,
            dtype: DataType::F32,
            redop: ReduceOp::Sum,
            layout: op.layout(bytes, 4, 2),
            ranks: 2,
        };
        assert_eq!(skip_reason(&spec(BenchOp::Allreduce, 64), 16), None);
        let why = skip_reason(&spec(BenchOp::Allreduce, 64), 17).unwrap_or_default();
        assert!(
            why.contains("64 B") && why.contains("16 element(s)") && why.contains("17 tensors"),
            "{why}"
        );
        let why = skip_reason(&spec(BenchOp::Allgather, 64), 9).unwrap_or_default();
        assert!(why.contains("8 element(s) per rank block"), "{why}");
        assert!(skip_reason(&spec(BenchOp::Allreduce, 64), 0).is_some());
        let made =
            EngineCase::<f32>::new(spec(BenchOp::Allreduce, 64), 0, 17, Submission::default());
        assert!(matches!(made, Ok(None)));
    }

    proptest! {
        #[test]
        fn partition_covers_in_order(len in 0usize..10_000, parts in 1usize..64) {
            let ranges = partition(len, parts);
            prop_assert_eq!(ranges.len(), parts);
            prop_assert_eq!(ranges[0].start, 0);
            prop_assert_eq!(ranges[parts - 1].end, len);
            for pair in ranges.windows(2) {
                prop_assert_eq!(pair[0].end, pair[1].start);
                prop_assert!(pair[0].len() >= pair[1].len() && pair[0].len() <= pair[1].len() + 1);
            }
        }

        #[test]
        fn split_mut_matches_the_ranges(len in 0usize..1000, parts in 1usize..16) {
            let mut buf: Vec<usize> = (0..len).collect();
            let ranges = partition(len, parts);
            let slices = split_mut(&mut buf, &ranges);
            for (slice, range) in slices.iter().zip(&ranges) {
                prop_assert_eq!(slice.to_vec(), range.clone().collect::<Vec<_>>());
            }
        }
    }
}
