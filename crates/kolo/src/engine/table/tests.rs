//! The tensor table's tests: names, ids, groups remembered, reclaiming.

use super::*;
use crate::engine::desync::{Standing, LISTED};
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

/// A group made anew with the names of one submitted before (a binding
/// that builds a `TensorGroup` per call) repeats that one's submission.
#[test]
fn a_group_made_anew_with_the_same_names_is_a_repeat() {
    let mut w = World::default();
    let names: Vec<String> = (0..5).map(|i| format!("again/t{i}")).collect();
    w.insert_group(&group_of(&names)).unwrap();
    let (first, named) = w.take();
    assert_eq!(named.len(), 5);
    for name in &names {
        assert!(w.complete(name));
    }
    w.insert_group(&group_of(&names)).unwrap();
    let (again, named) = w.take();
    assert!(named.is_empty());
    assert!(
        again.iter().all(|s| s.params.is_none()),
        "the twin's memo: a repeat, no parameters sent"
    );
    let ids = |s: &[Request]| s.iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids(&again), ids(&first));
    assert_eq!(w.table.known.len(), 1, "no second memo for the twin");
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

#[test]
fn the_standing_names_the_last_done_and_the_pending_submissions_in_order() {
    let mut w = World::default();
    let now = std::time::Instant::now();
    assert_eq!(
        w.table.standing(3, now),
        Standing {
            rank: 3,
            ..Standing::default()
        }
    );
    assert_eq!(w.table.oldest_pending(), None);
    w.insert(&["a"]).unwrap();
    w.insert(&["b", "c"]).unwrap();
    w.insert(&["d"]).unwrap();
    assert!(w.complete("a"));
    assert!(w.complete("d"));
    // `a` is forgotten at the next insert, and still the last done but one.
    w.insert(&["e"]).unwrap();
    let standing = w.table.standing(3, std::time::Instant::now());
    assert_eq!(standing.rank, 3);
    assert_eq!(
        standing.last_done.map(|op| (op.seq, op.tensor)),
        Some((3, "d".into()))
    );
    let pending: Vec<(u64, String)> = standing
        .pending
        .into_iter()
        .map(|op| (op.seq, op.tensor))
        .collect();
    assert_eq!(pending, [(2, "b".to_owned()), (4, "e".to_owned())]);
    assert_eq!(standing.pending_total, 2);
    assert!(w.table.oldest_pending().is_some());
    // Every pending submission is counted, the first LISTED listed.
    for i in 0..2 * LISTED {
        w.insert(&[&format!("many.{i}")]).unwrap();
    }
    let standing = w.table.standing(3, std::time::Instant::now());
    assert_eq!(standing.pending.len(), LISTED);
    assert_eq!(standing.pending_total, 2 + 2 * LISTED as u64);
    assert_eq!(w.table.take_live().len(), 3 + 2 * LISTED);
}

#[test]
fn a_pending_join_is_not_counted_by_the_timeout() {
    let mut w = World::default();
    let mut join = Submission::new(
        Params::new(RequestKind::Join, DataType::U8, []),
        1,
        false,
        None,
    );
    join.push("join.0", &[], Input::None);
    w.table.insert(join).unwrap();
    assert_eq!(w.table.oldest_pending(), None, "a join waits by design");
    w.insert(&["after"]).unwrap();
    assert!(w.table.oldest_pending().is_some());
    assert!(w.complete("after"));
    w.insert(&["next"]).unwrap();
    assert!(w.complete("next"));
    assert_eq!(w.table.oldest_pending(), None);
}
