//! The suite on the reference mailbox backend (every collective through the
//! generic algorithms), and the suite catching broken backends.

use kolo_conformance::{
    check_allreduce, check_allreduce_segments, check_broadcast, mailbox, run_random_cases,
    run_suite, Failure, SuiteOptions,
};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{BitOp, Collectives, Controller, Element, Result, Scale, Topology};
use proptest::prelude::*;

#[test]
fn quick_suite_passes_for_every_size() {
    for n in 1..=5 {
        let opts = SuiteOptions::quick();
        for (rank, result) in mailbox::run(n, |comm| run_suite(comm, &opts))
            .into_iter()
            .enumerate()
        {
            let report = result.unwrap_or_else(|f| panic!("n={n} rank={rank}: {f}"));
            assert!(report.cases > 100, "n={n}: {report}");
        }
    }
}

#[test]
fn full_suite_passes_with_large_cases() {
    let opts = SuiteOptions {
        large_bytes: 1 << 20,
        ..SuiteOptions::default()
    };
    let reports: Vec<_> = mailbox::run(3, |comm| run_suite(comm, &opts))
        .into_iter()
        .map(|r| r.unwrap_or_else(|f| panic!("{f}")))
        .collect();
    assert!(
        reports.windows(2).all(|w| w[0] == w[1]),
        "every rank runs the same cases"
    );
    assert!(reports[0].per_operation["allreduce"] >= 11 * 5 * 10);
}

/// Forwards everything to the real backend, then corrupts one element of
/// one rank's allreduce result, or broadcasts from the wrong root.
struct Broken<C> {
    inner: C,
    flaw: Flaw,
}

#[derive(Clone, Copy)]
enum Flaw {
    AllreduceElement { rank: usize, index: usize },
    BroadcastFromZero,
}

impl<C: Topology> Topology for Broken<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn local_size(&self) -> usize {
        self.inner.local_size()
    }
}

impl<C: Controller> Controller for Broken<C> {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        self.inner.gather_bytes(msg, root)
    }
    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        self.inner.broadcast_bytes(msg, root)
    }
    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.inner.allgather_bytes(msg)
    }
    fn control_barrier(&mut self) -> Result<()> {
        self.inner.control_barrier()
    }
    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        self.inner.bitwise_allreduce(words, op)
    }
}

impl<C: Collectives> Collectives for Broken<C> {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.inner.send(buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.inner.recv(buf, peer, tag)
    }
    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        self.inner.allreduce(buf, op, scale)?;
        if let Flaw::AllreduceElement { rank, index } = self.flaw {
            if self.rank() == rank && index < buf.len() {
                buf[index] = T::from_f64(buf[index].to_f64() + 1.0);
            }
        }
        Ok(())
    }
    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        match self.flaw {
            Flaw::BroadcastFromZero => self.inner.broadcast(buf, 0),
            _ => self.inner.broadcast(buf, root),
        }
    }
}

#[test]
fn a_wrong_element_fails_on_every_rank_naming_rank_and_index() {
    let results = mailbox::run(4, |comm| {
        let mut broken = Broken {
            inner: comm,
            flaw: Flaw::AllreduceElement { rank: 2, index: 3 },
        };
        check_allreduce::<i32, _>(&mut broken, 10, ReduceOp::Sum, Scale::NONE)
    });
    for (rank, result) in results.into_iter().enumerate() {
        let failure = result.expect_err("the corrupted allreduce must fail");
        assert_eq!(failure.rank(), 2, "rank {rank}: {failure}");
        assert!(
            failure
                .case()
                .contains("allreduce dtype=i32 count=10 op=sum"),
            "{failure}"
        );
        match (rank, &failure) {
            (
                2,
                Failure::Mismatch {
                    index,
                    expected,
                    got,
                    ..
                },
            ) => {
                assert_eq!(*index, 3);
                assert_eq!(
                    got.parse::<i32>().unwrap(),
                    expected.parse::<i32>().unwrap() + 1
                );
            }
            (
                _,
                Failure::Peer {
                    observer, message, ..
                },
            ) => {
                assert_eq!(*observer, rank);
                assert!(message.contains("rank 2, index 3"), "{message}");
            }
            _ => panic!("rank {rank}: unexpected failure {failure:?}"),
        }
    }
}

#[test]
fn a_wrong_segment_element_is_reported_at_its_index_in_the_concatenation() {
    // The default allreduce_segments runs the broken allreduce per segment:
    // only the 5-element segment has an index 3.
    let results = mailbox::run(3, |comm| {
        let mut broken = Broken {
            inner: comm,
            flaw: Flaw::AllreduceElement { rank: 2, index: 3 },
        };
        check_allreduce_segments::<f32, _>(&mut broken, &[2, 0, 5], ReduceOp::Max, Scale::NONE)
    });
    for (rank, result) in results.into_iter().enumerate() {
        let failure = result.expect_err("the corrupted segment must fail");
        assert_eq!(failure.rank(), 2, "rank {rank}: {failure}");
        assert!(
            failure
                .case()
                .starts_with("allreduce_segments dtype=f32 lens=[2, 0, 5] total=7 op=max"),
            "{failure}"
        );
        assert!(failure.to_string().contains("rank 2, index 5"), "{failure}");
    }
}

#[test]
fn the_suite_stops_at_the_first_broken_case() {
    let results = mailbox::run(2, |comm| {
        let mut broken = Broken {
            inner: comm,
            flaw: Flaw::AllreduceElement { rank: 1, index: 0 },
        };
        run_suite(&mut broken, &SuiteOptions::quick())
    });
    for result in results {
        let failure = result.expect_err("allreduce is broken");
        assert_eq!(failure.rank(), 1, "{failure}");
        assert!(
            failure
                .case()
                .starts_with("allreduce dtype=u8 count=1 op=sum"),
            "{failure}"
        );
    }
}

#[test]
fn broadcast_from_the_wrong_root_is_caught() {
    let results = mailbox::run(3, |comm| {
        let mut broken = Broken {
            inner: comm,
            flaw: Flaw::BroadcastFromZero,
        };
        check_broadcast::<f32, _>(&mut broken, 5, 0)?;
        check_broadcast::<f32, _>(&mut broken, 5, 2)
    });
    for result in results {
        let failure = result.expect_err("root 2 was ignored");
        assert!(failure.case().contains("root=2"), "{failure}");
    }
}

#[test]
fn counts_of_the_wrong_length_are_a_failure_not_a_hang() {
    let results = mailbox::run(3, |comm| {
        kolo_conformance::check_allgatherv::<u8, _>(comm, &[1, 2])
    });
    for result in results {
        let failure = result.expect_err("two counts for three ranks");
        assert!(
            failure.to_string().contains("2 counts for 3 ranks"),
            "{failure}"
        );
    }
}

#[test]
fn the_large_case_runs_every_large_dtype() {
    let opts = SuiteOptions {
        dtypes: vec![],
        controller: false,
        large_bytes: 64 << 10,
        large_dtypes: vec![DataType::U8, DataType::F16],
        ..SuiteOptions::default()
    };
    for result in mailbox::run(2, |comm| run_suite(comm, &opts)) {
        let report = result.unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(report.per_operation["allreduce"], 2);
        assert_eq!(report.per_operation["alltoallv"], 2);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_pass(
        n in 1usize..=5,
        cases in kolo_conformance::random_cases_strategy(6, 300),
    ) {
        for result in mailbox::run(n, |comm| run_random_cases(comm, &cases)) {
            let report = result.map_err(|f| TestCaseError::fail(f.to_string()))?;
            prop_assert_eq!(report.cases, cases.len());
        }
    }
}
