use super::*;
use crate::spec::TensorSpec;
use kolo_protocol::DataType;
use kolo_threads::ThreadComm;
use kolo_transport::Topology;
use proptest::prelude::*;

/// Stages of `widths`, a tensor between neighbours, and one from the first
/// stage to the last without a gradient.
fn spec(widths: &[usize]) -> PipelineSpec {
    let last = widths.len() - 1;
    let mut spec = PipelineSpec::with_widths(widths);
    for s in 1..widths.len() {
        spec = spec.tensor(
            TensorSpec::new(format!("h{s}"), DataType::F32, s as u32)
                .from_stage(s - 1)
                .to_stage(s),
        );
    }
    spec.tensor(
        TensorSpec::new("labels", DataType::I64, 50)
            .from_stage(0)
            .to_stage(last)
            .without_gradient(),
    )
}

/// One communicator of rank `rank` in a world of `size`.
fn world_comm(rank: usize, size: usize) -> ThreadComm {
    kolo_threads::communicators(size)
        .ok()
        .and_then(|comms| comms.into_iter().nth(rank))
        .unwrap_or_else(|| panic!("a communicator of rank {rank} of {size}"))
}

proptest! {
    /// Every rank duplicates once per channel of the whole pipeline, in
    /// the same order — also for channels it is not on — and keeps exactly
    /// its own, each addressed by the other end's global rank.
    #[test]
    fn every_rank_duplicates_for_every_channel_in_the_same_order(
        widths in proptest::collection::vec(1usize..=3, 2..=4),
        iterations in 0u64..8,
        forward_only in any::<bool>(),
    ) {
        let spec = spec(&widths);
        let options = if forward_only {
            Options::forward_only(iterations, 2)
        } else {
            Options::training(iterations)
        };
        let all = channels(&spec, &options).unwrap();
        for rank in 0..spec.world_size {
            let plan = StagePlan::new(&spec, rank).unwrap();
            let mut calls = Vec::new();
            let mut set = duplicate_channels(&plan, &options, |key| {
                calls.push(key.clone());
                Ok(world_comm(rank, spec.world_size))
            })
            .unwrap();
            prop_assert_eq!(&calls, &all);
            let mine = plan.channels(&options);
            prop_assert_eq!(set.len(), mine.len());
            for key in mine {
                let end = set.open(&key).unwrap();
                let other = if key.sender == rank { key.receiver } else { key.sender };
                prop_assert_eq!(end.peer, other);
                prop_assert_eq!(end.comm.rank(), rank);
            }
            prop_assert!(set.is_empty());
        }
    }
}

#[test]
fn a_duplicate_of_another_communicator_is_an_error_naming_both() {
    let spec = spec(&[1, 2]);
    let plan = StagePlan::new(&spec, 1).unwrap();
    let mut calls = 0;
    let err = duplicate_channels(&plan, &Options::training(4), |_| {
        calls += 1;
        Ok(world_comm(0, 2))
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("is rank 0 of 2, but the plan is rank 1 of 3"),
        "{err}"
    );
    // Still every channel's duplicate: the other ranks are not left waiting.
    assert_eq!(calls, channels(&spec, &Options::training(4)).unwrap().len());
}

#[test]
fn a_failing_duplicate_is_returned() {
    let spec = spec(&[1, 1]);
    let plan = StagePlan::new(&spec, 0).unwrap();
    let err = duplicate_channels::<ThreadComm, _>(&plan, &Options::training(2), |key| {
        Err(PipelineError::Start(format!("no duplicate for {key}")))
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "could not start the pipeline: no duplicate for Activations of 'h1' from rank 0 to rank 1"
    );
}
