use super::wire::{decode, encode};
use super::*;
use clap::Parser;
use proptest::prelude::*;

fn args(extra: &[&str]) -> Args {
    Args::try_parse_from(std::iter::once("kolo-bench").chain(extra.iter().copied()))
        .expect("valid arguments")
}

fn offer_of(extra: &[&str]) -> Offer {
    let args = args(extra);
    let plan = args.plan().expect("a plan");
    let engine = (args.engine || args.compare)
        .then(|| EngineOptions::from_args(&args).expect("engine options"));
    Offer {
        fields: fields(&args, &plan, engine.as_ref()),
        need: Some(1 << 20),
        available: Some(1 << 30),
        source: "test".into(),
        local_ranks: 2,
        problem: None,
    }
}

fn disagreement(a: &[&str], b: &[&str]) -> String {
    let offers = [offer_of(a), offer_of(b)];
    match decide(&offers) {
        Err(e @ BenchError::Disagreement { .. }) => e.to_string(),
        other => panic!("{a:?} against {b:?}: {other:?}"),
    }
}

#[test]
fn the_issues_mismatches_name_both_values_and_ranks() {
    let err = disagreement(&["--op", "allreduce"], &["--op", "allgather"]);
    assert!(
        err.contains("--op") && err.contains("rank 0 has allreduce, rank 1 has allgather"),
        "{err}"
    );
    let err = disagreement(&["--iters", "2"], &["--iters", "5"]);
    assert!(err.contains("--iters: rank 0 has 2, rank 1 has 5"), "{err}");
    let err = disagreement(&["--op", "allreduce"], &["--op", "allreduce,broadcast"]);
    assert!(err.contains("allreduce,broadcast"), "{err}");
    let err = disagreement(&["--dtype", "f32"], &["--dtype", "i32"]);
    assert!(
        err.contains("--dtype: rank 0 has f32, rank 1 has i32"),
        "{err}"
    );
    let err = disagreement(&["--engine"], &[]);
    assert!(err.contains("mode: rank 0 has --engine"), "{err}");
    let err = disagreement(&["--engine", "--tensors", "2"], &["--engine"]);
    assert!(
        err.contains("--tensors: rank 0 has 2, rank 1 has 1"),
        "{err}"
    );
    let err = disagreement(&["--engine", "--tensor-group"], &["--engine", "--grouped"]);
    assert!(err.contains("submission"), "{err}");
    let err = disagreement(&["--no-check"], &[]);
    assert!(
        err.contains("--check: rank 0 has off, rank 1 has on"),
        "{err}"
    );
}

#[test]
fn the_first_field_wins_and_the_lowest_rank() {
    let offers = [
        offer_of(&[]),
        offer_of(&[]),
        offer_of(&["--warmup", "3", "--iters", "4"]),
        offer_of(&["--iters", "9"]),
    ];
    let err = decide(&offers).unwrap_err().to_string();
    assert!(
        err.contains("--iters: rank 0 has 20, rank 2 has 4"),
        "{err}"
    );
}

#[test]
fn a_field_only_one_rank_has_is_a_disagreement() {
    let mut older = offer_of(&[]);
    older.fields.pop();
    let err = decide(&[offer_of(&[]), older]).unwrap_err().to_string();
    assert!(
        err.contains("--ranks") && err.contains("rank 1 has nothing"),
        "{err}"
    );
}

#[test]
fn equal_plans_agree() {
    let offers = vec![offer_of(&["--op", "all"]); 3];
    assert!(decide(&offers).is_ok());
    assert!(decide(&[]).is_ok());
}

#[test]
fn a_ranks_problem_stops_every_rank_naming_it() {
    let mut offers = vec![offer_of(&[]); 3];
    offers[1].problem = Some("writing /x.json: denied".into());
    let err = decide(&offers).unwrap_err().to_string();
    assert_eq!(err, "rank 1 cannot run: writing /x.json: denied");
}

#[test]
fn memory_counts_every_rank_of_a_host() {
    let mut offers = vec![offer_of(&[]); 2];
    for offer in &mut offers {
        offer.need = Some(600);
        offer.available = Some(1000);
        offer.local_ranks = 1;
    }
    assert!(decide(&offers).is_ok());
    offers[1].local_ranks = 2;
    offers[1].source = "MemAvailable in /proc/meminfo".into();
    let err = decide(&offers).unwrap_err().to_string();
    assert!(
        err.contains("rank 1")
            && err.contains("600 B per rank x 2 rank(s)")
            && err.contains("= 1200 B")
            && err.contains("1000 B is available (MemAvailable in /proc/meminfo)"),
        "{err}"
    );
    offers[1].available = None;
    assert!(decide(&offers).is_ok(), "unknown memory is not checked");
    offers[0].need = Some(u64::MAX);
    offers[0].local_ranks = 2;
    let err = decide(&offers).unwrap_err().to_string();
    assert!(err.contains("more than 2^64"), "{err}");
    offers[0].need = None;
    let err = decide(&offers).unwrap_err().to_string();
    assert!(
        err.contains("--max-bytes 67108864") && err.contains("2^64"),
        "{err}"
    );
}

#[test]
fn what_is_not_a_plan_is_named() {
    let err = decode(&[], 3).unwrap_err().to_string();
    assert!(err.contains("rank 3") && err.contains("empty"), "{err}");
    let err = decode(b"hello", 1).unwrap_err().to_string();
    assert!(err.contains("not a kolo-bench plan"), "{err}");
    let mut bytes = encode(&offer_of(&[]));
    bytes.push(0);
    let err = decode(&bytes, 2).unwrap_err().to_string();
    assert!(err.contains("1 bytes after the end"), "{err}");
    bytes.truncate(bytes.len() - 9);
    let err = decode(&bytes, 2).unwrap_err().to_string();
    assert!(err.contains("rank 2") && err.contains("left"), "{err}");
}

fn any_offer() -> impl Strategy<Value = Offer> {
    (
        prop::collection::vec((".{0,12}", ".{0,12}"), 0..8),
        any::<Option<u64>>(),
        any::<Option<u64>>(),
        ".{0,20}",
        any::<u64>(),
        prop::option::of(".{0,20}"),
    )
        .prop_map(
            |(fields, need, available, source, local_ranks, problem)| Offer {
                fields,
                need,
                available,
                source,
                local_ranks,
                problem,
            },
        )
}

proptest! {
    #[test]
    fn offers_round_trip(offer in any_offer()) {
        prop_assert_eq!(decode(&encode(&offer), 0).unwrap(), offer);
    }

    #[test]
    fn garbage_is_an_error_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), cut in 0usize..400) {
        let _ = decode(&bytes, 1);
        let real = encode(&offer_of(&[]));
        let cut = cut.min(real.len());
        prop_assert!(decode(&real[..cut], 1).is_err() || cut == real.len());
    }

    /// One rank with one setting changed: the error names that setting,
    /// rank 0's value, that rank and its value.
    #[test]
    fn one_changed_setting_is_found(ranks in 2usize..6, rank_pick in any::<prop::sample::Index>(), field_pick in any::<prop::sample::Index>(), suffix in "[a-z]{1,4}") {
        let changed = 1 + rank_pick.index(ranks - 1);
        let base = offer_of(&["--engine", "--op", "all"]);
        let mut offers = vec![base.clone(); ranks];
        let field = field_pick.index(base.fields.len());
        offers[changed].fields[field].1.push_str(&suffix);
        let (name, value) = base.fields[field].clone();
        let new_value = offers[changed].fields[field].1.clone();
        match decide(&offers) {
            Err(BenchError::Disagreement { field: f, first_rank, first_value, rank, value: v }) => {
                prop_assert_eq!(f, name);
                prop_assert_eq!((first_rank, rank), (0, changed));
                prop_assert_eq!(first_value, value);
                prop_assert_eq!(v, new_value);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    /// Changing rank 0 makes every other rank the one named: the first, rank 1.
    #[test]
    fn a_changed_rank_0_names_rank_1(ranks in 2usize..6, field_pick in any::<prop::sample::Index>()) {
        let base = offer_of(&[]);
        let mut offers = vec![base.clone(); ranks];
        let field = field_pick.index(base.fields.len());
        offers[0].fields[field].1.push('!');
        let verdict = decide(&offers);
        let named_rank_1 = matches!(verdict, Err(BenchError::Disagreement { rank: 1, .. }));
        prop_assert!(named_rank_1);
    }
}
