"""The same model trained with PyTorch's DistributedDataParallel on the
"kolo" torch.distributed backend:

    kolo-run -n 4 python train_ddp.py
    torchrun --nproc-per-node 4 train_ddp.py

Prints "rank R of N: ok, loss A -> B" once the loss fell and every rank's
weights are bitwise identical.
"""

import argparse

import torch
import torch.distributed as dist

import kolo.torch  # noqa: F401 - registers the "kolo" backend


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    dist.init_process_group("kolo")
    rank, size = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", kolo.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)

    torch.manual_seed(1234 + rank)  # DDP broadcasts rank 0's weights
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.02 * size, momentum=0.9)

    generator = torch.Generator().manual_seed(99 + rank)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(64, 16, generator=generator).to(device)
        y = torch.sin(x).sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / size)

    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if not last < 0.5 * first:
        raise SystemExit(f"rank {rank}: the loss did not fall: {first:.4f} -> {last:.4f}")
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(weights) for _ in range(size)]
    dist.all_gather(every, weights)
    if not all(torch.equal(every[0], w) for w in every):
        raise SystemExit(f"rank {rank}: the ranks' weights differ")
    dist.barrier()
    print(f"rank {rank} of {size}: ok, loss {first:.4f} -> {last:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
