"""kolo.torch (horovod.torch's API) and the "kolo" torch.distributed backend
on every rank of a job, on CPU tensors and, where a GPU is, CUDA tensors.
Prints "rank R of N: ok"."""

import sys

import torch
import torch.distributed as dist

import kolo.torch as hvd


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {hvd.rank()}: {what}")


def horovod_api(device):
    r, n = hvd.rank(), hvd.size()
    tag = device.type
    t = torch.full((3, 2), float(r + 1), device=device)
    out = hvd.allreduce(t, name=f"{tag}.avg")
    check(out is not t and torch.all(t == r + 1), "allreduce is out of place")
    check(torch.allclose(out, torch.full_like(t, (n + 1) / 2)), f"average: {out}")
    hvd.allreduce_(t, op=hvd.Sum, name=f"{tag}.sum")
    check(torch.all(t == n * (n + 1) / 2), f"allreduce_ sum: {t}")
    for dtype in (torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.float64):
        x = torch.ones(5, dtype=dtype, device=device)
        hvd.allreduce_(x, op=hvd.Sum, name=f"{tag}.{dtype}")
        check(torch.all(x == n), f"{dtype}: {x}")
    hs = [hvd.allreduce_async_(torch.full((100,), float(i), device=device), op=hvd.Sum, name=f"{tag}.a{i}")
          for i in range(10)]
    for i, h in enumerate(hs):
        check(torch.all(hvd.synchronize(h) == i * n), f"async {i}")
    group = [torch.full((4,), float(r), device=device), torch.ones(2, device=device)]
    hvd.grouped_allreduce_(group, op=hvd.Sum, name=f"{tag}.group")
    check(torch.all(group[0] == n * (n - 1) / 2) and torch.all(group[1] == n), f"group: {group}")
    b = torch.full((2,), float(r), device=device)
    check(torch.all(hvd.broadcast(b, root_rank=n - 1, name=f"{tag}.b") == n - 1), "broadcast")
    g = hvd.allgather(torch.full((r + 1, 3), r, device=device), name=f"{tag}.g")
    check(g.shape == (n * (n + 1) // 2, 3) and g.device == device, f"allgather: {g.shape} {g.device}")
    rs = hvd.reduce_scatter(torch.arange(2 * n, dtype=torch.float32, device=device), op=hvd.Sum, name=f"{tag}.rs")
    check(rs.tolist() == [2 * r * n, (2 * r + 1) * n], f"reduce_scatter: {rs}")
    got, splits = hvd.alltoall(torch.tensor([10 * r + p for p in range(n)], device=device), name=f"{tag}.a2a")
    check(got.tolist() == [10 * p + r for p in range(n)] and splits == [1] * n, f"alltoall: {got}")
    obj = hvd.broadcast_object({"epoch": r, "name": "x" * (r + 1)}, root_rank=0)
    check(obj == {"epoch": 0, "name": "x"}, f"broadcast_object: {obj}")
    # Errors: a mismatch on every rank, the next call works; bad input.
    try:
        hvd.allreduce_(torch.zeros(2 + r, device=device), name=f"{tag}.mismatch")
        check(n == 1, "mismatch must raise")
    except hvd.MismatchError as e:
        check(f"{tag}.mismatch" in str(e), f"{e}")
    try:
        hvd.allreduce_(torch.zeros(4, 4, device=device)[:, 0], name=f"{tag}.strided")
        check(False, "non-contiguous must raise")
    except hvd.InvalidArgumentError as e:
        check("not contiguous" in str(e), f"{e}")
    try:
        hvd.allreduce_(torch.zeros(2, dtype=torch.complex64, device=device), name=f"{tag}.complex")
        check(False, "complex must raise")
    except (hvd.InvalidArgumentError, RuntimeError) as e:
        check("complex" in str(e) or "data type" in str(e), f"{e}")
    ok = torch.ones(1, device=device)
    hvd.allreduce_(ok, op=hvd.Sum, name=f"{tag}.after")
    check(ok.item() == n, "the call after an error works")


def optimizer_state(device):
    """broadcast_parameters and broadcast_optimizer_state make every rank
    rank 0's; backward_passes_per_step accumulates locally."""
    r = hvd.rank()
    torch.manual_seed(r)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    model(torch.randn(2, 4, device=device)).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check(opt.param_groups[0]["lr"] == 0.01, f"lr: {opt.param_groups[0]['lr']}")
    state = torch.cat([s["exp_avg"].reshape(-1) for s in opt.state.values()]).cpu()
    every = hvd.allgather(state.unsqueeze(0), name=f"{device.type}.opt_state")
    check(all(torch.equal(every[0], row) for row in every), "optimizer state identical")

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2,
                                   op=hvd.Sum)
    opt.zero_grad()
    for _ in range(2):
        model(torch.ones(1, 4, device=device) * (r + 1)).sum().backward()
    opt.synchronize()
    # The bias gradient: 1 per pass, 2 passes averaged, summed over ranks.
    n = hvd.size()
    bias = model.bias.grad
    check(torch.allclose(bias, torch.full_like(bias, float(n))), f"bias grad {bias}, expected {n}")

    if device.type == "cpu":
        # Gradients that travel as fp16 (Horovod's Compression.fp16);
        # kolo reduces device tensors uncompressed.
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=hvd.Compression.fp16)
        opt.zero_grad()
        model(torch.ones(1, 4, device=device) * (r + 1) / 3).sum().backward()
        opt.synchronize()
        weight = model.weight.grad
        exact = sum((q + 1) / 3 for q in range(n)) / n
        check(torch.allclose(weight, torch.full_like(weight, exact), rtol=(n + 2) * 2.0**-11),
              f"fp16 weight grad {weight}, expected {exact}")


def backend(device):
    r, n = dist.get_rank(), dist.get_world_size()
    check((r, n) == (hvd.rank(), hvd.size()), "the backend's rank and size are kolo's")
    x = torch.full((5,), float(r + 1), device=device)
    dist.all_reduce(x)
    check(torch.all(x == n * (n + 1) / 2), f"all_reduce: {x}")
    x = torch.full((5,), float(r + 1), device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    check(torch.all(x == n), f"all_reduce max: {x}")
    work = dist.all_reduce(torch.ones(3, device=device), async_op=True)
    work.wait()
    y = torch.full((3,), float(r), device=device)
    dist.broadcast(y, src=n - 1)
    check(torch.all(y == n - 1), f"broadcast: {y}")
    outs = [torch.empty(2, device=device) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(r), device=device))
    check([o[0].item() for o in outs] == list(range(n)), f"all_gather: {outs}")
    big = torch.empty(2 * n, device=device)
    dist.all_gather_into_tensor(big, torch.full((2,), float(r), device=device))
    check(big.tolist() == [float(q) for q in range(n) for _ in range(2)], f"all_gather_into_tensor: {big}")
    share = torch.empty(2, device=device)
    dist.reduce_scatter_tensor(share, torch.arange(2 * n, dtype=torch.float32, device=device))
    check(share.tolist() == [2 * r * n, (2 * r + 1) * n], f"reduce_scatter_tensor: {share}")
    got = torch.empty(n, device=device)
    dist.all_to_all_single(got, torch.tensor([10.0 * r + p for p in range(n)], device=device))
    check(got.tolist() == [10.0 * p + r for p in range(n)], f"all_to_all_single: {got}")
    dist.barrier()


def main():
    dist.init_process_group("kolo")
    devices = [torch.device("cpu")]
    if "--cuda" in sys.argv:
        check(torch.cuda.is_available(), "--cuda without a GPU")
        gpu = torch.device("cuda", hvd.local_rank())
        torch.cuda.set_device(gpu)
        devices.append(gpu)
    for device in devices:
        horovod_api(device)
        optimizer_state(device)
        backend(device)
    print(f"rank {hvd.rank()} of {hvd.size()}: ok")
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
