"""KOLO_TIMEOUT: a tensor one rank never submits fails on the others."""

from conftest import WORKERS, assert_all_ok, run_job


def test_a_withheld_tensor_times_out_on_the_others():
    env = {"KOLO_TIMEOUT": "1", "KOLO_STALL_CHECK_TIME_SECONDS": "0"}
    assert_all_ok(run_job(2, WORKERS / "timeout_check.py", env=env), 2)
