"""PyTorch torch.distributed (NCCL) baseline for kolo-bench's GPU tables.

Run with: torchrun --nproc_per_node=N benches/torch-baseline/collectives.py [--max-bytes 1G]
Prints an nccl-tests-style table (busbw with nccl-tests' factors), the
small-message latency, and the time of 1,000 separate 16 KiB allreduces,
so kolo's numbers can be compared from the same device call.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    # The slowest rank's time per iteration, as nccl-tests reports.
    t = torch.tensor(times, device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t.tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", default="1M")
    ap.add_argument("--max-bytes", default="1G")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    factors = {
        "allreduce": 2 * (n - 1) / n,
        "allgather": (n - 1) / n,
        "reducescatter": (n - 1) / n,
        "broadcast": 1.0,
        "alltoall": (n - 1) / n,
    }
    if rank == 0:
        print(f"# torch {torch.__version__} nccl {torch.cuda.nccl.version()} ranks {n}")
        print(f"{'op':>14} {'size':>12} {'time_us':>10} {'algbw':>8} {'busbw':>8}")
    size = parse_size(args.min_bytes)
    while size <= parse_size(args.max_bytes):
        count = size // 4
        for op in factors:
            if op == "allreduce":
                buf = torch.ones(count, device="cuda")
                fn = lambda: dist.all_reduce(buf)
            elif op == "allgather":
                out = torch.empty(count, device="cuda")
                inp = torch.ones(count // n, device="cuda")
                fn = lambda: dist.all_gather_into_tensor(out, inp)
            elif op == "reducescatter":
                inp = torch.ones(count, device="cuda")
                out = torch.empty(count // n, device="cuda")
                fn = lambda: dist.reduce_scatter_tensor(out, inp)
            elif op == "broadcast":
                buf = torch.ones(count, device="cuda")
                fn = lambda: dist.broadcast(buf, 0)
            else:
                inp = torch.ones(count, device="cuda")
                out = torch.empty(count, device="cuda")
                fn = lambda: dist.all_to_all_single(out, inp)
            t = timed(fn, args.iters, args.warmup)
            algbw = size / t / 1e9
            if rank == 0:
                print(f"{op:>14} {size:>12} {t * 1e6:>10.1f} {algbw:>8.2f} {algbw * factors[op]:>8.2f}")
        size *= 4
    small = torch.ones(2, device="cuda")
    t = timed(lambda: dist.all_reduce(small), 200, 20)
    grads = [torch.ones(4096, device="cuda") for _ in range(1000)]
    def step():
        for g in grads:
            dist.all_reduce(g)
    t_step = timed(step, 10, 2)
    one = torch.ones(1000 * 4096, device="cuda")
    t_one = timed(lambda: dist.all_reduce(one), 20, 5)
    if rank == 0:
        print(f"small: 8 B allreduce median {t * 1e6:.1f} us")
        print(f"step: 1000 x 16 KiB separate allreduces {t_step * 1e3:.2f} ms; one 16 MiB allreduce {t_one * 1e3:.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
