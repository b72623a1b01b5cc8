//! The kolo-conformance suite on the threads backend: once on its native
//! shared-memory collectives, once on kolo-transport's generic
//! point-to-point algorithms over its send / recv (`Generic`), for every
//! communicator size from 1 to 8.

use kolo_conformance::{
    check_barrier_counter, random_cases_strategy, run_random_cases, run_suite, SuiteOptions,
};
use kolo_transport::Generic;
use proptest::prelude::*;
use std::sync::atomic::AtomicUsize;

fn native_suite(n: usize) {
    let opts = SuiteOptions::default();
    let reports = kolo_threads::run(n, |comm| run_suite(comm, &opts))
        .unwrap_or_else(|err| panic!("n={n}: {err}"));
    assert_eq!(reports.len(), n);
    assert!(
        reports.windows(2).all(|w| w[0] == w[1]),
        "every rank ran the same cases"
    );
    assert!(reports[0].cases > 500, "n={n}: {}", reports[0]);
}

fn generic_suite(n: usize) {
    let opts = SuiteOptions::default();
    let reports = kolo_threads::run(n, |comm| run_suite(&mut Generic(&mut *comm), &opts))
        .unwrap_or_else(|err| panic!("n={n}: {err}"));
    assert_eq!(reports.len(), n);
    assert!(
        reports.windows(2).all(|w| w[0] == w[1]),
        "every rank ran the same cases"
    );
    assert!(reports[0].cases > 500, "n={n}: {}", reports[0]);
}

macro_rules! suite_per_size {
    ($($native:ident, $generic:ident: $n:expr;)*) => {$(
        #[test]
        fn $native() {
            native_suite($n);
        }

        #[test]
        fn $generic() {
            generic_suite($n);
        }
    )*};
}

suite_per_size! {
    native_1_rank, generic_1_rank: 1;
    native_2_ranks, generic_2_ranks: 2;
    native_3_ranks, generic_3_ranks: 3;
    native_4_ranks, generic_4_ranks: 4;
    native_5_ranks, generic_5_ranks: 5;
    native_6_ranks, generic_6_ranks: 6;
    native_7_ranks, generic_7_ranks: 7;
    native_8_ranks, generic_8_ranks: 8;
}

#[test]
fn barriers_hold_every_rank_until_all_arrive() {
    for n in [2, 3, 5, 8] {
        let arrivals = AtomicUsize::new(0);
        kolo_threads::run(n, |comm| check_barrier_counter(comm, &arrivals, 25))
            .unwrap_or_else(|err| panic!("native, n={n}: {err}"));
        let arrivals = AtomicUsize::new(0);
        kolo_threads::run(n, |comm| {
            check_barrier_counter(&mut Generic(&mut *comm), &arrivals, 25)
        })
        .unwrap_or_else(|err| panic!("generic, n={n}: {err}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random sequences of collectives (op, dtype, count, root), the same
    /// on every rank, on both the native and the generic collectives.
    #[test]
    fn random_collective_sequences(
        n in 1usize..=8,
        cases in random_cases_strategy(8, 600),
    ) {
        let native = kolo_threads::run(n, |comm| run_random_cases(comm, &cases));
        let native = native.map_err(|err| TestCaseError::fail(format!("native: {err}")))?;
        prop_assert!(native.iter().all(|report| report.cases == cases.len()));
        let generic = kolo_threads::run(n, |comm| run_random_cases(&mut Generic(&mut *comm), &cases));
        let generic = generic.map_err(|err| TestCaseError::fail(format!("generic: {err}")))?;
        prop_assert!(generic.iter().all(|report| report.cases == cases.len()));
    }
}
