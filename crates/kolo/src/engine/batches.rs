//! The submissions whose tensors the background thread holds.
//!
//! A submission (one call: a tensor or a group) has one [`Completion`],
//! shared with its handle. The background thread keeps one reference per
//! submission here and refers to each of its tensors by [`PartRef`] (the
//! submission's key and the tensor's index): no reference count is touched
//! per tensor, and completing a fused run of one submission's tensors
//! takes its lock once. A submission whose tensors the engine drops
//! unperformed (its thread unwinds) fails them when its record here is
//! dropped, so no handle — and no scope waiting for lent memory — is left
//! waiting.

use crate::engine::completion::{Completion, Part, Payload};
use crate::engine::submission::Input;
use crate::engine::submission::{Inputs, Ready};
use crate::error::Error;
use kolo_coordinator::TensorId;
use std::sync::Arc;

/// One tensor of a held submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartRef {
    batch: u32,
    index: u32,
}

/// A submission, its tensors' inputs, and how many of its tensors are
/// still the engine's to complete.
struct Batch {
    completion: Arc<Completion>,
    /// The tensors, in part order (shared with the table's group memo for
    /// a repeated group).
    ids: Arc<[TensorId]>,
    inputs: Inputs,
    open: usize,
    /// No part was taken, completed or handed on yet: the submission can
    /// still be performed whole (see [`Batches::claim_whole`]).
    whole: bool,
}

/// The claim on a held submission that is performed whole, in one
/// collective over all of its tensors: made only by
/// [`Batches::claim_whole`], while no part of it was taken or completed,
/// so that a whole collective never covers a tensor already done.
///
/// The collective covers the tensors in the order every rank agreed on
/// (the responses'), which need not be this rank's submission order: a
/// cache whose slots were reused hands a group's hits back rotated.
#[derive(Debug)]
pub(crate) struct Whole {
    key: u32,
    order: Order,
}

/// The part performed at each position of a whole collective, where that
/// is not simply part i at position i.
pub(crate) type Order = Option<Arc<[u32]>>;

impl Whole {
    /// The claimed submission's key.
    pub(crate) fn key(&self) -> u32 {
        self.key
    }

    /// The order of its parts in the collective.
    pub(crate) fn order(&self) -> &Order {
        &self.order
    }
}

/// `items` (one per part, in part order) in the collective's `order`.
pub(crate) fn arrange<X>(order: &Order, items: Vec<X>) -> Vec<X> {
    let Some(order) = order else {
        return items;
    };
    let mut items: Vec<Option<X>> = items.into_iter().map(Some).collect();
    order
        .iter()
        .filter_map(|&part| items.get_mut(part as usize).and_then(Option::take))
        .collect()
}

impl Drop for Batch {
    fn drop(&mut self) {
        if self.open > 0 {
            self.completion.fail_open(|tensor| Error::Collective {
                tensor: tensor.to_owned(),
                message: "internal: the engine dropped the tensor without performing it".into(),
            });
        }
    }
}

/// The held submissions, by key.
#[derive(Default)]
pub(crate) struct Batches {
    slots: Vec<Option<Batch>>,
    free: Vec<u32>,
}

impl Batches {
    /// Holds `completion`, whose tensors `ids` (with `inputs`) the engine
    /// now completes; returns its key.
    pub(crate) fn add(
        &mut self,
        completion: Arc<Completion>,
        ids: Arc<[TensorId]>,
        inputs: Inputs,
    ) -> u32 {
        let batch = Some(Batch {
            completion,
            open: ids.len(),
            ids,
            inputs,
            whole: true,
        });
        match self.free.pop() {
            Some(key) => {
                self.slots[key as usize] = batch;
                key
            }
            None => {
                self.slots.push(batch);
                self.slots.len() as u32 - 1
            }
        }
    }

    /// Tensor `index` of the submission `key`.
    pub(crate) fn part(key: u32, index: u32) -> PartRef {
        PartRef { batch: key, index }
    }

    /// The submission and index of `part`.
    pub(crate) fn locate(part: PartRef) -> (u32, u32) {
        (part.batch, part.index)
    }

    /// The tensors of submission `key`, in part order.
    pub(crate) fn ids(&self, key: u32) -> Option<&Arc<[TensorId]>> {
        match self.slots.get(key as usize) {
            Some(Some(batch)) => Some(&batch.ids),
            _ => None,
        }
    }

    /// Claims submission `key` to be performed whole, as a collective over
    /// its `parts` tensors: only if it holds exactly that many, all lent
    /// (segments of one element type), and none of them was taken,
    /// completed or handed on. From then on no part of it can be taken on
    /// its own.
    /// `order` is the order of the parts in the collective (see
    /// [`Whole`]): a permutation of all of them, or `None` for part order.
    pub(crate) fn claim_whole(&mut self, key: u32, parts: usize, order: Order) -> Option<Whole> {
        let batch = self.slots.get_mut(key as usize)?.as_mut()?;
        let lent = matches!(batch.inputs, Inputs::Lent { .. } | Inputs::Device { .. });
        if !batch.whole || !lent || batch.ids.len() != parts || batch.open != parts {
            return None;
        }
        if order.as_ref().is_some_and(|order| order.len() != parts) {
            return None;
        }
        batch.whole = false;
        Some(Whole { key, order })
    }

    /// The memory of a claimed submission's tensors as `T`s, or, when its
    /// tensors are not `T`s (a kolo bug: every rank's request named this
    /// dtype), their element counts; in the collective's order.
    pub(crate) fn whole_views<T: kolo_transport::Element>(
        &mut self,
        whole: &Whole,
    ) -> Result<Vec<&mut [T]>, Vec<usize>> {
        match self.slots.get_mut(whole.key as usize) {
            Some(Some(batch)) => {
                let sizes = arrange(&whole.order, batch.inputs.lent_lens());
                let views = batch.inputs.lent_views::<T>().ok_or(sizes)?;
                Ok(arrange(&whole.order, views))
            }
            _ => Err(Vec::new()),
        }
    }

    /// Completes every tensor of the claimed submission with `result` (a
    /// success without output, or each tensor's error made from its name)
    /// and lets it go.
    pub(crate) fn complete_whole<F: Fn(&str) -> Error>(
        &mut self,
        whole: Whole,
        result: Result<(), F>,
    ) {
        let key = whole.key;
        let Some(slot) = self.slots.get_mut(key as usize) else {
            return;
        };
        if let Some(mut batch) = slot.take() {
            self.free.push(key);
            match result {
                Ok(()) => batch.completion.complete_all_ok(),
                Err(error) => batch.completion.fail_open(error),
            }
            batch.open = 0;
        }
    }

    /// Lets go of the claimed submission and hands over what completing
    /// it takes (from any thread: a device plane completes it once the
    /// device is done) with its inputs (in part order: the claim's
    /// [`Whole::order`] says how the collective takes them).
    pub(crate) fn detach_whole(&mut self, whole: Whole) -> Option<(Arc<Completion>, Inputs)> {
        let slot = self.slots.get_mut(whole.key as usize)?;
        let mut batch = slot.take()?;
        self.free.push(whole.key);
        // The new holder completes every tensor: the record no longer does.
        batch.open = 0;
        let inputs = std::mem::replace(&mut batch.inputs, Inputs::Each(Vec::new()));
        Some((Arc::clone(&batch.completion), inputs))
    }

    /// What orders the engine's work on `part`'s device tensor after its
    /// submitter's (see [`Inputs::Device`]).
    pub(crate) fn device_ready(&self, part: PartRef) -> Option<Ready> {
        match self.slots.get(part.batch as usize) {
            Some(Some(batch)) => batch.inputs.device_ready().map(Arc::clone),
            _ => None,
        }
    }

    /// Takes `part`'s input (nothing if taken before or unknown).
    pub(crate) fn take_input(&mut self, part: PartRef) -> Input {
        match self.slots.get_mut(part.batch as usize) {
            Some(Some(batch)) => {
                batch.whole = false;
                batch.inputs.take(part.index as usize)
            }
            _ => Input::None,
        }
    }

    /// Completes every part with its result, one lock per run of
    /// consecutive parts of one submission; a submission whose last part
    /// is in is let go.
    pub(crate) fn complete(
        &mut self,
        parts: impl IntoIterator<Item = (PartRef, Result<Payload, Error>)>,
    ) {
        let mut run: Vec<(u32, Result<Payload, Error>)> = Vec::new();
        let mut current = None;
        for (part, result) in parts {
            if current.is_some_and(|key| key != part.batch) {
                self.finish_run(current.take(), &mut run);
            }
            current = Some(part.batch);
            run.push((part.index, result));
        }
        self.finish_run(current, &mut run);
    }

    /// Completes `parts` successfully with no output (lent tensors), one
    /// lock per run of one submission.
    pub(crate) fn complete_ok(&mut self, parts: &[PartRef]) {
        let mut rest = parts;
        while let Some(first) = rest.first() {
            let run = rest
                .iter()
                .position(|p| p.batch != first.batch)
                .unwrap_or(rest.len());
            let (now, later) = rest.split_at(run);
            rest = later;
            let Some(slot) = self.slots.get_mut(first.batch as usize) else {
                continue;
            };
            if let Some(batch) = slot {
                batch.whole = false;
                batch.completion.complete_ok(now.iter().map(|p| p.index));
                batch.open = batch.open.saturating_sub(now.len());
                if batch.open == 0 {
                    *slot = None;
                    self.free.push(first.batch);
                }
            }
        }
    }

    /// Completes one run of parts of the submission `key`.
    fn finish_run(&mut self, key: Option<u32>, run: &mut Vec<(u32, Result<Payload, Error>)>) {
        let Some(key) = key else { return };
        let count = run.len();
        let Some(slot) = self.slots.get_mut(key as usize) else {
            run.clear();
            return;
        };
        if let Some(batch) = slot {
            batch.whole = false;
            batch.completion.complete_parts(run.drain(..));
            batch.open = batch.open.saturating_sub(count);
            if batch.open == 0 {
                *slot = None;
                self.free.push(key);
            }
        }
        run.clear();
    }

    /// Hands the obligation to complete `part` to whoever holds the
    /// returned [`Part`] (a device plane completing from another thread).
    pub(crate) fn detach(&mut self, part: PartRef) -> Option<Part> {
        let slot = self.slots.get_mut(part.batch as usize)?;
        let batch = slot.as_mut()?;
        batch.whole = false;
        let detached = batch.completion.part(part.index as usize);
        batch.open = batch.open.saturating_sub(1);
        if batch.open == 0 {
            *slot = None;
            self.free.push(part.batch);
        }
        Some(detached)
    }

    /// Fails every tensor still held with `reason` and lets go of every
    /// submission.
    pub(crate) fn fail_all(&mut self, reason: &Error) {
        for batch in self.slots.iter_mut().filter_map(Option::take) {
            let mut batch = batch;
            batch.completion.fail_open(|_| reason.clone());
            batch.open = 0;
        }
        self.free.clear();
        self.slots.clear();
    }

    /// Number of submissions held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::names::TensorNames;

    fn submission(n: usize) -> Arc<Completion> {
        let mut names = TensorNames::with_capacity(n);
        for i in 0..n {
            names.push(&format!("t{i}"));
        }
        Completion::new(Arc::new(names), false, None, None)
    }

    fn ids(n: usize) -> Arc<[TensorId]> {
        (0..n as u32).map(TensorId).collect()
    }

    fn none(n: usize) -> Inputs {
        Inputs::Each((0..n).map(|_| Input::None).collect())
    }

    fn outcome(completion: &Arc<Completion>) -> Result<(), Error> {
        match completion.wait() {
            Some(outcome) => outcome.map(drop).map_err(|failure| failure.error),
            None => panic!("the submission's results were taken before"),
        }
    }

    #[test]
    fn runs_complete_and_finished_submissions_are_let_go() {
        let (a, b) = (submission(3), submission(1));
        let mut batches = Batches::default();
        let (ka, kb) = (
            batches.add(Arc::clone(&a), ids(3), none(3)),
            batches.add(Arc::clone(&b), ids(1), none(1)),
        );
        let ok = || Ok(Box::new(()) as Payload);
        batches.complete([(Batches::part(ka, 0), ok())]);
        batches.complete_ok(&[Batches::part(kb, 0), Batches::part(ka, 2)]);
        assert_eq!(batches.len(), 1);
        assert!(b.is_done() && !a.is_done());
        let detached = batches.detach(Batches::part(ka, 1));
        assert_eq!(batches.len(), 0);
        assert!(!a.is_done());
        if let Some(part) = detached {
            part.complete(ok());
        }
        assert_eq!(outcome(&a), Ok(()));
        // A freed key serves the next submission.
        let c = submission(2);
        assert!([ka, kb].contains(&batches.add(c, ids(2), none(2))));
    }

    fn lent(data: &mut [f32], parts: usize) -> Inputs {
        let mut group = crate::engine::submission::Submission::new(
            kolo_protocol::Params::new(
                kolo_protocol::RequestKind::Allreduce,
                kolo_protocol::DataType::F32,
                [],
            ),
            parts,
            false,
            None,
        );
        for (i, chunk) in data.chunks_mut(1).take(parts).enumerate() {
            group.push_lent(["a", "b", "c", "d"][i], &[1], chunk);
        }
        group.inputs
    }

    #[test]
    fn only_an_untouched_lent_submission_of_exactly_its_parts_is_claimed_whole() {
        let mut data = [0.0f32; 4];
        let mut batches = Batches::default();
        let key = batches.add(submission(4), ids(4), lent(&mut data, 4));
        assert!(
            batches.claim_whole(key, 3, None).is_none(),
            "not every part"
        );
        assert!(
            batches.claim_whole(key, 5, None).is_none(),
            "more than its parts"
        );
        // Its last part performed on its own: the rest is no longer whole,
        // though the open parts still line up with a group of three.
        batches.take_input(Batches::part(key, 3));
        batches.complete([(Batches::part(key, 3), Ok(Box::new(()) as Payload))]);
        assert!(batches.claim_whole(key, 3, None).is_none());
        assert!(batches.claim_whole(key, 4, None).is_none());
        let other = batches.add(submission(4), ids(4), lent(&mut data, 4));
        let whole = batches.claim_whole(other, 4, None).expect("untouched");
        assert!(
            batches.claim_whole(other, 4, None).is_none(),
            "claimed once"
        );
        assert_eq!(batches.whole_views::<f32>(&whole).map(|v| v.len()), Ok(4));
        assert_eq!(batches.whole_views::<i32>(&whole).err(), Some(vec![0; 4]));
        let copied = batches.add(submission(2), ids(2), none(2));
        assert!(batches.claim_whole(copied, 2, None).is_none(), "not lent");
    }

    #[test]
    fn dropped_or_failed_submissions_fail_their_open_tensors() {
        let (a, b) = (submission(2), submission(2));
        let mut batches = Batches::default();
        let ka = batches.add(Arc::clone(&a), ids(2), none(2));
        batches.complete([(Batches::part(ka, 0), Ok(Box::new(()) as Payload))]);
        batches.add(Arc::clone(&b), ids(2), none(2));
        drop(batches);
        match outcome(&a) {
            Err(Error::Collective { tensor, .. }) => assert_eq!(tensor, "t1"),
            other => panic!("{other:?}"),
        }
        let c = submission(1);
        let mut batches = Batches::default();
        batches.add(Arc::clone(&c), ids(1), none(1));
        batches.fail_all(&Error::ShutDown { by_ranks: vec![1] });
        assert_eq!(outcome(&c), Err(Error::ShutDown { by_ranks: vec![1] }));
        assert!(b.is_done());
    }
}
