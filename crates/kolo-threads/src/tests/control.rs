use super::on_ranks;
use kolo_transport::{BitOp, Controller, Topology};

#[test]
fn byte_gather_broadcast_and_allgather() {
    let results = on_ranks(3, |comm| {
        let me = comm.rank();
        let msg = vec![me as u8; me + 1];
        let gathered = comm.gather_bytes(&msg, 1)?;
        let broadcast = comm.broadcast_bytes(if me == 2 { b"from two" } else { b"ignored" }, 2)?;
        let all = comm.allgather_bytes(&msg)?;
        comm.control_barrier()?;
        Ok((gathered, broadcast, all))
    });
    let expected: Vec<Vec<u8>> = (0..3).map(|r| vec![r as u8; r + 1]).collect();
    for (me, (gathered, broadcast, all)) in results.into_iter().enumerate() {
        assert_eq!(gathered, (me == 1).then(|| expected.clone()));
        assert_eq!(broadcast, b"from two");
        assert_eq!(all, expected);
    }
}

#[test]
fn bitwise_and_or_across_ranks() {
    let results = on_ranks(4, |comm| {
        let bit = 1u64 << comm.rank();
        let mut and = [u64::MAX ^ bit, 0b1111];
        comm.bitwise_allreduce(&mut and, BitOp::And)?;
        let mut or = [bit, 0];
        comm.bitwise_allreduce(&mut or, BitOp::Or)?;
        Ok((and, or))
    });
    for (and, or) in results {
        assert_eq!(and, [u64::MAX ^ 0b1111, 0b1111]);
        assert_eq!(or, [0b1111, 0]);
    }
}
