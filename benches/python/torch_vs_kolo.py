"""kolo's Python package against PyTorch's torch.distributed on NCCL, in one
process per GPU, the same run, interleaved rounds, medians:

- an 8-byte CUDA allreduce, call to completion (`kolo.allreduce` returns
  once the result is in the tensor; `dist.all_reduce` + a synchronize);
- a 256 MiB CUDA allreduce (time and busbw);
- a training step of an MLP with `kolo.torch.DistributedOptimizer` against
  DDP on NCCL.

    kolo-run -n <gpus> python benches/python/torch_vs_kolo.py   # or torchrun

Prints one line per row (JSON) and a table on rank 0.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import kolo.torch as hvd


def timed(fn, reps):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def model(device):
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(2048, 16)).to(device)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=float, default=1.0, help="scales each case's calls per round")
    parser.add_argument("--cases", default="allreduce_8B_us,allreduce_256MiB_ms,train_step_ms")
    args = parser.parse_args()

    hvd.init()
    rank, size, local = hvd.rank(), hvd.size(), hvd.local_rank()
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    # PyTorch's NCCL group on the same processes: torch's store on a port
    # of kolo's choosing.
    port = int(os.environ.get("KOLO_BENCH_TORCH_PORT", "29611"))
    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), port, size, rank == 0)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=size, device_id=device)

    small = torch.ones(2, device=device)
    big = torch.ones(64 << 20, device=device)  # 256 MiB of f32
    net_kolo, net_ddp = model(device), model(device)
    ddp = torch.nn.parallel.DistributedDataParallel(net_ddp, device_ids=[device])
    opt_kolo = hvd.DistributedOptimizer(
        torch.optim.SGD(net_kolo.parameters(), lr=1e-3), named_parameters=net_kolo.named_parameters(), op=hvd.Sum
    )
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(256, 2048, device=device)

    def step(net, opt):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()

    cases = {
        "allreduce_8B_us": (
            lambda: hvd.allreduce_(small, op=hvd.Sum, name="small"),
            lambda: (dist.all_reduce(small), torch.cuda.synchronize()),
            200, 1e6,
        ),
        "allreduce_256MiB_ms": (
            lambda: hvd.allreduce_(big, op=hvd.Sum, name="big"),
            lambda: dist.all_reduce(big),
            5, 1e3,
        ),
        "train_step_ms": (lambda: step(net_kolo, opt_kolo), lambda: step(ddp, opt_ddp), 20, 1e3),
    }
    for name, (k, t, reps, scale) in cases.items():
        if name not in args.cases.split(","):
            continue
        reps = max(1, int(reps * args.reps))
        k(), t()  # warm up: negotiation cache, NCCL channels, cuBLAS
        ks, ts = [], []
        for _ in range(args.rounds):
            ks.append(timed(k, reps) * scale)
            ts.append(timed(t, reps) * scale)
        row = {
            "case": name, "ranks": size, "kolo": statistics.median(ks), "torch": statistics.median(ts),
            "kolo_all": [round(v, 3) for v in ks], "torch_all": [round(v, 3) for v in ts],
        }
        row["kolo_over_torch"] = row["kolo"] / row["torch"]
        if name.startswith("allreduce_256MiB"):
            factor = 2 * (size - 1) / size if size > 1 else 1.0
            for who in ("kolo", "torch"):
                row[f"{who}_busbw_GBps"] = (256 << 20) / (row[who] / 1e3) * factor / 1e9
        if rank == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
