"""A small model trained data-parallel with kolo.torch.DistributedOptimizer
(horovod.torch's API). Start it with any launcher:

    kolo-run -n 4 python train_torch.py          # or python -m kolo.run -n 4 ...
    torchrun --nproc-per-node 4 train_torch.py

Each rank trains on its own shard of a synthetic regression task; the
gradients are averaged by kolo (fused, overlapping backward), so the loss
falls and every rank ends with bitwise identical weights (checked at the
end). Prints "rank R of N: ok, loss A -> B".
"""

import argparse

import torch

import kolo.torch as hvd


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    hvd.init()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)

    # Every rank starts from different weights: broadcast_parameters makes
    # them rank 0's.
    torch.manual_seed(1234 + hvd.rank())
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # The task: y = sum of sin(x); each rank draws its own batches.
    generator = torch.Generator().manual_seed(99 + hvd.rank())
    losses = []
    for _ in range(args.steps):
        x = torch.randn(64, 16, generator=generator).to(device)
        y = torch.sin(x).sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())

    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if not last < 0.5 * first:
        raise SystemExit(f"rank {hvd.rank()}: the loss did not fall: {first:.4f} -> {last:.4f}")
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    every = hvd.allgather(weights.unsqueeze(0), name="weights")
    if not all(torch.equal(every[0], row) for row in every):
        raise SystemExit(f"rank {hvd.rank()}: the ranks' weights differ")
    print(f"rank {hvd.rank()} of {hvd.size()}: ok, loss {first:.4f} -> {last:.4f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
