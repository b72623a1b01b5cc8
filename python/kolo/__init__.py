"""kolo: communication for distributed deep-learning training.

Horovod's API on kolo's engine (negotiation, tensor fusion, a response
cache, a stall inspector), for numpy arrays and torch tensors, without
copies: numpy arrays through the buffer protocol, torch tensors (CPU and
CUDA) through DLPack, CUDA tensors in the order of their current stream.
Every wait releases the GIL. Start the processes with ``kolo-run`` (or
``python -m kolo.run``), torchrun, or mpirun::

    import numpy as np
    import kolo

    kolo.init()
    grad = np.full(4, kolo.rank() + 1.0, dtype=np.float32)
    kolo.allreduce(grad, op=kolo.Average)      # in place, fused with others
    rows = kolo.allgather(np.arange(3) + 10 * kolo.rank())
    kolo.shutdown()

Operations on the same tensor name must be submitted by every rank; a
rank that submits it with another shape, data type or op makes every rank
raise :class:`kolo.MismatchError`, and the next call works. Unnamed
tensors get names from a per-process counter, so every rank must make its
unnamed calls in the same order (as in Horovod).

:mod:`kolo.torch` has horovod.torch's surface (``DistributedOptimizer``,
``broadcast_parameters``, ...) and registers the ``"kolo"``
torch.distributed backend.
"""

import itertools
import os
import secrets
import socket
import sys

from . import _kolo
from .errors import (
    InvalidArgumentError,
    KoloError,
    MismatchError,
    NotInitializedError,
    OperationTimeoutError,
    RankFailedError,
    ShutDownError,
    StalledError,
    StartError,
    TimeoutError,
)

#: Reduce ops (``op=``): the sum, the sum divided by the number of ranks,
#: the minimum, the maximum, the product.
Sum, Average, Min, Max, Product = 0, 1, 2, 3, 4

def init():
    """Starts this process's engine as the environment says: the
    launcher's variables pick the backend (kolo-run's or torchrun's over
    UCX, mpirun's over MPI, a process alone on threads) and the engine runs
    on the local rank's GPU where it has one; ``KOLO_*`` settings as in
    kolo's configuration table. A second call does nothing."""
    if not _kolo.is_initialized():
        _under_torchrun()
    _kolo.init()


def _under_torchrun():
    """Under torchrun, whose agent serves its own store on MASTER_PORT,
    rank 0 picks kolo's rendezvous port and token and shares them through
    that store (unless ``KOLO_MASTER_PORT`` names one)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or "KOLO_MASTER_PORT" in env:
        return
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=300)
    )
    prefix = f"kolo/{env['TORCHELASTIC_RUN_ID']}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    _agree_on_rendezvous(store, int(env["RANK"]), prefix)


def _agree_on_rendezvous(store, rank, prefix="kolo"):
    """Rank 0 picks a free port for kolo's rendezvous and a token; every
    rank reads them from `store` (a torch Store) into ``KOLO_MASTER_PORT``
    and ``KOLO_RENDEZVOUS_TOKEN``."""
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            store.set(f"{prefix}/port", str(s.getsockname()[1]))
        store.set(f"{prefix}/token", secrets.token_hex(16))
    os.environ["KOLO_MASTER_PORT"] = store.get(f"{prefix}/port").decode()
    os.environ["KOLO_RENDEZVOUS_TOKEN"] = store.get(f"{prefix}/token").decode()


shutdown = _kolo.shutdown
is_initialized = _kolo.is_initialized
rank = _kolo.rank
size = _kolo.size
local_rank = _kolo.local_rank
local_size = _kolo.local_size
mpi_threads_supported = _kolo.mpi_threads_supported
release_buffers = _kolo.release_buffers
barrier = _kolo.barrier
join = _kolo.join
ProcessSet = _kolo.ProcessSet


def process_set(ranks):
    """A set of ranks with an engine of its own (Horovod's ``ProcessSet``,
    torch's ``new_group``): pass it as ``process_set=`` to any collective,
    :func:`barrier` or :func:`join`. Only the members call this, each with
    the same world ranks; it returns once every member did, and members
    make the sets of one list in the same order. Within the set, ranks
    are numbered 0.. in the order of their world ranks
    (``ProcessSet.rank``, ``.size``, ``.members``); a tensor name used in
    two sets names two tensors, and one set never waits on another."""
    return _kolo.process_set([int(r) for r in ranks])

_counters = {}


def _name(kind, name):
    """`name`, or the next automatic name for unnamed `kind` operations."""
    if name is not None:
        return name
    counter = _counters.get(kind)
    if counter is None:
        counter = _counters[kind] = itertools.count()
    return f"{kind}.noname.{next(counter)}"


def _torch_of(tensor):
    """The torch module if `tensor` is a torch tensor (torch imported only
    by those who use it)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        return torch
    return None


def _native(tensor):
    """What the native module takes for `tensor`, and the CUDA stream its
    work is ordered on (0 on the host)."""
    torch = _torch_of(tensor)
    if torch is None:
        return tensor, 0
    stream = torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0
    return torch.utils.dlpack.to_dlpack(tensor.detach()), stream


def _like(tensor, output):
    """The native output as the kind of array `tensor` is."""
    torch = _torch_of(tensor)
    if torch is not None:
        return torch.from_dlpack(output)
    import numpy

    return numpy.from_dlpack(output)


class Handle:
    """An operation in flight: :func:`poll` it, :func:`synchronize` it."""

    __slots__ = ("_native", "_finish")

    def __init__(self, native, finish):
        self._native = native
        self._finish = finish

    def poll(self):
        """True once the operation completed."""
        return self._native.poll()

    def wait(self, timeout=None):
        """The result once completed (see :func:`synchronize`)."""
        return self._finish(self._native.wait(timeout))


def poll(handle):
    """True once `handle`'s operation completed (its error, if any, is
    raised by :func:`synchronize`)."""
    return handle.poll()


def synchronize(handle, timeout=None):
    """Waits for `handle` (the GIL released), at most `timeout` seconds,
    and returns its result: the tensor reduced or broadcast in place, or
    the new one an allgather, reduce-scatter or alltoall made. Raises the
    operation's error, or :class:`kolo.TimeoutError` if it is still in
    flight after `timeout`."""
    return handle.wait(timeout)


class Compression:
    """How an allreduce's float32 and float64 data travel (Horovod's
    ``Compression``): ``fp16`` and ``bf16`` cast them to 16 bits in kolo's
    fusion buffer, halving the bytes moved, and back after the collective;
    other data types travel as they are. Every rank must pass the same."""

    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"


def allreduce(tensor, op=Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
              compression=Compression.none, process_set=None):
    """Reduces `tensor` across all ranks in place and returns it:
    ``postscale * op(prescale * tensor_r for every rank r)``. Tensors
    reduced at about the same time are fused into one collective;
    `compression` (:class:`Compression`) makes float data travel in 16 bits;
    `process_set` (:func:`process_set`) reduces among its members only."""
    native, stream = _native(tensor)
    _kolo.allreduce(native, _name("allreduce", name), op, prescale_factor, postscale_factor, stream,
                    compression=compression, process_set=process_set)
    return tensor


def allreduce_async(tensor, op=Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
                    compression=Compression.none, process_set=None):
    """:func:`allreduce`, returning a :class:`Handle` at once."""
    native, stream = _native(tensor)
    handle = _kolo.allreduce_async(
        native, _name("allreduce", name), op, prescale_factor, postscale_factor, stream,
        compression=compression, process_set=process_set,
    )
    return Handle(handle, lambda _: tensor)


def grouped_allreduce_async(tensors, op=Sum, names=None, prescale_factor=1.0, postscale_factor=1.0,
                            compression=Compression.none, process_set=None):
    """:func:`grouped_allreduce`, returning a :class:`Handle` at once."""
    tensors = list(tensors)
    if names is None:
        base = _name("grouped_allreduce", None)
        names = [f"{base}.{i}" for i in range(len(tensors))]
    natives = [_native(t) for t in tensors]
    stream = natives[0][1] if natives else 0
    handle = _kolo.grouped_allreduce_async(
        [n for n, _ in natives], list(names), op, prescale_factor, postscale_factor, stream,
        compression=compression, process_set=process_set,
    )
    return Handle(handle, lambda _: tensors)


def grouped_allreduce(tensors, op=Sum, names=None, prescale_factor=1.0, postscale_factor=1.0,
                      compression=Compression.none, process_set=None):
    """Reduces `tensors` (one data type and device) in place as one fused
    group and returns them; every rank passes the same group."""
    return grouped_allreduce_async(
        tensors, op, names, prescale_factor, postscale_factor, compression, process_set
    ).wait()


def broadcast_async(tensor, root_rank=0, name=None, process_set=None):
    """:func:`broadcast`, returning a :class:`Handle` at once."""
    native, stream = _native(tensor)
    handle = _kolo.broadcast_async(native, _name("broadcast", name), root_rank, stream,
                                   process_set=process_set)
    return Handle(handle, lambda _: tensor)


def broadcast(tensor, root_rank=0, name=None, process_set=None):
    """Copies `root_rank`'s `tensor` into every rank's `tensor` (in place)
    and returns it (`root_rank` within `process_set` where one is given)."""
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def allgather_async(tensor, name=None, process_set=None):
    """:func:`allgather`, returning a :class:`Handle` at once."""
    native, stream = _native(tensor)
    handle = _kolo.allgather_async(native, _name("allgather", name), stream,
                                   process_set=process_set)
    return Handle(handle, lambda out: _like(tensor, out))


def allgather(tensor, name=None, process_set=None):
    """Every rank's `tensor` concatenated along the first dimension (which
    may differ per rank), as a new array or tensor of the same kind."""
    return allgather_async(tensor, name, process_set).wait()


def _share_shape(shape, ranks, me):
    rows = shape[0] if shape else 0
    share = rows // ranks + (1 if me < rows % ranks else 0)
    return (share,) + tuple(shape[1:])


def reduce_scatter_async(tensor, op=Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
                         process_set=None):
    """:func:`reduce_scatter`, returning a :class:`Handle` at once."""
    ranks, me = (size(), rank()) if process_set is None else (process_set.size, process_set.rank)
    shape = _share_shape(tuple(tensor.shape), ranks, me)
    torch = _torch_of(tensor)
    if torch is not None:
        output = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    else:
        import numpy

        output = numpy.empty(shape, dtype=numpy.asarray(tensor).dtype)
    native_in, stream = _native(tensor)
    native_out, _ = _native(output)
    handle = _kolo.reduce_scatter_async(
        native_in, native_out, _name("reduce_scatter", name), op, prescale_factor, postscale_factor, stream,
        process_set=process_set,
    )
    return Handle(handle, lambda _: output)


def reduce_scatter(tensor, op=Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
                   process_set=None):
    """Reduces `tensor` across all ranks and returns this rank's share of
    its rows (ranks take them in order; the first ``rows % size`` ranks
    one more), as a new array or tensor."""
    return reduce_scatter_async(tensor, op, name, prescale_factor, postscale_factor,
                                process_set).wait()


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """:func:`alltoall`, returning a :class:`Handle` at once."""
    native, stream = _native(tensor)
    splits = None if splits is None else [int(s) for s in splits]
    handle = _kolo.alltoall_async(native, _name("alltoall", name), splits, stream,
                                  process_set=process_set)
    return Handle(handle, lambda out: (_like(tensor, out), list(out.splits)))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Sends ``splits[p]`` rows of `tensor` to each rank p (None: an even
    split) and returns ``(received, received_splits)``: the rows that
    arrived, concatenated in rank order, and how many came from each rank."""
    return alltoall_async(tensor, splits, name, process_set).wait()


def run_job(ranks, argv, env=(), timeout=300.0):
    """Runs `argv` as `ranks` processes of a job on this host (kolo-run's
    variables, a free port, a random token) and returns, per rank,
    ``(rank, exit code or None if killed at the timeout, stdout, stderr)``."""
    return _kolo.run_job(ranks, list(argv), list(dict(env).items()), timeout)


__all__ = [
    "Sum", "Average", "Min", "Max", "Product",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "mpi_threads_supported", "release_buffers", "allreduce", "allreduce_async", "grouped_allreduce",
    "grouped_allreduce_async", "broadcast", "broadcast_async", "allgather", "allgather_async",
    "reduce_scatter", "reduce_scatter_async", "alltoall", "alltoall_async", "barrier", "join",
    "poll", "synchronize", "Handle", "run_job", "Compression", "process_set", "ProcessSet",
    "KoloError", "MismatchError", "StalledError", "ShutDownError", "RankFailedError",
    "InvalidArgumentError", "StartError", "NotInitializedError", "TimeoutError",
    "OperationTimeoutError",
]
