//! `MpiComm::split` under `mpirun` (part of the `mpirun` test binary):
//! pairs of neighbouring ranks, a lone last rank that joins none, keys that
//! reverse the order, collectives on every pair at the same time as on
//! the world, and a color MPI cannot take.

use kolo_mpi::MpiComm;
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Controller, Scale, Topology};

/// The checks of the module doc, on every rank of `world`.
pub fn splits_into_pairs(world: &mut MpiComm) -> Result<(), String> {
    let (rank, size) = (world.rank(), world.size());
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("rank {rank}, {what}: {e}");
    // Pairs (0, 1), (2, 3), ...; with an odd size the last rank is alone
    // and passes no color. Keys reverse the order within a pair.
    let paired = rank + 1 < size || rank % 2 == 1;
    let color = paired.then_some((rank / 2) as u32);
    let pair = world
        .split(color, -(rank as i32))
        .map_err(|e| fail("split", &e))?;
    let mut pair = match (pair, paired) {
        (Some(pair), true) => pair,
        (None, false) => return world.barrier().map_err(|e| fail("barrier", &e)),
        (pair, _) => {
            return Err(format!(
                "rank {rank} of {size}: split gave {} communicator, expected {}",
                if pair.is_some() { "a" } else { "no" },
                if paired { "one" } else { "none" }
            ))
        }
    };
    let expected_rank = 1 - rank % 2; // reversed by the keys
    if (pair.rank(), pair.size()) != (expected_rank, 2) || pair.local_size() != 2 {
        return Err(format!(
            "rank {rank}: pair rank {} of {} (local {} of {}), expected rank {expected_rank} of 2 \
             on one host",
            pair.rank(),
            pair.size(),
            pair.local_rank(),
            pair.local_size()
        ));
    }
    // Data plane: the sum of the pair's world ranks; control plane: each
    // end's world rank, in pair order.
    let mut sum = [rank as i64];
    pair.allreduce(&mut sum, ReduceOp::Sum, Scale::NONE)
        .map_err(|e| fail("allreduce on the pair", &e))?;
    let first = (rank / 2 * 2) as i64;
    if sum != [2 * first + 1] {
        return Err(format!(
            "rank {rank}: the pair's sum is {sum:?}, expected {}",
            2 * first + 1
        ));
    }
    let ranks = pair
        .allgather_bytes(&[rank as u8])
        .map_err(|e| fail("allgather on the pair", &e))?;
    let want = [vec![first as u8 + 1], vec![first as u8]];
    if ranks != want {
        return Err(format!(
            "rank {rank}: the pair gathered {ranks:?}, expected {want:?}"
        ));
    }
    world.barrier().map_err(|e| fail("barrier", &e))
}

/// Rank 0 passes a color above `i32::MAX`: it gets an error naming the
/// color, the other ranks (one color) a communicator of the rest.
pub fn bad_color_is_an_error(world: &mut MpiComm) -> Result<(), String> {
    let (rank, size) = (world.rank(), world.size());
    let color = if rank == 0 { u32::MAX } else { 7 };
    match (world.split(Some(color), 0), rank) {
        (Err(e), 0) => {
            let text = e.to_string();
            if !text.contains(&u32::MAX.to_string()) {
                return Err(format!("the error does not name the color: {text}"));
            }
        }
        (Ok(Some(rest)), r) if r > 0 => {
            if (rest.rank(), rest.size()) != (r - 1, size - 1) {
                return Err(format!(
                    "rank {r}: rank {} of {} after rank 0 left, expected {} of {}",
                    rest.rank(),
                    rest.size(),
                    r - 1,
                    size - 1
                ));
            }
        }
        (other, r) => {
            return Err(format!(
                "rank {r}, color {color}: split gave {:?}",
                other.map(|c| c.map(|_| "a communicator"))
            ))
        }
    }
    world
        .barrier()
        .map_err(|e| format!("rank {rank}: barrier: {e}"))
}
