"""The numpy API at 2 and 3 processes."""

from conftest import WORKERS, assert_all_ok, run_job


def test_numpy_api(ranks):
    assert_all_ok(run_job(ranks, WORKERS / "numpy_checks.py"), ranks)
