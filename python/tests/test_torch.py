"""kolo.torch, the "kolo" torch.distributed backend and the two training
examples at 2 and 3 processes (CPU tensors; `--cuda` adds CUDA tensors
where the run has a GPU: `cargo xtask test-gpu`)."""

import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import EXAMPLES, WORKERS, assert_all_ok, run_job

torch = pytest.importorskip("torch")

CUDA = ["--cuda"] if os.environ.get("KOLO_TEST_CUDA") == "1" else []


def test_torch_api_and_backend(ranks):
    assert_all_ok(run_job(ranks, WORKERS / "torch_checks.py", *CUDA), ranks)


@pytest.mark.parametrize("example", ["train_torch.py", "train_ddp.py"])
def test_example_under_kolo_run(ranks, example):
    device = ["--device", "cuda"] if CUDA else ["--device", "cpu"]
    results = run_job(ranks, EXAMPLES / example, *device)
    assert_all_ok(results, ranks)
    # Every rank saw the same averaged losses.
    losses = {stdout.split("loss", 1)[1].strip() for _, _, stdout, _ in results}
    assert len(losses) == 1, losses


def test_example_under_torchrun():
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, UCX_TLS="sm,self", KOLO_LOG_LEVEL="error", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
         str(EXAMPLES / "train_torch.py"), "--device", "cpu", "--steps", "30"],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"rank {rank} of 2: ok" in done.stdout, done.stdout + done.stderr
