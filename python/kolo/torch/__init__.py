"""horovod.torch's surface on kolo: a Horovod script moves by changing its
import (``import kolo.torch as hvd``)::

    import torch
    import kolo.torch as hvd

    hvd.init()
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

As in Horovod, ``allreduce`` returns a new tensor and averages by
default, ``allreduce_`` works in place; CUDA tensors go through NCCL in
the order of their current stream. Importing this module also registers
the ``"kolo"`` torch.distributed backend (``dist.init_process_group("kolo")``).
"""

import io
import pickle

import torch

import kolo as _k
from kolo import (  # noqa: F401 - re-exported
    Average,
    Compression,
    Handle,
    InvalidArgumentError,
    KoloError,
    Max,
    Min,
    MismatchError,
    Product,
    Sum,
    barrier,
    init,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_threads_supported,
    poll,
    rank,
    release_buffers,
    shutdown,
    size,
    synchronize,
)

from . import backend as _backend  # noqa: F401 - registers "kolo"
from .optimizer import DistributedOptimizer


def _op(average, op):
    """Horovod's `average` flag (deprecated there too) or `op`."""
    if average is not None:
        return Average if average else Sum
    return op


def allreduce_async_(tensor, average=None, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                     compression=Compression.none):
    """Reduces `tensor` in place; a handle for :func:`synchronize`."""
    return _k.allreduce_async(tensor, _op(average, op), name, prescale_factor, postscale_factor,
                              compression=compression)


def allreduce_(tensor, average=None, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
               compression=Compression.none):
    """Reduces `tensor` across all ranks in place and returns it."""
    return _k.allreduce(tensor, _op(average, op), name, prescale_factor, postscale_factor,
                        compression=compression)


def allreduce_async(tensor, average=None, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                    compression=Compression.none):
    """:func:`allreduce`, returning a handle whose result is the new tensor."""
    return allreduce_async_(tensor.clone(), average, name, op, prescale_factor, postscale_factor,
                            compression)


def allreduce(tensor, average=None, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
              compression=Compression.none):
    """A new tensor: `tensor` reduced across all ranks (averaged by
    default, as in Horovod); `compression` (:class:`kolo.Compression`)
    makes float data travel in 16 bits."""
    return allreduce_(tensor.clone(), average, name, op, prescale_factor, postscale_factor,
                      compression)


def grouped_allreduce_async_(tensors, average=None, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensors` in place as one fused group; a handle."""
    names = None if name is None else [f"{name}.{i}" for i in range(len(tensors))]
    return _k.grouped_allreduce_async(tensors, _op(average, op), names, prescale_factor, postscale_factor)


def grouped_allreduce_(tensors, average=None, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensors` in place as one fused group and returns them."""
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor).wait()


def grouped_allreduce(tensors, average=None, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """New tensors: `tensors` reduced as one fused group."""
    copies = [t.clone() for t in tensors]
    return grouped_allreduce_(copies, average, name, op, prescale_factor, postscale_factor)


def broadcast_async_(tensor, root_rank, name=None):
    """Broadcasts into `tensor` in place; a handle."""
    return _k.broadcast_async(tensor, root_rank, name)


def broadcast_(tensor, root_rank, name=None):
    """Copies `root_rank`'s `tensor` into every rank's, in place."""
    return _k.broadcast(tensor, root_rank, name)


def broadcast(tensor, root_rank, name=None):
    """A new tensor holding `root_rank`'s `tensor`."""
    return _k.broadcast(tensor.clone(), root_rank, name)


allgather = _k.allgather
allgather_async = _k.allgather_async
reduce_scatter = _k.reduce_scatter
reduce_scatter_async = _k.reduce_scatter_async
alltoall = _k.alltoall
alltoall_async = _k.alltoall_async


def broadcast_object(obj, root_rank=0, name=None):
    """`root_rank`'s `obj` (any picklable object) on every rank."""
    name = name or _k._name("broadcast_object", None)
    if rank() == root_rank:
        data = pickle.dumps(obj)
        length = torch.tensor([len(data)], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    _k.broadcast(length, root_rank, f"{name}.length")
    if rank() == root_rank:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        payload = torch.zeros(int(length.item()), dtype=torch.uint8)
    _k.broadcast(payload, root_rank, f"{name}.data")
    return pickle.load(io.BytesIO(payload.numpy().tobytes()))


def broadcast_parameters(params, root_rank=0):
    """Copies `root_rank`'s parameters into every rank's, in place:
    `params` is a ``state_dict()``, ``named_parameters()`` or a list of
    ``(name, tensor)`` pairs. The broadcasts are submitted together and
    fused by the engine."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise ValueError("broadcast_parameters takes a state_dict or (name, tensor) pairs")
    handles = []
    for name, p in items:
        if p is None:
            continue
        tensor = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(_k.broadcast_async(tensor, root_rank, f"broadcast_parameters.{name}"))
    for handle in handles:
        handle.wait()


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Copies `root_rank`'s optimizer state (tensors and hyperparameters)
    into every rank's optimizer, as Horovod does; a rank whose optimizer
    has no state yet (before its first step) gets the root's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS")
    state = optimizer.state_dict()
    # The tensors go by broadcast (zero-copy, fused); everything else
    # (hyperparameters, steps kept as numbers) by one pickled object.
    layout = broadcast_object(
        {
            "param_groups": state["param_groups"],
            "state": {
                k: {
                    n: (("tensor", tuple(v.shape), str(v.dtype)) if torch.is_tensor(v) else ("value", v))
                    for n, v in s.items()
                }
                for k, s in state["state"].items()
            },
        },
        root_rank,
        name="broadcast_optimizer_state.layout",
    )
    devices = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            devices[id(p)] = p.device
    ids = [id(p) for g in optimizer.param_groups for p in g["params"]]
    new_state = {}
    handles = []
    for key, entries in sorted(layout["state"].items()):
        mine = state["state"].get(key, {})
        device = devices.get(ids[key], torch.device("cpu")) if key < len(ids) else torch.device("cpu")
        restored = {}
        for n, (kind, *rest) in sorted(entries.items()):
            if kind == "value":
                restored[n] = rest[0]
                continue
            shape, dtype = rest
            dtype = getattr(torch, dtype.replace("torch.", ""))
            tensor = mine.get(n)
            if not (torch.is_tensor(tensor) and tuple(tensor.shape) == shape and tensor.dtype == dtype):
                tensor = torch.zeros(shape, dtype=dtype, device=device)
            tensor = tensor.contiguous()
            handles.append(_k.broadcast_async(tensor, root_rank, f"broadcast_optimizer_state.{key}.{n}"))
            restored[n] = tensor
        new_state[key] = restored
    for handle in handles:
        handle.wait()
    optimizer.load_state_dict({"state": new_state, "param_groups": layout["param_groups"]})


__all__ = [
    "Sum", "Average", "Min", "Max", "Product", "Compression",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "mpi_threads_supported", "release_buffers", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async_",
    "broadcast", "broadcast_", "broadcast_async_", "allgather", "allgather_async",
    "reduce_scatter", "reduce_scatter_async", "alltoall", "alltoall_async",
    "broadcast_object", "broadcast_parameters", "broadcast_optimizer_state",
    "DistributedOptimizer", "barrier", "join", "poll", "synchronize", "Handle",
    "KoloError", "MismatchError", "InvalidArgumentError",
]
