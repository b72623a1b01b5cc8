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

EXAMPLES_ = ["train_torch.py", "train_ddp.py"]

# CUDA tensors where the run asks for them (`cargo xtask test-gpu`): one
# process per GPU, so a job of 1 and one of every GPU.
GPUS = torch.cuda.device_count() if os.environ.get("KOLO_TEST_CUDA") == "1" else 0
CUDA_RANKS = sorted({1, GPUS}) if GPUS else []


def test_torch_api_and_backend(ranks):
    assert_all_ok(run_job(ranks, WORKERS / "torch_checks.py"), ranks)


@pytest.mark.parametrize("example", EXAMPLES_)
def test_example_under_kolo_run(ranks, example):
    check_example(run_job(ranks, EXAMPLES / example, "--device", "cpu"), ranks)


@pytest.mark.parametrize("gpus", CUDA_RANKS)
def test_torch_api_and_backend_on_cuda(gpus):
    assert_all_ok(run_job(gpus, WORKERS / "torch_checks.py", "--cuda"), gpus)


@pytest.mark.parametrize("gpus", CUDA_RANKS)
@pytest.mark.parametrize("example", EXAMPLES_)
def test_example_on_cuda(gpus, example):
    check_example(run_job(gpus, EXAMPLES / example, "--device", "cuda"), gpus)


def check_example(results, ranks):
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
