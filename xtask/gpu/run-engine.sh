#!/usr/bin/env bash
# Runs kolo's GPU engine checks (the `gpu_engine` test binary that
# `cargo xtask test-gpu` puts in gpu-dist/, with this script from
# xtask/gpu/) on 1 and 2 GPUs, thread per GPU,
# on 2 GPUs one process per GPU under mpirun (Kolo::init_nccl_mpi), and
# one process per GPU under kolo-run (Kolo::init_nccl_ucx) on 1 and 2,
# and on 2 a rank of that job killed with SIGKILL mid-allreduce.
# Logs go to ${OUT:-./gpu-out}; the exit status is 0 only if every run
# passed (or was skipped for lack of GPUs).
#
#   bash run-engine.sh          # the checks
#   BENCH=1 bash run-engine.sh  # plus `engine-step:` / `engine-small:` lines

# shellcheck source=/dev/null
source "$(dirname "$0")/gpu-env.sh"
status=0
run() {
  local name=$1
  shift
  echo "== $name: $*"
  timeout 600 "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E 'FAIL|skipped|passed|^engine-' "$OUT/$name.log" | tail -n 80
  echo "== $name: exit $rc (log: $OUT/$name.log)"
  [ "$rc" -eq 0 ] || status=1
}

run engine-1gpu ./gpu_engine --gpus 1
run engine-2gpu ./gpu_engine --gpus 2
# One process per GPU (Kolo::init_nccl_mpi), when mpirun and 2 GPUs are here.
mpi_np=0
if command -v "${MPIRUN[0]}" >/dev/null 2>&1 && [ "$gpus" -ge 2 ]; then
  mpi_np=2
  run engine-mpi "${MPIRUN[@]}" -np 2 ./gpu_engine
else
  echo "skipped: engine-mpi needs mpirun and 2 GPUs"
fi
# One process per GPU started by kolo-run (Kolo::init_nccl_ucx: NCCL
# bootstrapped through the rendezvous store, no MPI), on 1 GPU and on 2.
run engine-store-1gpu ./kolo-run -n 1 --master-port 0 ./gpu_engine_ucx
if [ "$gpus" -ge 2 ]; then
  run engine-store-2gpu ./kolo-run -n 2 --master-port 0 ./gpu_engine_ucx
  # A rank killed with SIGKILL mid-allreduce (gpu_engine's killed.rs):
  # kolo-run must exit non-zero naming rank 1, and rank 0 must say how
  # its allreduce failed (naming rank 1, within 30 s) and that it shut
  # down.
  echo "== engine-store-killed-2gpu"
  timeout 300 ./kolo-run --grace 90 -n 2 --master-port 0 ./gpu_engine_ucx --killed \
    >"$OUT/engine-store-killed-2gpu.log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
    grep -q 'rank 1 (pid [0-9]*) was killed by signal 9' "$OUT/engine-store-killed-2gpu.log" &&
    grep -q '^kolo-killed survivor 0:' "$OUT/engine-store-killed-2gpu.log"; then
    grep '^kolo-killed survivor' "$OUT/engine-store-killed-2gpu.log"
    echo "== engine-store-killed-2gpu: passed (kolo-run exit $rc)"
  else
    tail -n 40 "$OUT/engine-store-killed-2gpu.log"
    echo "== engine-store-killed-2gpu: FAIL (kolo-run exit $rc)"
    status=1
  fi
else
  echo "skipped: engine-store-2gpu and engine-store-killed-2gpu need 2 GPUs"
fi
if [ "${BENCH:-0}" = 1 ]; then
  run engine-bench ./gpu_engine --gpus "$([ "${gpus:-0}" -ge 2 ] && echo 2 || echo 1)" --bench
  if [ "$mpi_np" -ge 2 ]; then
    run engine-mpi-bench "${MPIRUN[@]}" -np 2 ./gpu_engine --bench
  fi
fi
if [ "$status" -ne 0 ]; then
  echo "SOME GPU ENGINE CHECKS FAILED (logs in $OUT)"
else
  echo "ALL GPU ENGINE CHECKS PASSED (logs in $OUT)"
fi
exit "$status"
