"""The numpy API on every rank of a job: results, errors on every rank,
and the next call working after an error. Prints "rank R of N: ok"."""

import threading

import numpy as np

import kolo


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {kolo.rank()}: {what}")


def main():
    kolo.init()
    r, n = kolo.rank(), kolo.size()
    check(kolo.local_size() == n and kolo.local_rank() == r, "local rank and size on one host")

    # Allreduce in place, every op, several dtypes.
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16, np.uint8):
        a = np.full(7, r + 1, dtype=dtype)
        out = kolo.allreduce(a, op=kolo.Sum, name=f"sum.{np.dtype(dtype).name}")
        check(out is a, "allreduce returns the array it reduced in place")
        check((a == n * (n + 1) // 2).all(), f"sum {np.dtype(dtype).name}: {a}")
    # Compression: float data travels in 16 bits, within its rounding.
    for compression, unit in ((kolo.Compression.fp16, 2.0**-11), (kolo.Compression.bf16, 2.0**-8)):
        c = np.array([(r + 1) / 3 + i * 0.01 for i in range(50)], dtype=np.float32)
        kolo.allreduce(c, name=f"compressed.{compression}", compression=compression)
        exact = np.array([sum((p + 1) / 3 + i * 0.01 for p in range(n)) for i in range(50)])
        check(np.all(np.abs(c - exact) <= (n + 2) * unit * exact), f"{compression}: {c - exact}")
    try:
        kolo.allreduce(np.ones(2, dtype=np.float32), name="compressed.bad", compression="fp8")
        check(False, "an unknown compression must raise")
    except ValueError as e:
        check("fp8" in str(e), f"{e}")
    a = np.full((2, 3), float(r), dtype=np.float64)
    kolo.allreduce(a, op=kolo.Average)
    check(np.allclose(a, (n - 1) / 2), f"average: {a}")
    a = np.array([r, -r], dtype=np.int64)
    kolo.allreduce(a, op=kolo.Max)
    check(list(a) == [n - 1, 0], f"max: {a}")
    a = np.array([r + 1.0], dtype=np.float32)
    kolo.allreduce(a, op=kolo.Min, prescale_factor=2.0, postscale_factor=0.5)
    check(a[0] == 1.0, f"min with scales: {a}")
    flags = np.array([r == 0, True], dtype=np.bool_)
    kolo.allreduce(flags, op=kolo.Min)
    check(list(flags) == [n == 1, True], f"bool min: {flags}")

    # Async, poll, synchronize; a fused group.
    arrays = [np.full(1000, float(r + i), dtype=np.float32) for i in range(8)]
    handles = [kolo.allreduce_async(x, op=kolo.Sum, name=f"async.{i}") for i, x in enumerate(arrays)]
    check(all(isinstance(kolo.poll(h), bool) for h in handles), "poll answers")
    for i, h in enumerate(handles):
        check(kolo.synchronize(h) is arrays[i], "synchronize returns the array")
        check((arrays[i] == sum(q + i for q in range(n))).all(), f"async sum {i}")
    group = [np.full(5, float(r), dtype=np.float32), np.full(3, 1.0, dtype=np.float32)]
    kolo.grouped_allreduce(group, op=kolo.Sum, names=["group.a", "group.b"])
    check((group[0] == n * (n - 1) / 2).all() and (group[1] == n).all(), f"group: {group}")
    # The fusion buffers freed; the next fused step allocates again.
    freed = kolo.release_buffers()
    check(isinstance(freed, int) and freed >= 0, f"release_buffers: {freed}")
    check(kolo.release_buffers() == 0, "a second release_buffers frees nothing")
    kolo.grouped_allreduce(group, op=kolo.Sum, names=["group.a", "group.b"])
    check((group[0] == n * n * (n - 1) / 2).all() and (group[1] == n * n).all(), f"group again: {group}")

    # The other collectives.
    b = np.full(4, float(r), dtype=np.float64)
    kolo.broadcast(b, root_rank=n - 1, name="bcast")
    check((b == n - 1).all(), f"broadcast: {b}")
    rows = np.full((r + 1, 2), r, dtype=np.int32)
    gathered = kolo.allgather(rows, name="gather")
    check(gathered.shape == (n * (n + 1) // 2, 2), f"allgather shape {gathered.shape}")
    check(list(gathered[:, 0]) == [q for q in range(n) for _ in range(q + 1)], "allgather rows")
    full = np.arange(2 * n, dtype=np.float32)
    mine = kolo.reduce_scatter(full, op=kolo.Sum, name="rs")
    check(list(mine) == [2 * r * n, (2 * r + 1) * n], f"reduce_scatter: {mine}")
    send = np.array([10 * r + p for p in range(n)], dtype=np.int16)
    received, splits = kolo.alltoall(send, name="a2a")
    check(list(received) == [10 * p + r for p in range(n)] and list(splits) == [1] * n, "alltoall")
    kolo.barrier()

    # A mismatch raises on every rank, and the next call works.
    try:
        kolo.allreduce(np.zeros(3 + r, dtype=np.float32), name="mismatched")
        check(n == 1, "a shape mismatch must raise")
    except kolo.MismatchError as e:
        check("mismatched" in str(e) and "shape" in str(e), f"the mismatch names tensor and shapes: {e}")
    try:
        kolo.allreduce(np.zeros(2, dtype=np.float32 if r == 0 else np.float64), name="dtypes")
        check(n == 1, "a dtype mismatch must raise")
    except kolo.MismatchError as e:
        check("dtypes" in str(e), f"{e}")
    after = np.ones(3, dtype=np.float32)
    kolo.allreduce(after, name="after")
    check((after == n).all(), "the call after a mismatch works")

    # Bad input: clear errors before anything is submitted, on this rank.
    bad = [
        (np.zeros(3, dtype=np.uint32), "data type"),
        (np.zeros((4, 4), dtype=np.float32)[:, 1], "not contiguous"),
        ([1.0, 2.0], "neither a buffer"),
    ]
    for value, words in bad:
        try:
            kolo.allreduce(value, name="bad")
            check(False, f"{words}: must raise")
        except kolo.InvalidArgumentError as e:
            check(words in str(e) and "bad" in str(e), f"{words}: {e}")
    frozen = np.zeros(3, dtype=np.float32)
    frozen.flags.writeable = False
    try:
        kolo.allreduce(frozen, name="frozen")
        check(False, "read-only must raise")
    except ValueError as e:
        check("read-only" in str(e), f"{e}")
    check(len(kolo.allgather(frozen, name="frozen.gather")) == 3 * n, "a read-only input may be gathered")

    # Threads submit concurrently; the GIL is released while waiting.
    results = {}

    def worker(i):
        x = np.full(64, float(i), dtype=np.float32)
        kolo.allreduce(x, name=f"thread.{i}")
        results[i] = x[0]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    check(results == {i: float(i * n) for i in range(4)}, f"threads: {results}")

    check_process_sets(r, n)

    last = kolo.join()
    check(0 <= last < n, f"join: {last}")
    kolo.shutdown()
    check(not kolo.is_initialized(), "shut down")
    try:
        kolo.rank()
        check(False, "rank() after shutdown must raise")
    except kolo.NotInitializedError:
        pass
    print(f"rank {r} of {n}: ok")


def check_process_sets(r, n):
    """Disjoint and overlapping sets, one name in the world and two sets at
    once, every collective on a set, and its errors naming it."""
    parity = [q for q in range(n) if q % 2 == r % 2]
    ends = sorted({0, n - 1})
    mine = kolo.process_set(parity)
    check(mine.members == parity and mine.size == len(parity), f"members: {mine}")
    check(mine.rank == parity.index(r), f"set rank: {mine}")
    both = kolo.process_set(ends) if r in ends else None
    world = np.full(3, 1 << r, dtype=np.int64)
    in_parity = np.full(3, 1 << r, dtype=np.int64)
    in_ends = np.full(3, 1 << r, dtype=np.int64)
    handles = [
        kolo.allreduce_async(world, name="sets.x"),
        kolo.allreduce_async(in_parity, name="sets.x", process_set=mine),
    ]
    if both is not None:
        kolo.allreduce(in_ends, name="sets.x", process_set=both)
        check((in_ends == sum(1 << q for q in ends)).all(), f"ends: {in_ends}")
    for h in handles:
        kolo.synchronize(h)
    check((world == (1 << n) - 1).all(), f"world: {world}")
    check((in_parity == sum(1 << q for q in parity)).all(), f"parity: {in_parity}")
    b = np.full(2, float(r), dtype=np.float32)
    kolo.broadcast(b, root_rank=len(parity) - 1, name="sets.b", process_set=mine)
    check((b == parity[-1]).all(), f"set broadcast: {b}")
    gathered = kolo.allgather(np.array([r], dtype=np.int32), name="sets.g", process_set=mine)
    check(list(gathered) == parity, f"set allgather: {gathered}")
    share = kolo.reduce_scatter(np.ones(2 * len(parity), dtype=np.float32), name="sets.rs",
                                process_set=mine)
    check(list(share) == [len(parity)] * 2, f"set reduce_scatter: {share}")
    group = [np.ones(2, dtype=np.float32), np.full(1, float(r), dtype=np.float32)]
    kolo.grouped_allreduce(group, op=kolo.Max, names=["sets.ga", "sets.gb"], process_set=mine)
    check(group[1][0] == parity[-1], f"set group: {group}")
    kolo.barrier(process_set=mine)
    if len(parity) > 1:
        try:
            kolo.allreduce(np.zeros(2 + mine.rank, dtype=np.float32), name="sets.bad",
                           process_set=mine)
            check(False, "a mismatch in a set must raise")
        except kolo.MismatchError as e:
            check(f"process set {parity}" in str(e), f"the error names the set: {e}")
    try:
        kolo.process_set([q for q in range(n) if q != r] or [n])
        check(False, "a set without this rank must raise")
    except kolo.InvalidArgumentError as e:
        check("process set" in str(e), f"{e}")
    mine.shutdown()
    if both is not None:
        both.shutdown()


if __name__ == "__main__":
    main()
