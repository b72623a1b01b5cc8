//! A fused buffer's copies: `pack_into` and `unpack_from`, over views made
//! with every operation of [`Memory`] (whole buffers, `split_at`,
//! `split_at_mut`, `freeze`, `reborrow`).

use crate::buffers::{download, upload, zeroed};
use crate::failure::{agree, check, transport, Failure};
use crate::reference::{check_inputs, Inputs};
use crate::values::{inputs, salt_of, Values};
use kolo_transport::{Collectives, Controller, Element, Host, Memory};

/// Packs tensors of `lens` elements (one buffer each) into a fused buffer
/// and unpacks it into the pieces of one buffer cut with
/// `Memory::split_at_mut`; checks the fused buffer, a read-only view of
/// its tail (`Memory::split_at`), the unpacked buffer and its last piece
/// read through `Memory::freeze`. Rank-local copies; the ranks agree on
/// the outcome.
pub fn check_pack_unpack<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    lens: &[usize],
) -> Result<(), Failure> {
    check_pack_unpack_on::<Host, T, C>(comm, lens)
}

/// [`check_pack_unpack`] on memory `M`.
pub fn check_pack_unpack_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    lens: &[usize],
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let total: usize = lens.iter().sum();
    let layout = if lens.len() <= 8 {
        format!("{lens:?}")
    } else {
        format!("{} tensors", lens.len())
    };
    let case = format!(
        "pack_unpack dtype={} lens={layout} total={total} size={n}",
        T::DTYPE
    );
    let salt = salt_of(&case);
    let from = |start: usize| Inputs {
        values: Values::General,
        salt,
        rank,
        start: start as u64,
    };
    let mut tensors = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let host = inputs::<T>(len, Values::General, salt, rank, start as u64);
        tensors.push(upload::<M, T, C>(comm, &case, rank, &host)?);
        start += len;
    }
    let mut fused = zeroed::<M, T, C>(comm, &case, rank, total)?;
    {
        let srcs: Vec<M::Ref<'_, T>> = tensors.iter().map(M::view).collect();
        comm.pack_into(&srcs, M::view_mut(&mut fused))
            .map_err(transport(&case, rank))?;
    }
    let packed = download::<M, T, C>(comm, &case, rank, &fused)?;
    let mut local = check_inputs(&case, rank, 0, &packed, from(0));

    let head = lens.first().copied().unwrap_or(0);
    let (_, tail) = M::split_at(M::view(&fused), head);
    let tail = comm.read_buffer(tail).map_err(transport(&case, rank))?;
    local = local.and_then(|()| {
        if tail.len() == total - head {
            check_inputs(&case, rank, head, &tail, from(head))
        } else {
            let message = format!(
                "a view of the last {} elements read {}",
                total - head,
                tail.len()
            );
            Err(check(&case, rank, message))
        }
    });

    let mut out = zeroed::<M, T, C>(comm, &case, rank, total)?;
    let last = {
        let mut pieces = Vec::with_capacity(lens.len());
        let mut rest = M::view_mut(&mut out);
        for &len in lens {
            let (piece, tail) = M::split_at_mut(rest, len);
            pieces.push(piece);
            rest = tail;
        }
        let mut reborrowed: Vec<M::Mut<'_, T>> = pieces.iter_mut().map(M::reborrow).collect();
        comm.unpack_from(M::view(&fused), &mut reborrowed)
            .map_err(transport(&case, rank))?;
        drop(reborrowed);
        match pieces.last() {
            Some(piece) => {
                comm.synchronize().map_err(transport(&case, rank))?;
                let got = comm
                    .read_buffer(M::freeze(piece))
                    .map_err(transport(&case, rank))?;
                Some(got)
            }
            None => None,
        }
    };
    let unpacked = download::<M, T, C>(comm, &case, rank, &out)?;
    local = local.and_then(|()| check_inputs(&case, rank, 0, &unpacked, from(0)));
    if let (Some(got), Some(&len)) = (last, lens.last()) {
        let at = total - len;
        local = local.and_then(|()| {
            if got.len() == len {
                check_inputs(&case, rank, at, &got, from(at))
            } else {
                let message = format!("the last piece of {len} elements read {}", got.len());
                Err(check(&case, rank, message))
            }
        });
    }
    agree(comm, &case, local)
}
