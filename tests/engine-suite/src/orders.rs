//! Every way of submitting a group of allreduces meets every other way,
//! in any order and any split of the tensors, on the peers: the results
//! are exact and nothing fails. Each plan runs several steps in a row, so
//! that the response cache and the table's group memos are cold in the
//! first step and warm in the next.

use crate::memory::{Host, Memory};
use crate::{Digest, Rng};
use kolo::{Error, Handle, Kolo, ReduceOp, TensorGroup};

/// Tensors per plan.
const TENSORS: usize = 6;

/// Random plans after the fixed ones.
const RANDOM_PLANS: u64 = 16;

/// Steps each plan runs (the first cold, the others warm).
const STEPS: usize = 3;

/// How one submission of some of the tensors is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    /// `Kolo::allreduce`, one tensor at a time.
    Single,
    /// `Kolo::allreduce_group` with a [`TensorGroup`] made for the call.
    Grouped,
    /// `Kolo::allreduce_group` with the plan's [`TensorGroup`], kept
    /// from step to step.
    Group,
    /// `Scope::allreduce_async` per tensor.
    ScopedEach,
    /// `Scope::allreduce_group_async` with a [`TensorGroup`] made for the
    /// call, of shaped views.
    ScopedGrouped,
    /// `Scope::allreduce_group_async` with the plan's [`TensorGroup`].
    ScopedGroup,
}

impl Style {
    /// The calls that return only once their tensors are reduced.
    pub(crate) const BLOCKING: [Style; 3] = [Style::Single, Style::Grouped, Style::Group];

    /// The calls that return a handle.
    pub(crate) const ASYNC: [Style; 3] =
        [Style::ScopedEach, Style::ScopedGrouped, Style::ScopedGroup];

    #[cfg(test)]
    fn is_blocking(self) -> bool {
        Style::BLOCKING.contains(&self)
    }
}

/// One submission: some tensors (indices, in the order submitted) and how.
#[derive(Clone, Debug)]
pub(crate) struct Submission {
    pub(crate) tensors: Vec<usize>,
    pub(crate) style: Style,
}

/// What every rank submits in one plan: `ranks[r]` is rank r's
/// submissions, in order. Blocking calls are only on ranks whose every
/// earlier submission is also blocking or whose peers submit everything
/// before they wait (see [`random_plan`]), so no plan can deadlock.
#[derive(Clone, Debug)]
struct Plan {
    ranks: Vec<Vec<Submission>>,
}

/// Rank `rank`'s element `i` of tensor `t` at `step` (small integers, so
/// every sum is exact in f32).
fn value(step: usize, rank: usize, t: usize, i: usize) -> f32 {
    ((step * 3 + rank * 5 + t * 7 + i) % 13) as f32
}

/// The length of tensor `t`.
fn len(t: usize) -> usize {
    1 + (t * 29) % 70
}

/// The plans of the defect this case guards against, for `n` ranks: one
/// rank submits the whole group in one call while another reduces the
/// last tensor first (alone, blocking) and then the rest, or goes back to
/// front one tensor at a time; and the mirror images.
fn fixed_plans(n: usize) -> Vec<Plan> {
    let all: Vec<usize> = (0..TENSORS).collect();
    let whole = |style| {
        vec![Submission {
            tensors: all.clone(),
            style,
        }]
    };
    let last_first = vec![
        Submission {
            tensors: vec![TENSORS - 1],
            style: Style::Single,
        },
        Submission {
            tensors: (0..TENSORS - 1).collect(),
            style: Style::Grouped,
        },
    ];
    let back_to_front: Vec<Submission> = (0..TENSORS)
        .rev()
        .map(|t| Submission {
            tensors: vec![t],
            style: Style::Single,
        })
        .collect();
    let mut plans = Vec::new();
    for group_style in [
        Style::Grouped,
        Style::Group,
        Style::ScopedGrouped,
        Style::ScopedGroup,
    ] {
        for other in [&last_first, &back_to_front] {
            // Rank 1 (or the last rank) reduces in its own order; the
            // others submit the whole group; then the roles swap.
            for odd in [1 % n, 0] {
                let ranks = (0..n)
                    .map(|r| {
                        if r == odd {
                            other.clone()
                        } else {
                            whole(group_style)
                        }
                    })
                    .collect();
                plans.push(Plan { ranks });
            }
        }
    }
    plans
}

/// A random plan for `n` ranks: each rank splits the tensors into
/// submissions in a random order, each made in a random style. One rank
/// (at random) may use blocking calls; every other rank submits all its
/// tensors before it waits for any, so the blocking rank never waits for
/// a peer that waits for it.
fn random_plan(rng: &mut Rng, n: usize) -> Plan {
    let blocking_rank = rng.below(n);
    let ranks = (0..n)
        .map(|r| {
            let mut order: Vec<usize> = (0..TENSORS).collect();
            rng.shuffle(&mut order);
            let mut submissions = Vec::new();
            let mut rest = &order[..];
            while !rest.is_empty() {
                let take = 1 + rng.below(rest.len());
                let (now, later) = rest.split_at(take);
                rest = later;
                let style = if r == blocking_rank && rng.below(2) == 0 {
                    Style::BLOCKING[rng.below(Style::BLOCKING.len())]
                } else {
                    Style::ASYNC[rng.below(Style::ASYNC.len())]
                };
                submissions.push(Submission {
                    tensors: now.to_vec(),
                    style,
                });
            }
            submissions
        })
        .collect();
    Plan { ranks }
}

/// Every fixed plan and [`RANDOM_PLANS`] random ones (the same on every
/// rank: the seed is shared), each for [`STEPS`] steps; every result
/// exact. The digest covers every result, so jobs with other settings
/// (fusion, cache, timeline) must reach the same bits.
pub fn any_order_any_style(kolo: &Kolo) -> Result<Digest, Error> {
    any_order_any_style_in(kolo, &Host)
}

/// [`any_order_any_style`] on tensors in `mem`.
pub fn any_order_any_style_in<M: Memory>(kolo: &Kolo, mem: &M) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let mut plans = fixed_plans(n);
    let mut rng = Rng::new(0x6f72_6465_7273);
    plans.extend((0..RANDOM_PLANS).map(|_| random_plan(&mut rng, n)));
    let names: Vec<String> = (0..TENSORS).map(|t| format!("orders/{t}")).collect();
    let mut bits = Vec::new();
    for (p, plan) in plans.iter().enumerate() {
        let mine = &plan.ranks[r];
        // A plan's groups are made once and reused step after step, as a
        // training loop does.
        let groups = mine
            .iter()
            .map(|s| TensorGroup::new(s.tensors.iter().map(|&t| &names[t])))
            .collect::<Result<Vec<_>, _>>()?;
        for step in 0..STEPS {
            let mut bufs: Vec<M::Buf> = (0..TENSORS)
                .map(|t| {
                    let data: Vec<f32> = (0..len(t)).map(|i| value(step, r, t, i)).collect();
                    mem.upload(&data)
                })
                .collect();
            submit_plan(kolo, mem, mine, &groups, &names, &mut bufs)?;
            let bufs: Vec<Vec<f32>> = bufs.iter().map(|b| mem.download(b)).collect();
            for (t, buf) in bufs.iter().enumerate() {
                for (i, &got) in buf.iter().enumerate() {
                    let want: f32 = (0..n).map(|q| value(step, q, t, i)).sum();
                    assert_eq!(
                        got, want,
                        "plan {p} ({plan:?}), step {step}: tensor {t}, element {i} on rank {r} ({})",
                        mem.name()
                    );
                }
                bits.extend(buf.iter().map(|v| u64::from(v.to_bits())));
            }
        }
    }
    Ok(Some(crate::digest(bits)))
}

/// Submits `submissions` of `bufs` (tensor `t` named `names[t]`; the
/// [`TensorGroup`] of submission `i` is `groups[i]`) in order: blocking
/// ones wait in turn; handles are collected and every one is waited for
/// once everything is submitted. Returns the first error, after every
/// tensor was submitted and every handle waited for (so that no peer is
/// left waiting for this rank).
pub(crate) fn submit_plan<M: Memory>(
    kolo: &Kolo,
    mem: &M,
    submissions: &[Submission],
    groups: &[TensorGroup],
    names: &[String],
    bufs: &mut [M::Buf],
) -> Result<(), Error> {
    let op = ReduceOp::Sum;
    // Each buffer goes to exactly one submission.
    let mut slots: Vec<Option<&mut M::Buf>> = bufs.iter_mut().map(Some).collect();
    let mut take = |t: usize| -> &mut M::Buf {
        slots[t]
            .take()
            .unwrap_or_else(|| panic!("tensor {t} submitted twice in one plan"))
    };
    let taken: Vec<Vec<&mut M::Buf>> = submissions
        .iter()
        .map(|s| s.tensors.iter().map(|&t| take(t)).collect())
        .collect();
    kolo.scope(|scope| {
        let mut handles: Vec<Handle<'_, ()>> = Vec::new();
        let mut first: Option<Error> = None;
        let mut note = |result: Result<(), Error>| {
            if let Err(e) = result {
                first.get_or_insert(e);
            }
        };
        for ((s, group), bufs) in submissions.iter().zip(groups).zip(taken) {
            let names_of = || s.tensors.iter().map(|&t| names[t].as_str());
            match s.style {
                Style::Single => {
                    for (name, buf) in names_of().zip(bufs) {
                        note(kolo.allreduce(name, mem.view(buf, None), op));
                    }
                }
                Style::Grouped => {
                    let made = TensorGroup::new(names_of())?;
                    let views = bufs.into_iter().map(|b| mem.view(b, None));
                    note(kolo.allreduce_group(&made, views, op));
                }
                Style::Group => {
                    let views = bufs.into_iter().map(|b| mem.view(b, None));
                    note(kolo.allreduce_group(group, views, op));
                }
                Style::ScopedEach => {
                    for (name, buf) in names_of().zip(bufs) {
                        handles.push(scope.allreduce_async(name, mem.view(buf, None), op)?);
                    }
                }
                Style::ScopedGrouped => {
                    let made = TensorGroup::new(names_of())?;
                    let shaped = bufs.into_iter().map(|b| {
                        let len = mem.len(b);
                        mem.view(b, Some(&[len]))
                    });
                    handles.push(scope.allreduce_group_async(&made, shaped, op)?);
                }
                Style::ScopedGroup => {
                    let views = bufs.into_iter().map(|b| mem.view(b, None));
                    handles.push(scope.allreduce_group_async(group, views, op)?);
                }
            }
        }
        for handle in handles {
            note(handle.wait());
        }
        first.map_or(Ok(()), Err)
    })
}

/// A [`TensorGroup`] repeated after the response cache reused the slots
/// of other tensors: its hits come back in slot order, which is no longer
/// the group's, and each rank lists the group in an order of its own.
/// Every repeat is still exact (the engine runs a repeated group as one
/// collective in the order the ranks agreed on, not in submission order).
pub fn group_after_cache_reuse(kolo: &Kolo) -> Result<Digest, Error> {
    group_after_cache_reuse_in(kolo, &Host)
}

/// [`group_after_cache_reuse`] on tensors in `mem`.
pub fn group_after_cache_reuse_in<M: Memory>(kolo: &Kolo, mem: &M) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    // More tensors than the default cache holds with what came before:
    // its least recently used slots go to the group below.
    let fill = TensorGroup::new((0..1000).map(|t| format!("reuse/fill{t}")))?;
    let mut ones: Vec<M::Buf> = (0..1000).map(|_| mem.upload(&[1.0])).collect();
    kolo.allreduce_group(
        &fill,
        ones.iter_mut().map(|b| mem.view(b, None)),
        ReduceOp::Sum,
    )?;
    assert!(ones.iter().all(|b| mem.download(b) == [n as f32]));
    const TENSORS: usize = 64;
    // Rank r lists the tensors rotated by 7r.
    let order: Vec<usize> = (0..TENSORS).map(|i| (i + 7 * r) % TENSORS).collect();
    let group = TensorGroup::new(order.iter().map(|t| format!("reuse/g{t}")))?;
    let len = |t: usize| 1 + (t * 13) % 40;
    let value =
        |step: usize, rank: usize, t: usize, i: usize| ((step + rank * 3 + t + i) % 11) as f32;
    let mut bits = Vec::new();
    let mut whole = Vec::new();
    for step in 0..4 {
        let before = kolo.stats().whole_operations;
        let mut bufs: Vec<M::Buf> = order
            .iter()
            .map(|&t| {
                let data: Vec<f32> = (0..len(t)).map(|i| value(step, r, t, i)).collect();
                mem.upload(&data)
            })
            .collect();
        let views = bufs.iter_mut().map(|b| mem.view(b, None));
        kolo.allreduce_group(&group, views, ReduceOp::Sum)?;
        whole.push(kolo.stats().whole_operations - before);
        let bufs: Vec<Vec<f32>> = bufs.iter().map(|b| mem.download(b)).collect();
        for (buf, &t) in bufs.iter().zip(&order) {
            for (i, &got) in buf.iter().enumerate() {
                let want: f32 = (0..n).map(|q| value(step, q, t, i)).sum();
                assert_eq!(
                    got, want,
                    "step {step}: tensor {t}, element {i} on rank {r}"
                );
            }
        }
        // In tensor order, so every rank digests the same bits.
        let mut by_tensor: Vec<(usize, &Vec<f32>)> = order.iter().copied().zip(&bufs).collect();
        by_tensor.sort_by_key(|(t, _)| *t);
        bits.extend(
            by_tensor
                .iter()
                .flat_map(|(_, b)| b.iter().map(|v| u64::from(v.to_bits()))),
        );
    }
    // The repeats took the fast path wherever the engine has one: the
    // cache on, no timeline, the group within one fused operation.
    let config = kolo.config();
    let group_bytes: usize = (0..TENSORS).map(|t| len(t) * 4).sum();
    if config.cache_capacity > 0
        && config.timeline.is_none()
        && config.fusion_threshold >= group_bytes
    {
        assert_eq!(
            &whole[1..],
            [1, 1, 1],
            "whole operations per step on rank {r}"
        );
    }
    Ok(Some(crate::digest(bits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every plan submits each tensor exactly once on every rank, and at
    /// most one rank of a plan blocks before its last submission (a rank
    /// that blocks on its only submission waits for nobody who waits for
    /// it: that submission holds every tensor).
    #[test]
    fn plans_cover_every_tensor_once_and_block_on_one_rank_at_most() {
        for n in 1..=4 {
            let mut rng = Rng::new(7);
            let mut plans = fixed_plans(n);
            plans.extend((0..200).map(|_| random_plan(&mut rng, n)));
            for plan in &plans {
                assert_eq!(plan.ranks.len(), n);
                for submissions in &plan.ranks {
                    let mut seen: Vec<usize> =
                        submissions.iter().flat_map(|s| s.tensors.clone()).collect();
                    seen.sort_unstable();
                    assert_eq!(seen, (0..TENSORS).collect::<Vec<_>>(), "{plan:?}");
                    assert!(submissions.iter().all(|s| !s.tensors.is_empty()));
                }
                let blocking = plan
                    .ranks
                    .iter()
                    .filter(|subs| {
                        let before_last = &subs[..subs.len().saturating_sub(1)];
                        before_last.iter().any(|s| s.style.is_blocking())
                    })
                    .count();
                assert!(blocking <= 1, "{plan:?}");
            }
        }
    }
}
