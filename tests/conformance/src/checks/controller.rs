//! The control plane: gather, broadcast and allgather of byte messages,
//! barrier, bitwise allreduce.

use crate::failure::{agree, check, transport, Failure};
use crate::values::{mix, salt_of};
use kolo_transport::{BitOp, Controller};

/// Rank `rank`'s message in a case: its length varies with rank and
/// `variant` (0 for some, 70 000 bytes for one rank when `variant` is 0).
fn message(salt: u64, rank: usize, size: usize, variant: usize) -> Vec<u8> {
    let len = if (rank + variant) % 3 == 0 {
        0
    } else {
        1 + (rank * 37 + variant * 11) % 300
    };
    let len = len
        + if variant == 0 && rank + 1 == size {
            70_000
        } else {
            0
        };
    (0..len as u64).map(|i| mix(salt, rank, i) as u8).collect()
}

fn describe(msg: &[u8]) -> String {
    format!(
        "{} bytes starting {:?}",
        msg.len(),
        &msg[..msg.len().min(8)]
    )
}

/// Compares received messages with the expected ones, rank by rank.
fn compare_messages(
    case: &str,
    rank: usize,
    got: &[Vec<u8>],
    expected: &[Vec<u8>],
) -> Result<(), Failure> {
    if got.len() != expected.len() {
        return Err(check(
            case,
            rank,
            format!("got {} messages, expected {}", got.len(), expected.len()),
        ));
    }
    match got.iter().zip(expected).position(|(g, e)| g != e) {
        None => Ok(()),
        Some(from) => Err(check(
            case,
            rank,
            format!(
                "message of rank {from}: got {}, expected {}",
                describe(&got[from]),
                describe(&expected[from])
            ),
        )),
    }
}

/// `gather_bytes` to `root` with messages of different lengths (empty ones
/// and one of 70 kB included): the root gets all in rank order, the others
/// `None`.
pub fn check_gather_bytes<C: Controller>(comm: &mut C, root: usize) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("gather_bytes root={root} size={n}");
    let salt = salt_of(&case);
    let got = comm
        .gather_bytes(&message(salt, rank, n, root), root)
        .map_err(transport(&case, rank))?;
    let local = match (got, rank == root) {
        (Some(got), true) => {
            let expected: Vec<Vec<u8>> = (0..n).map(|r| message(salt, r, n, root)).collect();
            compare_messages(&case, rank, &got, &expected)
        }
        (None, false) => Ok(()),
        (Some(_), false) => Err(check(
            &case,
            rank,
            "a non-root rank got the gathered messages".into(),
        )),
        (None, true) => Err(check(&case, rank, "the root got no messages".into())),
    };
    agree(comm, &case, local)
}

/// `broadcast_bytes` from `root`; the other ranks pass messages of other
/// lengths, which must be ignored.
pub fn check_broadcast_bytes<C: Controller>(comm: &mut C, root: usize) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("broadcast_bytes root={root} size={n}");
    let salt = salt_of(&case);
    let got = comm
        .broadcast_bytes(&message(salt, rank, n, root + 1), root)
        .map_err(transport(&case, rank))?;
    let expected = message(salt, root, n, root + 1);
    let local = compare_messages(&case, rank, &[got], &[expected]);
    agree(comm, &case, local)
}

/// `allgather_bytes` with messages of different lengths (empty and 70 kB
/// included).
pub fn check_allgather_bytes<C: Controller>(comm: &mut C) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("allgather_bytes size={n}");
    let salt = salt_of(&case);
    let got = comm
        .allgather_bytes(&message(salt, rank, n, 0))
        .map_err(transport(&case, rank))?;
    let expected: Vec<Vec<u8>> = (0..n).map(|r| message(salt, r, n, 0)).collect();
    let local = compare_messages(&case, rank, &got, &expected);
    agree(comm, &case, local)
}

/// `rounds` control barriers (that they return is all a backend-neutral
/// test can see).
pub fn check_control_barrier<C: Controller>(comm: &mut C, rounds: usize) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("control_barrier rounds={rounds} size={n}");
    for _ in 0..rounds {
        comm.control_barrier().map_err(transport(&case, rank))?;
    }
    agree(comm, &case, Ok(()))
}

/// `bitwise_allreduce` of `len` pseudo-random words with `op`.
pub fn check_bitwise_allreduce<C: Controller>(
    comm: &mut C,
    len: usize,
    op: BitOp,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("bitwise_allreduce len={len} op={op:?} size={n}");
    let salt = salt_of(&case);
    // Mostly-set words for AND, mostly-clear for OR, so results are neither
    // all zeros nor all ones.
    let word = |r: usize, i: usize| {
        let (a, b) = (mix(salt, r, i as u64), mix(salt ^ 1, r, i as u64));
        match op {
            BitOp::And => a | b,
            BitOp::Or => a & b,
        }
    };
    let mut words: Vec<u64> = (0..len).map(|i| word(rank, i)).collect();
    comm.bitwise_allreduce(&mut words, op)
        .map_err(transport(&case, rank))?;
    let reduce = |acc: u64, w: u64| if op == BitOp::And { acc & w } else { acc | w };
    let init = if op == BitOp::And { u64::MAX } else { 0 };
    let expected: Vec<u64> = (0..len)
        .map(|i| (0..n).map(|r| word(r, i)).fold(init, reduce))
        .collect();
    let local = match words.iter().zip(&expected).position(|(g, e)| g != e) {
        None => Ok(()),
        Some(i) => Err(Failure::Mismatch {
            case: case.clone(),
            rank,
            index: i,
            expected: format!("{:#018x}", expected[i]),
            got: format!("{:#018x}", words[i]),
        }),
    };
    agree(comm, &case, local)
}

/// Every control-plane case: gather and broadcast from every root,
/// allgather, barriers, bitwise AND / OR over 0, 1, 3 and 257 words.
/// Returns the number of cases run.
pub fn check_controller<C: Controller>(comm: &mut C) -> Result<usize, Failure> {
    let n = comm.size();
    let mut cases = 0;
    for root in 0..n {
        check_gather_bytes(comm, root)?;
        check_broadcast_bytes(comm, root)?;
        cases += 2;
    }
    check_allgather_bytes(comm)?;
    check_control_barrier(comm, 3)?;
    cases += 2;
    for len in [0, 1, 3, 257] {
        for op in [BitOp::And, BitOp::Or] {
            check_bitwise_allreduce(comm, len, op)?;
            cases += 1;
        }
    }
    Ok(cases)
}
