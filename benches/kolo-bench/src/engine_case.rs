//! One rank's buffers for one [`Spec`] in engine mode: the same arrays as
//! direct mode, split into K tensors (`t0`, `t1`, ...) that are submitted
//! together as one step and then waited for, so the engine can fuse them.
//!
//! Each tensor takes part i of every rank block (of the whole buffer for
//! allreduce and broadcast); the results are put back where direct mode
//! would have them, so the same reference checks them.

use crate::case::wrong_elements;
use crate::op::BenchOp;
use crate::reference::Spec;
use kolo::{Element, Error, Handle, Kolo, TensorMut};
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

/// How a step submits its allreduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Submission {
    /// One grouped allreduce instead of K separate ones.
    pub grouped: bool,
    /// Inside a `Kolo::scope`: the engine reduces the buffers in place.
    pub scoped: bool,
    /// The grouped allreduce's names as one `kolo::TensorGroup` (with
    /// `grouped` and `scoped`), submitted with the blocking
    /// `Kolo::allreduce_group`.
    pub tensor_group: bool,
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
    /// As in direct mode: the send buffer, or the pristine in-place input.
    send: Vec<T>,
    /// As in direct mode: where the results land.
    recv: Vec<T>,
    /// Reduce-scatter and alltoall inputs: tensor i is part i of every
    /// block of `send`, block after block.
    staged: Vec<Vec<T>>,
    /// Gathered outputs waiting to be put in place (after the timing).
    pending: Vec<Vec<T>>,
}

impl<T: Element> EngineCase<T> {
    /// Rank `rank`'s buffers for `spec` split into `tensors` tensors; `None`
    /// when a tensor would be empty (a size smaller than `tensors` elements
    /// per rank block).
    pub fn new(
        spec: Spec,
        rank: usize,
        tensors: usize,
        submission: Submission,
    ) -> Option<EngineCase<T>> {
        let layout = spec.layout;
        let split_len = match spec.op {
            BenchOp::Allreduce | BenchOp::Broadcast | BenchOp::Sendrecv => layout.count,
            _ => layout.block,
        };
        if tensors == 0 || split_len < tensors {
            return None;
        }
        let parts = partition(split_len, tensors);
        let send: Vec<T> = (0..layout.send)
            .map(|i| T::from_f64(spec.send_value(rank, i)))
            .collect();
        let recv = match spec.op {
            BenchOp::Allreduce | BenchOp::Broadcast => send.clone(),
            _ => vec![T::default(); layout.recv],
        };
        let staged = match spec.op {
            BenchOp::Reducescatter | BenchOp::Alltoall => parts
                .iter()
                .map(|part| {
                    (0..spec.ranks)
                        .flat_map(|q| {
                            &send[q * layout.block + part.start..q * layout.block + part.end]
                        })
                        .copied()
                        .collect()
                })
                .collect(),
            _ => Vec::new(),
        };
        let names: Vec<String> = (0..tensors).map(|i| format!("t{i}")).collect();
        // Only when asked; t0, t1, ... are distinct, so it cannot be refused.
        let group = if submission.tensor_group {
            Some(kolo::TensorGroup::new(&names).ok()?)
        } else {
            None
        };
        Some(EngineCase {
            spec,
            rank,
            submission,
            names,
            group,
            parts,
            send,
            recv,
            staged,
            pending: Vec::new(),
        })
    }

    /// Prepares the next step (untimed), as [`crate::case::Case::prepare`].
    pub fn prepare(&mut self, last: bool) {
        match self.spec.op {
            BenchOp::Allreduce => self.recv.copy_from_slice(&self.send),
            BenchOp::Broadcast if last => self.recv.copy_from_slice(&self.send),
            _ if last => self.recv.fill(T::default()),
            _ => {}
        }
    }

    /// One step: submits every tensor, then waits for all of them.
    pub fn step(&mut self, kolo: &Kolo) -> Result<(), Error> {
        let op = self.spec.redop;
        match self.spec.op {
            BenchOp::Allreduce if self.submission.scoped => {
                let slices = split_mut(&mut self.recv, &self.parts);
                let (names, group) = (&self.names, &self.group);
                let grouped = self.submission.grouped;
                if let Some(group) = group {
                    let mut slices = slices;
                    return kolo.allreduce_group(group, &mut slices, op);
                }
                kolo.scope(|s| {
                    if grouped {
                        let views = names
                            .iter()
                            .map(String::as_str)
                            .zip(slices.into_iter().map(TensorMut::from));
                        return s.grouped_allreduce_async(views, op)?.wait();
                    }
                    let handles = names
                        .iter()
                        .zip(slices)
                        .map(|(name, slice)| s.allreduce_async(name, slice, op))
                        .collect::<Result<Vec<_>, _>>()?;
                    wait_all(handles).map(drop)
                })
            }
            BenchOp::Allreduce if self.submission.grouped => {
                let views = self.names.iter().map(String::as_str).zip(
                    split_mut(&mut self.recv, &self.parts)
                        .into_iter()
                        .map(TensorMut::from),
                );
                kolo.grouped_allreduce_async(views, op)?.wait()
            }
            BenchOp::Allreduce => {
                let slices = split_mut(&mut self.recv, &self.parts);
                let handles = self
                    .names
                    .iter()
                    .zip(slices)
                    .map(|(name, slice)| kolo.allreduce_async(name, slice, op))
                    .collect::<Result<Vec<_>, _>>()?;
                wait_all(handles).map(drop)
            }
            BenchOp::Broadcast => {
                let slices = split_mut(&mut self.recv, &self.parts);
                let handles = self
                    .names
                    .iter()
                    .zip(slices)
                    .map(|(name, slice)| kolo.broadcast_async(name, slice, 0))
                    .collect::<Result<Vec<_>, _>>()?;
                wait_all(handles).map(drop)
            }
            BenchOp::Allgather => {
                let handles = self
                    .names
                    .iter()
                    .zip(&self.parts)
                    .map(|(name, part)| kolo.allgather_async(name, &self.send[part.clone()]))
                    .collect::<Result<Vec<_>, _>>()?;
                self.pending = wait_all(handles)?;
                Ok(())
            }
            BenchOp::Reducescatter => {
                let slices = split_mut(&mut self.recv, &self.parts);
                let handles = self
                    .names
                    .iter()
                    .zip(&self.staged)
                    .zip(slices)
                    .map(|((name, input), out)| kolo.reduce_scatter_async(name, input, out, op))
                    .collect::<Result<Vec<_>, _>>()?;
                wait_all(handles).map(drop)
            }
            BenchOp::Alltoall => {
                let n = self.spec.ranks;
                let handles = self
                    .names
                    .iter()
                    .zip(&self.staged)
                    .zip(&self.parts)
                    .map(|((name, input), part)| {
                        kolo.alltoall_async(name, input, &vec![part.len(); n])
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.pending = wait_all(handles)?.into_iter().map(|r| r.data).collect();
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
