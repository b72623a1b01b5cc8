use super::*;
use crate::spec::TensorSpec;

fn spec(widths: &[usize]) -> PipelineSpec {
    let mut spec = PipelineSpec::with_widths(widths);
    for s in 1..widths.len() {
        spec = spec.tensor(
            TensorSpec::new(format!("h{s}"), DataType::F32, s as u32)
                .from_stage(s - 1)
                .to_stage(s),
        );
    }
    spec
}

#[test]
fn a_rank_knows_its_stage_replica_and_neighbours() {
    let spec = spec(&[1, 2, 1]).tensor(
        TensorSpec::new("labels", DataType::I64, 9)
            .from_stage(0)
            .to_stage(2)
            .without_gradient(),
    );
    let plan = StagePlan::new(&spec, 2).unwrap();
    assert_eq!(
        (plan.stage(), plan.index_in_stage(), plan.stage_width()),
        (1, 1, 2)
    );
    assert_eq!(plan.previous_stage_ranks(), &[0]);
    assert_eq!(plan.next_stage_ranks(), &[3]);
    let h1 = plan.tensor("h1").unwrap();
    assert_eq!(
        (h1.receive_from.as_slice(), h1.send_to.as_slice()),
        (&[0][..], &[][..])
    );
    let h2 = plan.tensor("h2").unwrap();
    assert_eq!(h2.send_to, [3]);
    assert!(plan.tensor("labels").unwrap().send_to.is_empty());

    let first = StagePlan::new(&spec, 0).unwrap();
    assert!(first.previous_stage_ranks().is_empty());
    assert_eq!(first.tensor("h1").unwrap().send_to, [1, 2]);
    assert_eq!(first.tensor("labels").unwrap().send_to, [3]);
    let last = StagePlan::new(&spec, 3).unwrap();
    assert_eq!(last.tensor("labels").unwrap().receive_from, [0]);
    assert_eq!(last.rank_for(1, 5), Some(2));

    assert_eq!(
        StagePlan::new(&spec, 4).unwrap_err(),
        PlanError::NotInWorld {
            rank: 4,
            world_size: 4
        }
    );
}

#[test]
fn disconnected_replicas_are_not_peers() {
    // Widths 2 → 4: replica 0 only ever talks to replicas 0 and 2.
    let spec = spec(&[2, 4]);
    let plan = StagePlan::new(&spec, 0).unwrap();
    assert_eq!(plan.tensor("h1").unwrap().send_to, [2, 4]);
    let plan = StagePlan::new(&spec, 3).unwrap();
    assert_eq!(plan.tensor("h1").unwrap().receive_from, [1]);
}

#[test]
fn both_ends_of_every_channel_agree_on_its_message_count() {
    for widths in [&[1, 1][..], &[1, 2, 1], &[2, 3], &[1, 3, 2, 1], &[2, 4, 2]] {
        let spec = spec(widths);
        for options in [
            Options::training(7),
            Options::forward_only(5, 2),
            Options::training(1),
        ] {
            let all = channels(&spec, &options).unwrap();
            let mut ends: HashMap<ChannelKey, Vec<u64>> = HashMap::new();
            for rank in 0..spec.world_size {
                let plan = StagePlan::new(&spec, rank).unwrap();
                let mine = plan.channels(&options);
                for link in plan.links(&options) {
                    let key = link.data_channel(rank);
                    assert!(mine.contains(&key), "{key} missing on rank {rank}");
                    ends.entry(key).or_default().push(link.expected);
                    if link.acked {
                        let key = link.ack_channel(rank);
                        assert!(mine.contains(&key), "{key} missing on rank {rank}");
                        ends.entry(key).or_default().push(link.expected);
                    }
                }
            }
            assert_eq!(ends.len(), all.len(), "{widths:?} {options:?}");
            for key in &all {
                let counts = &ends[key];
                assert_eq!(counts.len(), 2, "{key}: {counts:?}");
                assert_eq!(counts[0], counts[1], "{key}");
            }
            // Each receiver gets every minibatch of its replica exactly once.
            let total: u64 = all
                .iter()
                .filter(|k| k.kind == ChannelKind::Activations)
                .map(|k| ends[k][0])
                .sum();
            assert_eq!(total, options.iterations * (widths.len() as u64 - 1));
        }
    }
}

#[test]
fn options_are_validated() {
    let err = channels(&spec(&[1, 1]), &Options::forward_only(3, 0)).unwrap_err();
    assert_eq!(err, PlanError::ZeroWindow);
}
