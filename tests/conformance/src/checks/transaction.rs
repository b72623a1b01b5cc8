//! A transaction: reduce-scatter, all-gather, send and receive issued as
//! one group.

use crate::buffers::{download, refused, upload, zeroed, Expect};
use crate::failure::{agree, transport, Failure};
use crate::reference::{check_inputs, Inputs, Reduction};
use crate::values::{inputs, salt_of, Values};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Controller, Element, Host, Memory, Scale, Transaction};

/// One transaction holding an even reduce-scatter (`count` elements per
/// rank, average with postscale 2), an even all-gather (`count` per rank),
/// and (for more than one rank) a send to the right neighbour and a receive
/// from the left one. Every part is checked.
pub fn check_transaction<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    count: usize,
) -> Result<(), Failure> {
    check_transaction_on::<Host, T, C>(comm, count)
}

/// [`check_transaction`] on memory `M`.
pub fn check_transaction_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    count: usize,
) -> Result<(), Failure> {
    transaction_case::<M, T, C>(comm, count, Expect::Result)
}

/// The transaction case; with [`Expect::Unsupported`] the reduce-scatter
/// in it must make the backend refuse the whole transaction.
pub(crate) fn transaction_case<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    count: usize,
    expect: Expect,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!(
        "transaction dtype={} count={count} (reduce_scatter average + all_gather + send/recv) size={n}",
        T::DTYPE
    );
    let salt = salt_of(&case);
    let (gather_salt, p2p_salt) = (salt ^ 1, salt ^ 2);
    let scale = Scale {
        prescale: 1.0,
        postscale: 2.0,
    };
    let reduction = Reduction {
        values: Values::General,
        salt,
        ranks: n,
        op: ReduceOp::Average,
        scale,
    };
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);

    let scatter_send = upload::<M, T, C>(
        comm,
        &case,
        rank,
        &inputs::<T>(count * n, Values::General, salt, rank, 0),
    )?;
    let mut scatter_out = zeroed::<M, T, C>(comm, &case, rank, count)?;
    let gather_send = upload::<M, T, C>(
        comm,
        &case,
        rank,
        &inputs::<T>(count, Values::General, gather_salt, rank, 0),
    )?;
    let mut gather_out = zeroed::<M, T, C>(comm, &case, rank, count * n)?;
    let p2p_send = upload::<M, T, C>(
        comm,
        &case,
        rank,
        &inputs::<T>(count, Values::General, p2p_salt, rank, 0),
    )?;
    let mut p2p_out = zeroed::<M, T, C>(comm, &case, rank, count)?;
    let outcome = {
        let mut tx = Transaction::<T, M>::default();
        tx.reduce_scatter(
            M::view(&scatter_send),
            M::view_mut(&mut scatter_out),
            ReduceOp::Average,
            scale,
        )
        .all_gather(M::view(&gather_send), M::view_mut(&mut gather_out));
        if n > 1 {
            tx.send(M::view(&p2p_send), right, 21)
                .recv(M::view_mut(&mut p2p_out), left, 21);
        }
        comm.execute(tx)
    };
    if expect == Expect::Unsupported {
        let local = refused::<T>(&case, rank, outcome);
        return agree(comm, &case, local);
    }
    outcome.map_err(transport(&case, rank))?;
    let scatter_recv = download::<M, T, C>(comm, &case, rank, &scatter_out)?;
    let gather_recv = download::<M, T, C>(comm, &case, rank, &gather_out)?;
    let p2p_recv = download::<M, T, C>(comm, &case, rank, &p2p_out)?;

    let mut local = reduction.check(&case, rank, rank * count, &scatter_recv, 0);
    for source in 0..n {
        let block = &gather_recv[source * count..(source + 1) * count];
        let sent = Inputs {
            values: Values::General,
            salt: gather_salt,
            rank: source,
            start: 0,
        };
        local = local.and_then(|()| check_inputs(&case, rank, source * count, block, sent));
    }
    if n > 1 {
        let sent = Inputs {
            values: Values::General,
            salt: p2p_salt,
            rank: left,
            start: 0,
        };
        local = local.and_then(|()| check_inputs(&case, rank, 0, &p2p_recv, sent));
    }
    agree(comm, &case, local)
}
