//! The control plane on shared memory: byte gathers and broadcasts read the
//! peers' messages in place; barriers and the bitwise allreduce are rounds
//! like every collective, so a rank that calls something else meanwhile
//! gets an error instead of a hang.

use crate::call::{Call, Kind, Op};
use crate::comm::ThreadComm;
use crate::shared::{internal, Buf, Publication, Round};
use crate::world::World;
use kolo_transport::{BitOp, Controller, Result};

/// A barrier round of `kind` (data plane or control plane).
pub(crate) fn barrier(world: &World, rank: usize, kind: Kind) -> Result<()> {
    Round::open(world, rank, Publication::new(Call::plain(kind)))?.close()
}

/// Every rank's message (in rank order), read while the round is open.
fn read_all(round: &Round<'_, '_>, size: usize) -> Result<Vec<Vec<u8>>> {
    (0..size)
        .map(|peer| round.view::<u8>(peer, Buf::Send).map(<[u8]>::to_vec))
        .collect()
}

fn gather(world: &World, rank: usize, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
    let call = Call::plain(Kind::GatherBytes).rooted(root);
    let round = Round::open(
        world,
        rank,
        Publication::new(call).read_only(Buf::Send, msg),
    )?;
    let gathered = if rank == root {
        Some(read_all(&round, world.size)?)
    } else {
        None
    };
    round.close()?;
    Ok(gathered)
}

fn broadcast(world: &World, rank: usize, msg: &[u8], root: usize) -> Result<Vec<u8>> {
    let call = Call::plain(Kind::BroadcastBytes).rooted(root);
    let round = Round::open(
        world,
        rank,
        Publication::new(call).read_only(Buf::Send, msg),
    )?;
    let copy = round.view::<u8>(root, Buf::Send)?.to_vec();
    round.close()?;
    Ok(copy)
}

fn allgather(world: &World, rank: usize, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
    let round = Round::open(
        world,
        rank,
        Publication::new(Call::plain(Kind::AllgatherBytes)).read_only(Buf::Send, msg),
    )?;
    let all = read_all(&round, world.size)?;
    round.close()?;
    Ok(all)
}

fn bitwise(world: &World, rank: usize, words: &mut [u64], op: BitOp) -> Result<()> {
    let call = Call {
        op: Op::Bit(op),
        ..Call::plain(Kind::BitwiseAllreduce)
    };
    let mut out = words.to_vec();
    {
        let round = Round::open(
            world,
            rank,
            Publication::new(call).read_only(Buf::Send, &*words),
        )?;
        for peer in (0..world.size).filter(|&peer| peer != rank) {
            let theirs = round.view::<u64>(peer, Buf::Send)?;
            if theirs.len() != out.len() {
                return Err(internal(format!("rank {peer} has {} words", theirs.len())));
            }
            match op {
                BitOp::And => out.iter_mut().zip(theirs).for_each(|(o, t)| *o &= t),
                BitOp::Or => out.iter_mut().zip(theirs).for_each(|(o, t)| *o |= t),
            }
        }
        round.close()?;
    }
    words.copy_from_slice(&out);
    Ok(())
}

impl Controller for ThreadComm {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        self.observe(gather(&self.world, self.rank, msg, root))
    }

    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        self.observe(broadcast(&self.world, self.rank, msg, root))
    }

    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.observe(allgather(&self.world, self.rank, msg))
    }

    fn control_barrier(&mut self) -> Result<()> {
        self.observe(barrier(&self.world, self.rank, Kind::ControlBarrier))
    }

    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        self.observe(bitwise(&self.world, self.rank, words, op))
    }
}
