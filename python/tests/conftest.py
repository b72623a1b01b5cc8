"""Runs kolo jobs of several processes (kolo-run's launcher, UCX over shared
memory) and checks that every rank passed."""

import sys
from pathlib import Path

import pytest

import kolo

WORKERS = Path(__file__).parent / "workers"
EXAMPLES = Path(__file__).parent.parent / "examples"

# Three processes share CI's two cores: bounded, never a hang.
JOB_TIMEOUT = 240.0


def run_job(ranks, script, *args, env=None):
    """Runs `script args` as `ranks` processes; returns their outputs after
    asserting that every rank exited 0 and printed its closing line."""
    job_env = {"UCX_TLS": "sm,self", "KOLO_LOG_LEVEL": "error", "PYTHONUNBUFFERED": "1"}
    job_env.update(env or {})
    results = kolo.run_job(ranks, [sys.executable, str(script), *args], job_env, JOB_TIMEOUT)
    for rank, code, stdout, stderr in results:
        assert code == 0, f"rank {rank} of {ranks} exited {code}:\n{stdout}\n{stderr}"
    return results


def assert_all_ok(results, ranks):
    for rank, _, stdout, stderr in results:
        assert f"rank {rank} of {ranks}: ok" in stdout, f"rank {rank}:\n{stdout}\n{stderr}"


@pytest.fixture(params=[2, 3], ids=lambda n: f"np{n}")
def ranks(request):
    return request.param


