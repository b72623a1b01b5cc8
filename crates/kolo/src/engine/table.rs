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
use kolo_coordinator::{Submission as Request, TensorId};
use kolo_protocol::Params;
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
        let known = matches!(group.names, Names::Known(_));
        let memo = match &group.names {
            Names::Each(names) => self.memos.iter().position(|m| m.names.matches(names)),
            Names::Known(names) => self.known.iter().position(|m| Arc::ptr_eq(&m.names, names)),
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
            staging,
            quiet,
            ..
        } = group;
        let completion = Completion::new(names, payloads, lease, self.progress.clone());
        if let Some(staging) = staging {
            completion.keep_staging(staging);
        }
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

    /// Forgets done submissions: at each insert the ones before the first
    /// that is not done (they usually finish in the order submitted, so
    /// this is O(1) per insert: a burst of 1,000 separate submissions
    /// while the first is pending touches one entry each), and every done
    /// one once the list has doubled since the last sweep (amortized O(1)
    /// whatever the order).
    fn prune_live(&mut self) {
        let done = self.live.iter().take_while(|(_, c)| c.is_done()).count();
        self.live.drain(..done);
        if self.live.len() >= self.sweep_live_at.max(LIVE_SWEEP_FLOOR) {
            self.live.retain(|(_, c)| !c.is_done());
            self.sweep_live_at = 2 * self.live.len();
        }
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
        self.live.retain(|(_, c)| !c.is_done());
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

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, RequestKind};
    use std::collections::HashMap;

    fn template() -> Params {
        Params::new(RequestKind::Allreduce, DataType::F32, [])
    }

    /// The names of a tensor group (what a `crate::TensorGroup` holds).
    fn group_of(names: &[String]) -> Arc<TensorNames> {
        let mut list = TensorNames::with_capacity(names.len());
        for name in names {
            list.push(name);
        }
        Arc::new(list)
    }

    /// The table and, standing in for the background thread, the
    /// submissions and tensors it took.
    #[derive(Default)]
    struct World {
        table: Table,
        taken: HashMap<TensorId, (Arc<Completion>, u32)>,
        /// The memory every lent test tensor points at.
        scratch: [f32; 1],
    }

    impl World {
        fn insert(&mut self, names: &[&str]) -> Result<bool, Error> {
            self.insert_shaped(names, 1)
        }

        fn insert_shaped(&mut self, names: &[&str], len: u64) -> Result<bool, Error> {
            self.insert_as(names, len, false)
        }

        /// Submits `names` as a blocking call does (see `Submission::quietly`).
        fn insert_quiet(&mut self, names: &[&str]) -> Result<bool, Error> {
            self.insert_as(names, 1, true)
        }

        fn insert_as(&mut self, names: &[&str], len: u64, quiet: bool) -> Result<bool, Error> {
            let mut group = Submission::new(template(), names.len(), false, None);
            for name in names {
                group.push(name, &[len], Input::None);
            }
            self.table
                .insert(group.quietly(quiet))
                .map(|(_, wake)| wake)
        }

        /// Submits the tensors of `group` (each of shape [1]).
        fn insert_group(&mut self, group: &Arc<TensorNames>) -> Result<bool, Error> {
            let mut submission = Submission::known(template(), group, None);
            // The table records the segments and never reads them; they
            // stay valid for the world's life all the same.
            for _ in 0..group.len() {
                submission.push_lent_data(&[1], &mut self.scratch[..]);
            }
            self.table.insert(submission).map(|(_, wake)| wake)
        }

        /// Takes the queue as the background thread does.
        fn take(&mut self) -> (Vec<Request>, Vec<(TensorId, Arc<str>)>) {
            let taken = self.table.take_queued();
            let mut submissions = Vec::new();
            for mut q in taken.submissions {
                for index in 0..q.ids.len() {
                    let submission = q.submission(index);
                    let completion = Arc::clone(&q.completion);
                    self.taken.insert(submission.id, (completion, index as u32));
                    submissions.push(submission);
                }
            }
            (submissions, taken.named)
        }

        /// Completes `name`'s tensor; false when it is not in flight.
        fn complete(&mut self, name: &str) -> bool {
            self.take();
            let held = self.table.id(name).and_then(|id| self.taken.remove(&id));
            held.is_some_and(|(completion, index)| {
                completion.complete_parts([(
                    index,
                    Ok(Box::new(()) as crate::engine::completion::Payload),
                )]);
                true
            })
        }
    }

    #[test]
    fn names_in_flight_are_unique() {
        let mut w = World::default();
        w.insert(&["a"]).unwrap();
        assert_eq!(
            w.insert(&["b", "a"]).err(),
            Some(Error::DuplicateName { tensor: "a".into() })
        );
        assert!(!w.complete("b"), "a failed group inserts nothing");
        assert_eq!(
            w.insert(&["c", "c"]).err(),
            Some(Error::DuplicateName { tensor: "c".into() })
        );
        assert_eq!(
            w.insert(&["a"]).err(),
            Some(Error::DuplicateName { tensor: "a".into() })
        );
        assert!(w.complete("a"));
        w.insert(&["a"]).unwrap();
        // Part of a group done, part in flight.
        w.insert(&["x", "y"]).unwrap();
        assert!(w.complete("x"));
        w.insert(&["x"]).unwrap();
        assert_eq!(
            w.insert(&["y"]).err(),
            Some(Error::DuplicateName { tensor: "y".into() })
        );
    }

    #[test]
    fn only_the_first_submission_after_a_take_wakes_the_engine() {
        let mut w = World::default();
        assert_eq!(w.insert(&["a"]), Ok(true));
        assert_eq!(w.insert(&["b", "c"]), Ok(false));
        assert_eq!(
            w.insert(&["b"]).ok(),
            None,
            "a refused submission queues nothing"
        );
        let (queued, named) = w.take();
        let names: Vec<&str> = queued
            .iter()
            .map(|s| &**w.table.name(s.id).unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        let named: Vec<&str> = named.iter().map(|(_, n)| &**n).collect();
        assert_eq!(named, ["a", "b", "c"]);
        assert!(w.take().0.is_empty());
        assert_eq!(w.insert(&["d"]), Ok(true));
    }

    /// A waiter that never gets to run the engine's cycles.
    struct Elsewhere;

    impl Progress for Elsewhere {
        fn run_until(&self, _: &dyn Fn() -> bool, _: std::time::Instant) -> bool {
            false
        }

        fn wake(&self) {}
    }

    #[test]
    fn a_quiet_submission_leaves_the_wake_to_the_next_loud_one() {
        // No waiter can run the cycles: every first submission wakes.
        let mut w = World::default();
        assert_eq!(w.insert_quiet(&["a"]), Ok(true));
        assert_eq!(w.insert_quiet(&["b"]), Ok(false));
        w.take();
        let progress: Arc<dyn Progress> = Arc::new(Elsewhere);
        w.table.set_progress(Arc::downgrade(&progress));
        assert_eq!(w.insert_quiet(&["c"]), Ok(false), "its waiter runs it");
        assert_eq!(w.insert(&["d"]), Ok(true), "nobody woke the thread yet");
        assert_eq!(w.insert(&["e"]), Ok(false));
        assert_eq!(w.insert_quiet(&["f"]), Ok(false));
        let (queued, _) = w.take();
        assert_eq!(queued.len(), 4, "quiet or not, all are queued");
        assert_eq!(w.insert_quiet(&["g"]), Ok(false));
        assert_eq!(w.insert_quiet(&["h"]), Ok(false));
        assert_eq!(w.insert(&["i"]), Ok(true));
    }

    #[test]
    fn a_repeat_is_queued_without_its_parameters() {
        let mut w = World::default();
        w.insert(&["a", "b"]).unwrap();
        let (first, _) = w.take();
        assert!(first.iter().all(|s| s.params.is_some()));
        assert!(w.complete("a") && w.complete("b"));
        w.insert(&["a", "b"]).unwrap();
        let (again, named) = w.take();
        assert!(again.iter().all(|s| s.params.is_none()) && named.is_empty());
        assert!(w.complete("a"));
        w.insert_shaped(&["a"], 2).unwrap();
        let (changed, _) = w.take();
        assert_eq!(
            changed[0].params.as_ref().map(|p| p.shape.to_vec()),
            Some(vec![2])
        );
    }

    #[test]
    fn a_group_seen_before_finds_its_ids_without_hashing() {
        let mut w = World::default();
        let names: Vec<String> = (0..MEMO_MIN_TENSORS).map(|i| format!("g{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        w.insert(&refs).unwrap();
        let (first, _) = w.take();
        assert_eq!(w.table.memos.len(), 1);
        // Another submission takes one of the names meanwhile.
        for name in &refs {
            assert!(w.complete(name));
        }
        w.insert(&[refs[3]]).unwrap();
        let flights = w.table.flights.clone();
        assert_eq!(
            w.insert(&refs).err(),
            Some(Error::DuplicateName {
                tensor: refs[3].into()
            }),
            "the memo skips hashing, not the in-flight check"
        );
        assert_eq!(w.table.flights, flights, "a refused group leaves no trace");
        assert!(w.complete(refs[3]));
        w.insert(&refs).unwrap();
        let (again, named) = w.take();
        let ids = |s: &[Request]| s.iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(&again), ids(&first));
        assert!(named.is_empty());
    }

    #[test]
    fn tensor_groups_are_found_by_address_and_many_are_remembered() {
        let mut w = World::default();
        let groups: Vec<(Vec<String>, Arc<TensorNames>)> = (0..2 * MEMO_GROUPS + 2)
            .map(|g| {
                let names: Vec<String> = (0..3).map(|i| format!("g{g}/t{i}")).collect();
                let group = group_of(&names);
                (names, group)
            })
            .collect();
        let mut first_ids = Vec::new();
        for (names, group) in &groups {
            w.insert_group(group).unwrap();
            let (first, named) = w.take();
            assert!(first.iter().all(|s| s.params.is_some()));
            assert_eq!(named.len(), 3);
            first_ids.push(first.iter().map(|s| s.id).collect::<Vec<_>>());
            for name in names {
                assert!(w.complete(name));
            }
        }
        assert_eq!(w.table.known.len(), groups.len());
        assert!(w.table.memos.is_empty(), "names given one by one: none");
        for ((names, group), ids) in groups.iter().zip(&first_ids) {
            w.insert_group(&group.clone()).unwrap();
            let (again, named) = w.take();
            assert!(
                again.iter().all(|s| s.params.is_none()) && named.is_empty(),
                "a clone is the same group: a repeat"
            );
            assert_eq!(&again.iter().map(|s| s.id).collect::<Vec<_>>(), ids);
            for name in names {
                assert!(w.complete(name));
            }
        }
    }

    #[test]
    fn a_tensor_group_shares_ids_and_flight_checks_with_its_names_one_by_one() {
        let mut w = World::default();
        let names: Vec<String> = (0..MEMO_MIN_TENSORS).map(|i| format!("n{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let group = group_of(&names);
        w.insert(&refs).unwrap();
        let (first, _) = w.take();
        for name in &refs {
            assert!(w.complete(name));
        }
        w.insert_group(&group).unwrap();
        let (grouped, named) = w.take();
        let ids = |s: &[Request]| s.iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(&grouped), ids(&first));
        assert!(named.is_empty());
        assert_eq!(
            w.insert(&[refs[2]]).err(),
            Some(Error::DuplicateName {
                tensor: refs[2].into()
            }),
            "a group's tensor is in flight by its name"
        );
        assert_eq!(
            w.insert_group(&group).err(),
            Some(Error::DuplicateName {
                tensor: refs[0].into()
            }),
            "a group in flight is refused"
        );
        assert!(w.complete(refs[0]));
        assert_eq!(
            w.insert_group(&group).err(),
            Some(Error::DuplicateName {
                tensor: refs[1].into()
            }),
            "the first tensor still in flight is named"
        );
        for name in &refs[1..] {
            assert!(w.complete(name));
        }
        w.insert_group(&group).unwrap();
        w.insert(&["other"]).unwrap();
        assert!(w.take().0.len() == MEMO_MIN_TENSORS + 1);
    }

    #[test]
    fn done_submissions_are_forgotten_whatever_their_order() {
        let mut w = World::default();
        let names: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
        for name in &names {
            w.insert(&[name]).unwrap();
        }
        // The first stays pending; every other one completes, in reverse.
        for name in names[1..].iter().rev() {
            assert!(w.complete(name));
        }
        for round in 0..3 {
            for name in &names[1..] {
                w.insert(&[name]).unwrap();
                assert!(w.complete(name), "round {round}: {name}");
            }
        }
        assert!(
            w.table.live.len() <= 2 * LIVE_SWEEP_FLOOR,
            "{} submissions remembered behind a pending one",
            w.table.live.len()
        );
        assert_eq!(
            w.insert(&["t0"]).err(),
            Some(Error::DuplicateName {
                tensor: "t0".into()
            }),
            "the pending one is still in flight"
        );
        assert!(w.complete("t0"));
        w.insert(&["t0"]).unwrap();
        assert_eq!(w.table.live.len(), 1, "only the new one is live");
    }

    #[test]
    fn closing_refuses_and_drains() {
        let mut w = World::default();
        w.insert(&["a", "b"]).unwrap();
        let drained = w.table.close(Error::ShutDown { by_ranks: vec![1] });
        assert_eq!(drained.len(), 1, "one submission of two tensors");
        assert_eq!(drained[0].names().len(), 2);
        drained[0].fail_open(|_| Error::ShutDown { by_ranks: vec![1] });
        assert!(w
            .table
            .close(Error::ShutDown { by_ranks: vec![0] })
            .is_empty());
        assert_eq!(
            w.table.closed(),
            Some(&Error::ShutDown { by_ranks: vec![1] })
        );
        assert_eq!(
            w.insert(&["c"]).err(),
            Some(Error::ShutDown { by_ranks: vec![1] })
        );
    }

    #[test]
    fn reclaim_frees_idle_ids_that_the_coordinator_lets_go() {
        let mut w = World::default();
        let names: Vec<String> = (0..RECLAIM_FLOOR + 10).map(|i| format!("n{i}")).collect();
        for name in &names {
            w.insert(&[name]).unwrap();
        }
        // Ids not yet handed to the engine are never reclaimed.
        w.table.reclaim(|_| true);
        assert_eq!(w.table.known(), names.len());
        w.take();
        for name in &names[..20] {
            assert!(w.complete(name));
        }
        // The coordinator keeps even ids (cached, say).
        w.table.reclaim(|id| id.0 % 2 == 1);
        assert_eq!(w.table.known(), names.len() - 10);
        assert!(!w.table.ids.contains_key("n1") && w.table.ids.contains_key("n0"));
        // A freed id serves a new name; the old name gets a new id.
        w.insert(&["fresh", "n1"]).unwrap();
        let (_, named) = w.take();
        assert_eq!(named.len(), 2);
        assert!(named.iter().all(|(id, _)| id.0 % 2 == 1 && id.index() < 20));
        // The next reclaim waits for twice the names left.
        for name in &names[20..30] {
            assert!(w.complete(name));
        }
        w.table.reclaim(|_| true);
        assert_eq!(w.table.known(), names.len() - 8);
    }

    #[test]
    fn names_in_flight_are_never_reclaimed() {
        let mut w = World::default();
        let names: Vec<String> = (0..RECLAIM_FLOOR).map(|i| format!("n{i}")).collect();
        for name in &names {
            w.insert(&[name]).unwrap();
        }
        w.take();
        w.table.reclaim(|_| true);
        assert_eq!(w.table.known(), names.len());
    }
}
