use super::bomb::{Bomb, ARMED};
use super::on_ranks;
use crate::{communicators, run, ThreadsError};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Controller, Scale, Topology, TransportError};
use std::thread;

fn peer_failed(err: &TransportError, rank: usize) -> bool {
    matches!(err, TransportError::PeerFailed { rank: r, .. } if *r == rank)
}

#[test]
fn an_erroring_rank_fails_its_blocked_peers_and_is_named_first() {
    let err = run(4, |comm| {
        if comm.rank() == 2 {
            return Err(TransportError::Backend("disk full".into()));
        }
        let mut buf = [1.0f32; 4];
        comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)
    })
    .unwrap_err();
    assert_eq!(err.failures.len(), 4);
    assert_eq!(err.failures[0].rank, 2);
    assert_eq!(err.failures[0].message, "backend error: disk full");
    assert!(!err.failures[0].panicked);
    for failure in &err.failures[1..] {
        assert_eq!(failure.message, "rank 2 failed: backend error: disk full");
    }
    assert!(err
        .to_string()
        .starts_with("rank 2 failed: backend error: disk full; then rank 0"));
}

#[test]
fn a_rank_failing_mid_loop_fails_all_eight_ranks_on_either_path() {
    for (victim, at) in [(0, 0), (3, 5), (7, 12)] {
        let err = run(8, |comm| {
            for iteration in 0..16 {
                if comm.rank() == victim && iteration == at {
                    return Err(TransportError::Backend(format!("stopped at {iteration}")));
                }
                // Alternate the small and the in-place path.
                let len = if iteration % 2 == 0 { 3 } else { 30_000 };
                let mut buf = vec![1i32; len];
                comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)?;
                assert_eq!(buf, vec![8; len]);
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.failures.len(), 8, "{err}");
        assert_eq!(err.failures[0].rank, victim);
        assert_eq!(
            err.failures[0].message,
            format!("backend error: stopped at {at}")
        );
        assert!(err.failures[1..]
            .iter()
            .all(|f| f.message.starts_with(&format!("rank {victim} failed"))));
    }
}

#[test]
fn a_panicking_rank_fails_peers_waiting_in_recv_and_barrier() {
    let err = run(3, |comm| {
        match comm.rank() {
            1 => panic!("out of cheese"),
            0 => {
                let mut buf = [0u8; 1];
                comm.recv(&mut buf, 1, 0)?;
            }
            _ => comm.barrier()?,
        }
        Ok::<_, TransportError>(())
    })
    .unwrap_err();
    let root = &err.failures[0];
    assert_eq!(
        (root.rank, root.panicked, root.message.as_str()),
        (1, true, "out of cheese")
    );
    assert_eq!(err.failures.len(), 3);
    assert!(err.failures[1..]
        .iter()
        .all(|f| f.message == "rank 1 failed: panicked: out of cheese"));
}

#[test]
fn a_panic_inside_a_collective_fails_the_round_on_every_rank() {
    for len in [8, 100_000] {
        let err = run(3, |comm| {
            ARMED.set(comm.rank() == 1);
            let mut buf = vec![Bomb(1); len];
            comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)
        })
        .unwrap_err();
        assert_eq!(err.failures[0].rank, 1);
        assert!(err.failures[0].panicked);
        assert_eq!(err.failures.len(), 3, "{err}");
        assert!(
            err.failures[1..]
                .iter()
                .all(|f| f.message.contains("rank 1 abandoned allreduce")),
            "{err}"
        );
    }
}

#[test]
fn fail_marks_the_rank_for_present_and_future_waiters() {
    let results = on_ranks(3, |comm| {
        if comm.rank() == 0 {
            comm.fail("bad batch");
            return Ok(None);
        }
        let mut buf = [0i16; 2];
        Ok(Some(comm.recv(&mut buf, 0, 1).unwrap_err()))
    });
    let expected = TransportError::PeerFailed {
        rank: 0,
        message: "bad batch".into(),
    };
    assert_eq!(results, [None, Some(expected.clone()), Some(expected)]);
}

#[test]
fn a_departed_rank_delivers_its_messages_then_fails_waiters() {
    let results = on_ranks(2, |comm| {
        if comm.rank() == 1 {
            comm.send(&[1i32], 0, 9)?;
            comm.send(&[2i32], 0, 9)?;
            return Ok(None);
        }
        let (mut a, mut b) = ([0i32], [0i32]);
        comm.recv(&mut a, 1, 9)?;
        comm.recv(&mut b, 1, 9)?;
        let third = comm.recv(&mut a, 1, 9).unwrap_err();
        let barrier = comm.barrier().unwrap_err();
        Ok(Some((a[0], b[0], third, barrier)))
    });
    let (a, b, third, barrier) = results[0].clone().unwrap();
    assert_eq!((a, b), (1, 2));
    let left = TransportError::PeerFailed {
        rank: 1,
        message: "rank 1 left the communicator".into(),
    };
    assert_eq!((third, barrier), (left.clone(), left));
}

#[test]
fn dropping_a_communicator_wakes_a_sleeping_peer() {
    let mut comms = communicators(2).unwrap();
    let mut leaver = comms.pop().unwrap();
    let mut stayer = comms.pop().unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(move || stayer.barrier());
        leaver
            .barrier()
            .unwrap_or_else(|e| panic!("first barrier: {e}"));
        drop(leaver);
        // The first barrier completed for both; the stayer's result is Ok.
        assert_eq!(waiter.join().unwrap(), Ok(()));
    });
    let mut comms = communicators(2).unwrap();
    let leaver = comms.pop().unwrap();
    let mut stayer = comms.pop().unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(move || stayer.control_barrier());
        thread::sleep(std::time::Duration::from_millis(30));
        drop(leaver);
        assert!(peer_failed(&waiter.join().unwrap().unwrap_err(), 1));
    });
}

#[test]
fn mismatched_lengths_are_an_error_on_every_rank_and_the_next_call_works() {
    // Both paths: one rank's length would pick the other path.
    for (len, odd_len) in [(4, 5), (40_000, 8)] {
        let results = on_ranks(3, |comm| {
            let mut buf = vec![1i32; if comm.rank() == 1 { odd_len } else { len }];
            let err = comm
                .allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)
                .unwrap_err();
            let mut ok = vec![1i32; 4];
            comm.allreduce(&mut ok, ReduceOp::Sum, Scale::NONE)?;
            Ok((err, ok))
        });
        let message =
            format!("allreduce: rank 1 passed {odd_len} elements but rank 0 passed {len}");
        for (err, ok) in results {
            assert_eq!(err, TransportError::InvalidArgument(message.clone()));
            assert_eq!(ok, [3; 4]);
        }
    }
}

#[test]
fn different_collectives_or_roots_are_an_error_on_every_rank() {
    let results = on_ranks(2, |comm| {
        let mut buf = [0u8; 4];
        let first = if comm.rank() == 0 {
            comm.allreduce(&mut buf, ReduceOp::Max, Scale::NONE)
        } else {
            comm.broadcast(&mut buf, 0)
        };
        let second = comm.broadcast_bytes(b"x", comm.rank());
        comm.barrier()?;
        Ok((first.unwrap_err(), second.unwrap_err()))
    });
    for (first, second) in results {
        assert_eq!(
            first.to_string(),
            "invalid argument: collective mismatch: rank 1 called broadcast while rank 0 called allreduce"
        );
        assert!(second
            .to_string()
            .contains("rank 1 named root 1 while rank 0 named root 0"));
    }
}

#[test]
fn bad_counts_peers_and_receive_lengths_are_errors() {
    let results = on_ranks(2, |comm| {
        let mut recv = [0i32; 3];
        let gather = comm.allgatherv(&[1, 2], &mut recv, &[2, 2]).unwrap_err();
        let peer = comm.send(&[1u8], 5, 0).unwrap_err();
        comm.send(&[1i32, 2, 3], 1 - comm.rank(), 4)?;
        let mut short = [0i32; 2];
        let length = comm.recv(&mut short, 1 - comm.rank(), 4).unwrap_err();
        comm.send(&[1.0f32], 1 - comm.rank(), 4)?;
        let dtype = comm.recv(&mut short[..1], 1 - comm.rank(), 4).unwrap_err();
        Ok([gather, peer, length, dtype].map(|e| e.to_string()))
    });
    for [gather, peer, length, dtype] in results {
        assert!(
            gather.contains(
                "allgatherv: rank 0's receive buffer holds 3 elements but the counts add up to 4"
            ),
            "{gather}"
        );
        assert!(
            peer.contains("peer 5 is not a rank of this 2-rank communicator"),
            "{peer}"
        );
        assert!(
            length.contains("the message has 3 elements but the receive buffer has 2"),
            "{length}"
        );
        assert!(
            dtype.contains("the message holds f32 elements but the receive buffer holds i32"),
            "{dtype}"
        );
    }
}

#[test]
fn zero_ranks() {
    assert_eq!(
        communicators(0).unwrap_err(),
        ThreadsError::NoRanks { requested: 0 }
    );
    let results = run(0, |_| Ok::<_, TransportError>(1)).unwrap();
    assert!(results.is_empty());
}

#[test]
fn a_communicator_can_move_to_another_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<crate::ThreadComm>();
}

#[test]
fn topology_is_rank_and_size() {
    let results = on_ranks(3, |comm| {
        Ok((
            comm.rank(),
            comm.size(),
            comm.local_rank(),
            comm.local_size(),
        ))
    });
    assert_eq!(results, [(0, 3, 0, 3), (1, 3, 1, 3), (2, 3, 2, 3)]);
}

#[test]
fn a_rank_failing_in_a_ring_of_large_sendrecvs_fails_every_rank() {
    // Lent buffers (large) and eager copies (small), victims at every
    // position of the ring: no rank waits forever on a lent buffer.
    for (victim, len) in [(0, 100_000), (2, 100_000), (1, 5)] {
        let err = run(4, |comm| {
            let (me, n) = (comm.rank(), comm.size());
            for round in 0..8 {
                if me == victim && round == 3 {
                    return Err(TransportError::Backend(format!("stopped at {round}")));
                }
                let send = vec![(me * 10 + round) as i64; len];
                let mut recv = vec![0i64; len];
                comm.sendrecv(&send, (me + 1) % n, &mut recv, (me + n - 1) % n, 4)?;
                assert_eq!(recv[len - 1], (((me + n - 1) % n) * 10 + round) as i64);
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.failures.len(), 4, "{err}");
        assert_eq!(err.failures[0].rank, victim, "{err}");
    }
}
