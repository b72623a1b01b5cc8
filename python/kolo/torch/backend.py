"""The ``"kolo"`` torch.distributed backend: ``dist.init_process_group("kolo")``
under torchrun (or kolo-run), and DDP, FSDP's collectives and
``dist.all_reduce`` run on kolo's engine::

    import torch.distributed as dist
    import kolo.torch  # registers "kolo"

    dist.init_process_group("kolo")
    model = torch.nn.parallel.DistributedDataParallel(model)

Collectives are submitted to the engine and complete a torch Future from
kolo's callback thread, so DDP's buckets overlap backward as on NCCL or
gloo. Tensors go in without copies (DLPack), CUDA tensors in the order of
their current stream. The backend serves the world group (kolo's
engine is one per process); a subgroup is refused with an error naming it.
"""

import os
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import kolo as _k

_OPS = {
    dist.ReduceOp.SUM: _k.Sum,
    dist.ReduceOp.AVG: _k.Average,
    dist.ReduceOp.MIN: _k.Min,
    dist.ReduceOp.MAX: _k.Max,
    dist.ReduceOp.PRODUCT: _k.Product,
}


def _op_of(reduce_op):
    for torch_op, kolo_op in _OPS.items():
        if reduce_op == torch_op:
            return kolo_op
    raise ValueError(f"the kolo backend does not support reduce op {reduce_op}")


def _completed(result):
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


class ProcessGroupKolo(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives run on kolo's engine."""

    def __init__(self, rank, size):
        super().__init__(rank, size)
        self._sequence = 0
        self._lock = threading.Lock()

    def getBackendName(self):  # noqa: N802 - torch's name
        return "kolo"

    def _name(self, kind):
        # torch requires every rank to issue a group's collectives in the
        # same order, so a counter names them alike on every rank.
        with self._lock:
            self._sequence += 1
            return f"c10d.{kind}.{self._sequence}"

    def _submit(self, handle, result, finish=None):
        """A Work over `handle` (a :class:`kolo.Handle`'s native one),
        completed from kolo's callback thread: `finish(output)` runs there
        first, then the future holds `result`."""
        future = torch.futures.Future()

        def done(error, output):
            if error is not None:
                future.set_exception(error)
                return
            try:
                if finish is not None:
                    finish(output)
                future.set_result(result)
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                future.set_exception(e)

        handle.add_done_callback(done)
        return _create_work_from_future(future)

    def allreduce(self, tensors, opts=None):
        op = _op_of(opts.reduceOp) if opts is not None else _k.Sum
        name = self._name("allreduce")
        if len(tensors) == 1:
            handle = _k.allreduce_async(tensors[0], op, name)
        else:
            names = [f"{name}.{i}" for i in range(len(tensors))]
            handle = _k.grouped_allreduce_async(tensors, op, names)
        return self._submit(handle._native, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op_of(opts.reduceOp) if opts is not None else _k.Sum
        name = self._name("allreduce_coalesced")
        names = [f"{name}.{i}" for i in range(len(tensors))]
        return self._submit(_k.grouped_allreduce_async(tensors, op, names)._native, tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        name = self._name("broadcast")
        if len(tensors) != 1:
            raise ValueError(f"the kolo backend broadcasts one tensor per call, not {len(tensors)}")
        return self._submit(_k.broadcast_async(tensors[0], root, name)._native, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError("the kolo backend gathers one tensor per call")
        outputs, tensor = output_tensors[0], input_tensors[0]
        native, stream = _k._native(tensor)
        handle = _k._kolo.allgather_async(native, self._name("allgather"), stream)

        def finish(output):
            gathered = torch.from_dlpack(output)
            for chunk, out in zip(gathered.chunk(len(outputs)), outputs):
                out.copy_(chunk.view_as(out))

        return self._submit(handle, output_tensors, finish)

    def _allgather_base(self, output, tensor, opts=None):
        native, stream = _k._native(tensor)
        handle = _k._kolo.allgather_async(native, self._name("allgather_base"), stream)

        def finish(gathered):
            output.copy_(torch.from_dlpack(gathered).view_as(output))

        return self._submit(handle, output, finish)

    def _reduce_scatter_base(self, output, tensor, opts=None):
        op = _op_of(opts.reduceOp) if opts is not None else _k.Sum
        flat_out = output.view(-1)
        native_in, stream = _k._native(tensor.reshape(-1))
        native_out, _ = _k._native(flat_out)
        handle = _k._kolo.reduce_scatter_async(
            native_in, native_out, self._name("reduce_scatter"), op, 1.0, 1.0, stream
        )
        return self._submit(handle, output)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError("the kolo backend reduce-scatters one tensor per call")
        whole = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        return self._reduce_scatter_base(output_tensors[0], whole, opts)

    def alltoall_base(self, output, tensor, output_splits, input_splits, opts=None):
        native, stream = _k._native(tensor)
        splits = [int(s) for s in input_splits] if input_splits else None
        handle = _k._kolo.alltoall_async(native, self._name("alltoall"), splits, stream)

        def finish(received):
            output.copy_(torch.from_dlpack(received).view_as(output))

        return self._submit(handle, output, finish)

    # Newer torch calls these names for all_gather_into_tensor,
    # reduce_scatter_tensor and all_to_all_single; older torch the ones above.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base

    def barrier(self, opts=None):
        _k.barrier()
        return _completed([])


def _create(store, rank, size, timeout):
    """torch's backend factory: starts (or reuses) kolo's engine for the
    world group. torch's store already holds MASTER_PORT, so rank 0 picks
    kolo's rendezvous port and a token and shares them through it."""
    if _k.is_initialized():
        if (_k.rank(), _k.size()) != (rank, size):
            raise ValueError(
                f"the kolo backend serves the world group only: a group of {size} ranks "
                f"(this one rank {rank} of it) is not kolo's world of {_k.size()}"
            )
        return ProcessGroupKolo(rank, size)
    _k._agree_on_rendezvous(store, rank)
    env = os.environ
    env["KOLO_MASTER_ADDR"] = env.get("KOLO_MASTER_ADDR", env.get("MASTER_ADDR", "127.0.0.1"))
    env["KOLO_RANK"] = str(rank)
    env["KOLO_WORLD_SIZE"] = str(size)
    if "LOCAL_RANK" not in env and "KOLO_LOCAL_RANK" not in env:
        env["KOLO_LOCAL_RANK"] = str(rank)
        env["KOLO_LOCAL_WORLD_SIZE"] = str(size)
    env.setdefault("KOLO_BACKEND", "ucx")
    _k.init()
    return ProcessGroupKolo(rank, size)


dist.Backend.register_backend("kolo", _create, devices=["cpu", "cuda"])
