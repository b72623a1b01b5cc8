//! Properties of validation: generated valid sets validate, the result never
//! depends on arrival order (valid or not), and a single conflicting rank is
//! named together with the lowest rank.

mod common;

use common::{data_type, device, reduce_op, request_kind, responses_identical};
use kolo_protocol::{validate, DataType, Device, ReduceOp, Request, RequestKind, ResponseKind};
use prop::sample::Index;
use proptest::prelude::*;

/// The knobs of a valid request set; see [`Plan::requests`].
#[derive(Clone, Debug)]
struct Plan {
    world_size: u32,
    kind: RequestKind,
    dtype: DataType,
    reduce_op: ReduceOp,
    scales: (f64, f64),
    gpu: bool,
    trailing: Vec<u64>,
    present: Vec<bool>,
    firsts: Vec<u64>,
    root: Index,
    explicit_splits: Vec<bool>,
    splits: Vec<Vec<u64>>,
}

impl Plan {
    /// One request per present rank (rank 0 if none is), in rank order.
    fn requests(&self) -> Vec<Request> {
        let ws = self.world_size;
        let nobody = !self.present.contains(&true);
        let mut out = Vec::new();
        for rank in 0..ws {
            let r = rank as usize;
            let present = self.present[r] || (rank == 0 && nobody);
            if !present {
                continue;
            }
            let with_first = |first: u64| [vec![first], self.trailing.clone()].concat();
            let mut splits = Vec::new();
            let shape = match self.kind {
                RequestKind::Allreduce | RequestKind::Broadcast => self.trailing.clone(),
                RequestKind::ReduceScatter => with_first(self.firsts[0] + 1),
                RequestKind::Allgather => with_first(self.firsts[r]),
                RequestKind::Alltoall if self.explicit_splits[r] => {
                    splits = self.splits[r][..ws as usize].to_vec();
                    with_first(splits.iter().sum())
                }
                RequestKind::Alltoall => with_first(self.firsts[r] * u64::from(ws)),
                RequestKind::Barrier | RequestKind::Join => Vec::new(),
            };
            out.push(Request {
                device: if self.gpu {
                    Device::Cuda(rank)
                } else {
                    Device::Cpu
                },
                root_rank: if self.kind == RequestKind::Broadcast {
                    self.root.index(ws as usize) as u32
                } else {
                    0
                },
                reduce_op: self.reduce_op,
                prescale: self.scales.0,
                postscale: self.scales.1,
                splits,
                ..Request::new(rank, "layer/3.grad", self.kind, self.dtype, shape)
            });
        }
        out
    }
}

fn scale() -> impl Strategy<Value = f64> {
    prop::sample::select(vec![1.0, 0.5, 0.125, 2.0])
}

fn plan() -> impl Strategy<Value = Plan> {
    (1u32..6).prop_flat_map(|ws| {
        let n = ws as usize;
        (
            (
                request_kind(),
                data_type(),
                reduce_op(),
                (scale(), scale()),
                any::<bool>(),
            ),
            prop::collection::vec(0u64..4, 0..3),
            prop::collection::vec(prop::bool::weighted(0.8), n),
            prop::collection::vec(0u64..4, n),
            any::<Index>(),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(prop::collection::vec(0u64..3, n), n),
        )
            .prop_map(
                move |(
                    (kind, dtype, reduce_op, scales, gpu),
                    trailing,
                    present,
                    firsts,
                    root,
                    explicit_splits,
                    splits,
                )| {
                    Plan {
                        world_size: ws,
                        kind,
                        dtype,
                        reduce_op,
                        scales,
                        gpu,
                        trailing,
                        present,
                        firsts,
                        root,
                        explicit_splits,
                        splits,
                    }
                },
            )
    })
}

/// A change to one request that may or may not make the set invalid.
#[derive(Clone, Debug)]
enum Mutation {
    Dtype(DataType),
    Kind(RequestKind),
    ReduceOp(ReduceOp),
    Shape(Vec<u64>),
    Root(u32),
    Device(Device),
    Prescale(f64),
    Postscale(f64),
    Splits(Vec<u64>),
    Rank(u32),
    Name(&'static str),
    Duplicate,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        data_type().prop_map(Mutation::Dtype),
        request_kind().prop_map(Mutation::Kind),
        reduce_op().prop_map(Mutation::ReduceOp),
        prop::collection::vec(0u64..5, 0..4).prop_map(Mutation::Shape),
        (0u32..7).prop_map(Mutation::Root),
        device().prop_map(Mutation::Device),
        scale().prop_map(Mutation::Prescale),
        scale().prop_map(Mutation::Postscale),
        prop::collection::vec(0u64..4, 0..6).prop_map(Mutation::Splits),
        (0u32..7).prop_map(Mutation::Rank),
        prop::sample::select(vec!["layer/3.grad", "layer/4.grad"]).prop_map(Mutation::Name),
        Just(Mutation::Duplicate),
    ]
}

fn apply(requests: &mut Vec<Request>, at: Index, mutation: Mutation) {
    let i = at.index(requests.len());
    let r = &mut requests[i];
    match mutation {
        Mutation::Dtype(d) => r.dtype = d,
        Mutation::Kind(k) => r.kind = k,
        Mutation::ReduceOp(o) => r.reduce_op = o,
        Mutation::Shape(s) => r.shape = s,
        Mutation::Root(root) => r.root_rank = root,
        Mutation::Device(d) => r.device = d,
        Mutation::Prescale(s) => r.prescale = s,
        Mutation::Postscale(s) => r.postscale = s,
        Mutation::Splits(s) => r.splits = s,
        Mutation::Rank(rank) => r.rank = rank,
        Mutation::Name(name) => r.tensor_name = name.into(),
        Mutation::Duplicate => {
            let copy = r.clone();
            requests.push(copy);
        }
    }
}

/// Fisher-Yates with proptest-chosen (and so shrinkable) indices.
fn shuffled(requests: &[Request], picks: &[Index]) -> Vec<Request> {
    let mut out = requests.to_vec();
    for i in (1..out.len()).rev() {
        out.swap(i, picks[i % picks.len()].index(i + 1));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn generated_valid_sets_validate_in_any_order(
        plan in plan(),
        picks in prop::collection::vec(any::<Index>(), 8),
    ) {
        let requests = plan.requests();
        let response = validate(&requests, plan.world_size);
        prop_assert_eq!(response.kind, ResponseKind::Op(plan.kind), "{}", response.error_message);
        prop_assert_eq!(response.devices.len(), requests.len());
        if plan.kind == RequestKind::Allgather {
            prop_assert_eq!(response.first_dims.len(), plan.world_size as usize);
            for r in &requests {
                prop_assert_eq!(response.first_dims[r.rank as usize], r.shape[0]);
            }
        }
        if plan.kind == RequestKind::Alltoall {
            prop_assert_eq!(response.splits.len(), (plan.world_size * plan.world_size) as usize);
        }
        let again = validate(&shuffled(&requests, &picks), plan.world_size);
        prop_assert!(responses_identical(&again, &response), "{:?} vs {:?}", again, response);
    }

    #[test]
    fn mutated_sets_validate_the_same_in_any_order(
        plan in plan(),
        mutations in prop::collection::vec((any::<Index>(), mutation()), 1..4),
        picks in prop::collection::vec(any::<Index>(), 8),
    ) {
        let mut requests = plan.requests();
        for (at, m) in mutations {
            apply(&mut requests, at, m);
        }
        let response = validate(&requests, plan.world_size);
        let again = validate(&shuffled(&requests, &picks), plan.world_size);
        prop_assert!(responses_identical(&again, &response), "{:?} vs {:?}", again, response);
        if response.is_error() {
            prop_assert!(response.error_message.ends_with('.'));
            prop_assert_eq!(response.tensor_names.len(), 1);
        }
    }

    #[test]
    fn one_conflicting_rank_is_named_with_the_lowest(
        plan in plan(),
        at in any::<Index>(),
        field in 0u8..3,
        picks in prop::collection::vec(any::<Index>(), 8),
    ) {
        let mut requests = plan.requests();
        prop_assume!(requests.len() >= 2);
        let kind = plan.kind;
        let plain = !matches!(kind, RequestKind::Barrier | RequestKind::Join);
        let i = 1 + at.index(requests.len() - 1);
        let (a, b) = match field {
            0 => {
                let other = if kind == RequestKind::Join { RequestKind::Barrier } else { RequestKind::Join };
                requests[i].kind = other;
                (kind.name().to_string(), other.name().to_string())
            }
            1 if plain => {
                let other = if plan.dtype == DataType::U8 { DataType::I8 } else { DataType::U8 };
                requests[i].dtype = other;
                (plan.dtype.name().to_string(), other.name().to_string())
            }
            2 if plain => {
                let other = if plan.gpu { Device::Cpu } else { Device::Cuda(9) };
                requests[i].device = other;
                (requests[0].device.to_string(), other.to_string())
            }
            _ => return Ok(()),
        };
        let (low, high) = (requests[0].rank, requests[i].rank);
        let verb = if field == 0 { "requested" } else { "sent" };
        let response = validate(&shuffled(&requests, &picks), plan.world_size);
        prop_assert!(response.is_error());
        let message = &response.error_message;
        for needle in [
            "'layer/3.grad'".to_string(),
            format!("rank {low} {verb} {a}"),
            format!("rank {high} {verb} {b}"),
        ] {
            prop_assert!(message.contains(&needle), "{:?} lacks {:?}", message, needle);
        }
    }
}
