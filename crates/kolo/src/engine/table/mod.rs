//! The tensor table: the operations in flight on this rank.
//!
//! Every tensor name gets a small [`TensorId`] the first time it is
//! submitted (one hash of the name), and from then on the engine works by
//! id: the coordinator negotiates by id, and a repeated training step
//! touches no name and allocates nothing per tensor. A group submitted
//! again with the same names (a training step's gradients) is recognised
//! as a whole: the table remembers its last few groups with their ids,
//! shapes and parameters, so that repeating one costs a comparison of the
//! names and shapes and a pass over the ids, and it travels to the
//! background thread as a repeat. Ids of names not seen for a while are
//! reclaimed (see [`Table::reclaim`]), so that a job that makes up new
//! names (barriers, joins, unnamed tensors) does not grow the table
//! without bound.
//!
//! The table is the submitters' side: the background thread only takes
//! the queue (one record per submission) and keeps the tensors it performs
//! on its own side, so that the two threads never write the same memory
//! per tensor (each such line would cross between the cores twice per
//! step). Whether a name is still in flight is read from its last
//! submission's completion.

use crate::engine::completion::Completion;
use crate::engine::names::TensorNames;
use crate::engine::progress::Progress;
use crate::engine::submission::{Input, Inputs, Names, Shapes, Submission};
use crate::error::Error;
use crate::set_label::SetLabel;
use kolo_coordinator::{Submission as Request, TensorId};
use kolo_protocol::{Params, RequestKind};
use rustc_hash::FxHashMap;
use std::sync::{Arc, Weak};

/// Below this many names the table never reclaims ids.
const RECLAIM_FLOOR: usize = 4096;

/// The list of live submissions is swept whole only once it holds this
/// many (and twice as many as after the last sweep).
const LIVE_SWEEP_FLOOR: usize = 64;

/// Groups of at least this many tensors are remembered.
const MEMO_MIN_TENSORS: usize = 8;

/// How many groups of names given one by one are remembered.
const MEMO_GROUPS: usize = 4;

/// How many [`crate::TensorGroup`]s are remembered (found by address, so
/// many cost nothing: a model's buckets).
const KNOWN_GROUPS: usize = 256;

/// One tensor as the engine performs it.
pub(crate) struct Entry {
    /// The tensor (its parameters are the coordinator's, see
    /// [`kolo_coordinator::Coordinator::params`]).
    pub id: TensorId,
    /// The input.
    pub input: Input,
    /// Where the result goes.
    pub part: crate::engine::batches::PartRef,
}

/// The requests of a queued submission.
pub(crate) enum Requests {
    /// Every tensor repeats its last parameters.
    Repeat,
    /// Tensor by tensor (`None`: a repeat).
    Each(Vec<Option<Box<Params>>>),
}

/// One queued submission.
pub(crate) struct Queued {
    pub completion: Arc<Completion>,
    /// The tensors, in part order.
    pub ids: Arc<[TensorId]>,
    pub requests: Requests,
    pub inputs: Inputs,
}

impl Queued {
    /// The request of tensor `index`.
    pub(crate) fn submission(&mut self, index: usize) -> Request {
        let id = self.ids[index];
        match &mut self.requests {
            Requests::Repeat => Request::repeat(id),
            Requests::Each(each) => Request {
                id,
                params: each.get_mut(index).and_then(Option::take),
            },
        }
    }
}

/// What the background thread takes from the table.
#[derive(Default)]
pub(crate) struct Taken {
    /// The submissions, in order.
    pub submissions: Vec<Queued>,
    /// Ids named since the last take (to register before the requests).
    pub named: Vec<(TensorId, Arc<str>)>,
}

/// One id's place in the table.
#[derive(Default)]
struct Slot {
    /// The id's name; `None` while the id is free.
    name: Option<Arc<str>>,
    /// The parameters the name was last submitted with (the coordinator
    /// has them too: a repeat is queued without them).
    last: Option<Params>,
    /// The submission that last checked the name (a name twice in one
    /// submission is refused).
    mark: u64,
}

/// A group submitted before: its names, ids, shapes and parameters, and
/// its last submission.
struct Memo {
    names: Arc<TensorNames>,
    ids: Arc<[TensorId]>,
    shapes: Shapes,
    template: Params,
    last: u64,
}

/// A submission's names checked in: their ids and the handle's names, and
/// whether the whole submission repeats the last one of its group.
struct Checked {
    ids: Arc<[TensorId]>,
    names: Arc<TensorNames>,
    repeat: bool,
    /// The ids' flights already point at this submission.
    flown: bool,
}

/// The entries in flight, the requests the background thread has not
/// taken yet, and whether new entries are still accepted.
#[derive(Default)]
pub(crate) struct Table {
    ids: FxHashMap<Arc<str>, TensorId>,
    slots: Vec<Slot>,
    /// Each id's last submission (its sequence number, 0 for none) and its
    /// place in it: the name is in flight until that part is in. Apart
    /// from the slots, dense: a repeated group reads and writes it in one
    /// pass.
    flights: Vec<(u64, u32)>,
    /// Ids free for new names.
    free: Vec<TensorId>,
    /// Submissions that may have tensors in flight, by sequence number
    /// (ascending): a name's `flight` refers to one of them, or to one
    /// done and forgotten. Done ones are forgotten lazily (see
    /// [`Table::prune_live`]).
    live: Vec<(u64, Arc<Completion>)>,
    /// Sweep `live` whole once it is this long.
    sweep_live_at: usize,
    /// What the background thread takes next. Submitters only wake the
    /// thread when the queue was empty: a burst of submissions costs one
    /// wake-up, not one per tensor.
    queue: Taken,
    /// A submission since the last take woke the background thread (or
    /// will): later ones need not. A quiet submission (see
    /// [`Submission::quietly`]) wakes nobody where its waiter can run the
    /// cycles.
    woken: bool,
    /// How a handle's waiter runs the engine's cycles itself, on a host
    /// engine (see [`crate::engine::progress`]).
    progress: Option<Weak<dyn Progress>>,
    /// The last groups submitted with names given one by one.
    memos: Vec<Memo>,
    /// The last [`crate::TensorGroup`]s submitted.
    known: Vec<Memo>,
    /// Submissions so far (each one's sequence number).
    submissions: u64,
    /// Reclaim ids once this many names are known.
    reclaim_at: usize,
    /// Set once the engine stopped: why new operations are refused.
    closed: Option<Error>,
    /// The last done submission forgotten from `live` (for the desync
    /// report): its sequence number and names.
    last_done: Option<(u64, Arc<TensorNames>)>,
    /// Live joins, by sequence number: a join waits, by design, for as
    /// long as the other ranks still have work, so the operation timeout
    /// does not count it (see [`Table::oldest_pending`]).
    joins: Vec<u64>,
    /// The process set whose engine this is (see
    /// [`Table::set_process_set`]).
    set: Option<Arc<SetLabel>>,
}

impl Table {
    /// The id of `name`, made now if it has none.
    fn intern(&mut self, name: &str) -> TensorId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let name: Arc<str> = Arc::from(name);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(Slot::default());
                self.flights.push((0, 0));
                TensorId(self.slots.len() as u32 - 1)
            }
        };
        self.slots[id.index()].name = Some(Arc::clone(&name));
        self.ids.insert(Arc::clone(&name), id);
        self.queue.named.push((id, name));
        id
    }

    /// True while the tensor of `flight` (a submission and a part of it)
    /// is not in.
    fn flying(live: &[(u64, Arc<Completion>)], (seq, index): (u64, u32)) -> bool {
        if seq == 0 {
            return false;
        }
        match live.binary_search_by_key(&seq, |(s, _)| *s) {
            Ok(at) => !live[at].1.part_done(index),
            Err(_) => false,
        }
    }

    /// Adds every tensor of `group` (one part each of the submission's
    /// completion, which this returns), or none: fails if the engine
    /// stopped or a name is in flight (or given twice). Queues the
    /// submission for the background thread; also returns whether the
    /// queue was empty, i.e. whether the thread needs waking.
    pub(crate) fn insert(
        &mut self,
        group: Submission<'_>,
    ) -> Result<(Arc<Completion>, bool), Error> {
        if let Some(reason) = &self.closed {
            return Err(reason.clone());
        }
        self.submissions += 1;
        let seq = self.submissions;
        self.prune_live();
        if group.template.kind == RequestKind::Join {
            self.joins.push(seq);
        }
        let known = matches!(group.names, Names::Known(_));
        let memo = match &group.names {
            Names::Each(names) => self.memos.iter().position(|m| m.names.matches(names)),
            // The group's own memo, or, for a group made anew with the
            // same names (a binding that builds one per call), its twin's.
            Names::Known(names) => self
                .known
                .iter()
                .position(|m| Arc::ptr_eq(&m.names, names))
                .or_else(|| self.known.iter().position(|m| *m.names == **names)),
        };
        let Checked {
            ids,
            names,
            repeat,
            flown,
        } = match memo {
            Some(at) => self.insert_remembered(at, &group, seq)?,
            None => self.insert_new(&group, seq)?,
        };
        let Submission {
            template,
            shapes,
            inputs,
            payloads,
            lease,
            quiet,
            ..
        } = group;
        let completion = Completion::in_set(
            names,
            payloads,
            lease,
            self.progress.clone(),
            self.set.clone(),
        );
        let requests = if repeat {
            Requests::Repeat
        } else {
            let mut each = Vec::with_capacity(ids.len());
            for (index, &id) in ids.iter().enumerate() {
                let slot = &mut self.slots[id.index()];
                let shape = shapes.get(index);
                let same = slot
                    .last
                    .as_ref()
                    .is_some_and(|last| last.same_as_with_shape(&template, shape));
                each.push(if same {
                    None
                } else {
                    let params = Params {
                        shape: shape.into(),
                        ..template.clone()
                    };
                    slot.last = Some(params.clone());
                    Some(Box::new(params))
                });
            }
            if known || ids.len() >= MEMO_MIN_TENSORS {
                self.remember(known, &ids, completion.names(), shapes, template, seq);
            }
            Requests::Each(each)
        };
        if !flown {
            for (index, &id) in ids.iter().enumerate() {
                self.flights[id.index()] = (seq, index as u32);
            }
        }
        // A quiet submission's waiter runs the cycles itself, or wakes the
        // background thread before it sleeps; without that (an engine on
        // a thread of its own) every submission wakes the thread.
        let runs_itself = quiet && self.progress.is_some();
        let wake = !runs_itself && !self.woken;
        self.woken |= wake;
        self.live.push((seq, Arc::clone(&completion)));
        self.queue.submissions.push(Queued {
            completion: Arc::clone(&completion),
            ids,
            requests,
            inputs,
        });
        Ok((completion, wake))
    }

    /// True when submission `seq` is done (or forgotten, hence done).
    fn submission_done(&self, seq: u64) -> bool {
        match self.live.binary_search_by_key(&seq, |(s, _)| *s) {
            Ok(at) => self.live[at].1.is_done(),
            Err(_) => true,
        }
    }

    /// Checks a group remembered in `memos[at]` (`known[at]` for a
    /// [`crate::TensorGroup`]): its ids, and whether all of it repeats the
    /// last submission (same shapes and parameters).
    fn insert_remembered(
        &mut self,
        at: usize,
        group: &Submission<'_>,
        seq: u64,
    ) -> Result<Checked, Error> {
        let known = matches!(group.names, Names::Known(_));
        let memo = if known {
            &self.known[at]
        } else {
            &self.memos[at]
        };
        let (ids, names) = (Arc::clone(&memo.ids), Arc::clone(&memo.names));
        // The usual case: every name's last submission was this group's
        // last one, which is done.
        let last_done = self.submission_done(memo.last);
        // Checked and moved to this submission in one pass: an id whose
        // flight is elsewhere puts the ones before it back (each was part
        // `index` of submission `memo.last`, the same group).
        let mut untouched = last_done;
        if untouched {
            for (index, &id) in ids.iter().enumerate() {
                match self.flights.get_mut(id.index()) {
                    Some(flight) if flight.0 == memo.last => *flight = (seq, index as u32),
                    _ => {
                        for (before, &earlier) in ids[..index].iter().enumerate() {
                            self.flights[earlier.index()] = (memo.last, before as u32);
                        }
                        untouched = false;
                        break;
                    }
                }
            }
        }
        if !untouched {
            for (index, &id) in ids.iter().enumerate() {
                let flight = self.flights[id.index()];
                let slot = &mut self.slots[id.index()];
                if Table::flying(&self.live, flight) || slot.mark == seq {
                    return Err(Error::DuplicateName {
                        tensor: group.names.get(index).to_owned(),
                    });
                }
                slot.mark = seq;
            }
        }
        let repeat =
            untouched && memo.template.same_as(&group.template) && memo.shapes == group.shapes;
        if repeat {
            if known {
                self.known[at].last = seq;
            } else {
                self.memos[at].last = seq;
            }
        }
        Ok(Checked {
            ids,
            names,
            repeat,
            flown: untouched,
        })
    }

    /// Interns and checks the names of a group not remembered.
    fn insert_new(&mut self, group: &Submission<'_>, seq: u64) -> Result<Checked, Error> {
        let mut ids = Vec::with_capacity(group.len());
        for index in 0..group.names.len() {
            let name = group.names.get(index);
            let id = self.intern(name);
            let flight = self.flights[id.index()];
            let slot = &mut self.slots[id.index()];
            if Table::flying(&self.live, flight) || slot.mark == seq {
                return Err(Error::DuplicateName {
                    tensor: name.to_owned(),
                });
            }
            slot.mark = seq;
            ids.push(id);
        }
        let names = match &group.names {
            Names::Each(each) => {
                let mut names = TensorNames::with_capacity(each.len());
                each.iter().for_each(|name| names.push(name));
                Arc::new(names)
            }
            Names::Known(names) => Arc::clone(names),
        };
        Ok(Checked {
            ids: ids.into(),
            names,
            repeat: false,
            flown: false,
        })
    }

    /// Remembers a group just submitted (a [`crate::TensorGroup`] when
    /// `known`); the oldest memo of its kind goes.
    fn remember(
        &mut self,
        known: bool,
        ids: &Arc<[TensorId]>,
        names: &Arc<TensorNames>,
        shapes: Shapes,
        template: Params,
        seq: u64,
    ) {
        let (memos, bound) = if known {
            (&mut self.known, KNOWN_GROUPS)
        } else {
            (&mut self.memos, MEMO_GROUPS)
        };
        memos.retain(|m| !Arc::ptr_eq(&m.names, names));
        if memos.len() == bound {
            memos.remove(0);
        }
        memos.push(Memo {
            names: Arc::clone(names),
            ids: Arc::clone(ids),
            shapes,
            template,
            last: seq,
        });
    }

    /// Takes the queued submissions and the ids named since the last call.
    pub(crate) fn take_queued(&mut self) -> Taken {
        self.woken = false;
        std::mem::take(&mut self.queue)
    }

    /// True while submissions wait in the queue.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queue.submissions.is_empty()
    }

    /// Lets handles of later submissions run the engine's cycles while
    /// they wait (see [`crate::engine::progress`]).
    /// Names process set `set` in the errors of every later submission.
    pub(crate) fn set_process_set(&mut self, set: Arc<SetLabel>) {
        self.set = Some(set);
    }

    pub(crate) fn set_progress(&mut self, progress: Weak<dyn Progress>) {
        self.progress = Some(progress);
    }

    /// The id of `name`, if it has one.
    pub(crate) fn id(&self, name: &str) -> Option<TensorId> {
        self.ids.get(name).copied()
    }

    /// The name of `id`.
    #[cfg(test)]
    pub(crate) fn name(&self, id: TensorId) -> Option<&Arc<str>> {
        self.slots.get(id.index())?.name.as_ref()
    }

    /// Frees the ids of names with nothing in flight that `forget` lets go
    /// (the background thread holds nothing for them, and the
    /// coordinator's [`forget`](kolo_coordinator::Coordinator::forget)
    /// agrees: no pending request and no cache slot refer to the id), once
    /// the table knows more names than it did after the last reclaim
    /// (twice as many, and at least [`RECLAIM_FLOOR`]). Must run after the
    /// queue was taken (see [`Table::take_queued`]).
    pub(crate) fn reclaim(&mut self, mut forget: impl FnMut(TensorId) -> bool) {
        let due = self.ids.len() >= self.reclaim_at.max(RECLAIM_FLOOR);
        if !due || !self.queue.named.is_empty() || !self.queue.submissions.is_empty() {
            return;
        }
        self.forget_every_done();
        // Remembered groups may name freed ids.
        self.memos.clear();
        self.known.clear();
        for (index, (slot, flight)) in self.slots.iter_mut().zip(&mut self.flights).enumerate() {
            let id = TensorId(index as u32);
            if Table::flying(&self.live, *flight) || slot.name.is_none() || !forget(id) {
                continue;
            }
            if let Some(name) = slot.name.take() {
                self.ids.remove(&name);
                slot.last = None;
                *flight = (0, 0);
                self.free.push(id);
            }
        }
        self.reclaim_at = 2 * self.ids.len();
    }

    /// Number of names with an id.
    #[cfg(test)]
    pub(crate) fn known(&self) -> usize {
        self.ids.len()
    }

    /// Refuses new entries from now on (keeping the first reason given)
    /// and returns the submissions still queued, for the caller to fail
    /// outside the lock (the background thread fails those it took).
    pub(crate) fn close(&mut self, reason: Error) -> Vec<Arc<Completion>> {
        self.closed.get_or_insert(reason);
        let queued = std::mem::take(&mut self.queue);
        queued
            .submissions
            .into_iter()
            .map(|q| q.completion)
            .collect()
    }

    /// Why the engine stopped, if it did.
    pub(crate) fn closed(&self) -> Option<&Error> {
        self.closed.as_ref()
    }
}

mod live;
#[cfg(test)]
mod tests;
