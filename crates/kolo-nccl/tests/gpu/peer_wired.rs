//! The peer allreduce as the communicator runs it: `NcclComm::all_reduce`
//! of f32 / f16 / bf16, sum and average, from 1 element to past the
//! registered capacity (odd sizes, unaligned views), checked bit for bit
//! against the host's reduction in rank order where the crossover picks a
//! kernel, and against a second communicator with the kernels off (NCCL)
//! within the dtype's bound everywhere. A world of one rank must register
//! nothing. Two GPUs or more are needed for the kernels to run.

use super::{compare, err, tolerance, Report};
use cudarc::driver::CudaSlice;
use kolo_nccl::crossover::{PeerAllreduce, Thresholds};
use kolo_nccl::{DeviceElement, NcclComm, NcclOptions};
use kolo_protocol::ReduceOp;
use kolo_transport::{Controller, Element, Scale, Topology};

/// Rank `rank`'s element `i` of call `call`, the same on every rank: a
/// half-integer small enough that every sum is exact in every dtype, so
/// NCCL's order of summation gives the same bits (the rounding itself is
/// checked by the simulated ranks, `peer_allreduce.rs`).
fn input<T: Element>(rank: usize, i: usize, call: usize) -> T {
    let v = ((rank * 131 + i * 7 + call * 17) % 41) as f64 - 20.0;
    T::from_f64(v / 2.0)
}

/// `n` elements at offset `skew` of a fresh buffer, reduced by `comm`.
fn reduce<T: DeviceElement>(
    comm: &mut NcclComm,
    op: ReduceOp,
    n: usize,
    skew: usize,
    call: usize,
) -> Result<Vec<T>, String> {
    let stream = comm.stream().clone();
    let host: Vec<T> = (0..n + skew)
        .map(|i| input(comm.rank(), i.saturating_sub(skew), call))
        .collect();
    let mut buf: CudaSlice<T> = stream
        .clone_htod(&host)
        .map_err(|e| format!("htod: {e:?}"))?;
    let mut view = buf.slice_mut(skew..skew + n);
    comm.all_reduce(&mut view, op, Scale::NONE)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    stream
        .clone_dtoh(&buf.slice(skew..skew + n))
        .map_err(|e| format!("dtoh: {e:?}"))
}

fn sweep<T: DeviceElement>(comm: &mut NcclComm, nccl: &mut NcclComm) -> Result<usize, String> {
    let world = comm.size();
    let cap = Thresholds::DEFAULT.max_bytes() / std::mem::size_of::<T>();
    let mut kernels = 0;
    let sizes = [
        1,
        3,
        7,
        1023,
        4097,
        65_537,
        262_143,
        cap / 2 + 1,
        cap,
        cap + 1,
    ];
    for op in [ReduceOp::Sum, ReduceOp::Average] {
        for (call, &n) in sizes.iter().enumerate() {
            let skew = call % 2;
            let path = comm.peer_allreduce_path(T::DTYPE, n, op, Scale::NONE);
            let got = reduce::<T>(comm, op, n, skew, call)?;
            let want_nccl = reduce::<T>(nccl, op, n, skew, call)?;
            let what = format!("{} {} n={n} ({path:?})", T::DTYPE, op.name());
            compare(&got, &want_nccl, tolerance::<T>())
                .map_err(|e| format!("{what} vs NCCL: {e}"))?;
            if path != PeerAllreduce::Nccl {
                kernels += 1;
                let inputs: Vec<Vec<T>> = (0..world)
                    .map(|r| (0..n).map(|i| input(r, i, call)).collect())
                    .collect();
                let srcs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
                let mut want = inputs[0].clone();
                T::reduce_many(&mut want, &srcs, ReduceOp::Sum);
                T::scale(&mut want, Scale::NONE.postscale_for(op, world));
                if kolo_transport::byte_view::as_bytes(&got)
                    != kolo_transport::byte_view::as_bytes(&want)
                {
                    return Err(format!("{what}: not bitwise the host's rank-order sum"));
                }
            }
        }
    }
    Ok(kernels)
}

/// The checks on `comm` (collective over `ctrl`, which builds a second
/// communicator with the kernels off).
pub fn run<C: Controller + ?Sized>(comm: &mut NcclComm, ctrl: &mut C, report: &mut Report) {
    if comm.size() == 1 {
        report.check(
            "peer allreduce: nothing registered in a world of one rank",
            if comm.peer_allreduce_active() {
                Err("registered".into())
            } else {
                Ok(())
            },
        );
        return;
    }
    println!(
        "rank {}: peer allreduce kernels {}",
        comm.rank(),
        if comm.peer_allreduce_active() {
            "active"
        } else {
            "off (peers unreachable or opted out)"
        }
    );
    let options = NcclOptions {
        device: Some(comm.device().ordinal()),
        peer_allreduce: false,
        ..comm.options().clone()
    };
    let mut nccl = match NcclComm::init(ctrl, options) {
        Ok(nccl) => nccl,
        Err(e) => {
            return report.check("peer allreduce: NCCL-only communicator", Err(e.to_string()))
        }
    };
    report.check(
        "peer allreduce: off when the options say so",
        if nccl.peer_allreduce_active() {
            Err("registered".into())
        } else {
            Ok(())
        },
    );
    let outcome = sweep::<f32>(comm, &mut nccl)
        .and_then(|a| Ok(a + sweep::<half::f16>(comm, &mut nccl)?))
        .and_then(|a| Ok(a + sweep::<half::bf16>(comm, &mut nccl)?));
    report.check(
        "peer allreduce through NcclComm::all_reduce vs host and NCCL",
        outcome.map(|k| println!("rank {}: {k} allreduces ran a peer kernel", comm.rank())),
    );
    drop(nccl);
}
