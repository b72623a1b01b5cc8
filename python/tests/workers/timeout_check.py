"""KOLO_TIMEOUT from Python: the last rank never submits "withheld"; the
others raise kolo.OperationTimeoutError (also a TimeoutError) naming the
tensor and the missing rank, and the engine stops on every rank. Prints
"rank R of N: ok"."""

import time

import numpy as np

import kolo


def main():
    kolo.init()
    r, n = kolo.rank(), kolo.size()
    kolo.barrier()
    x = np.ones(4, dtype=np.float32)
    if r == n - 1:
        # Never submits "withheld"; its engine stops with the others'.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                kolo.allreduce(np.ones(1, dtype=np.float32), name=f"probe.{time.monotonic()}")
            except kolo.KoloError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"rank {r}: the engine did not stop")
    else:
        try:
            kolo.allreduce(x, name="withheld")
            raise AssertionError(f"rank {r}: 'withheld' completed")
        except kolo.OperationTimeoutError as e:
            text = str(e)
            assert isinstance(e, TimeoutError), type(e)
            assert "withheld" in text and "KOLO_TIMEOUT" in text, text
            assert f"missing from ranks [{n - 1}]" in text, text
        assert (x == 1).all(), f"a failed operation leaves the array alone: {x}"
    print(f"rank {r} of {n}: ok")


if __name__ == "__main__":
    main()
