#!/usr/bin/env bash
# Runs kolo-pipeline's GPU checks from the folder `cargo xtask test-gpu`
# builds (gpu-dist/, with this script from xtask/gpu/): NCCL channels with one thread
# per GPU (`gpu_nccl`), and with one process per GPU under mpirun
# (`gpu_nccl_mpi`: widths 1,1 on 2 processes; widths 1,1,1 on 3
# processes, where two ranks that share no channel share a GPU). Needs 2
# GPUs. Each run is bounded by `timeout`; its log goes to
# ${OUT:-./gpu-out}/<name>.log and its PASS/FAIL/SKIP lines to the
# terminal. The exit status is 0 only if every run passed (or was skipped
# for lack of GPUs).
#
#   bash run-pipeline.sh
#   STEP_TIMEOUT=300 MPIRUN=/opt/openmpi/bin/mpirun bash run-pipeline.sh

# shellcheck source=/dev/null
source "$(dirname "$0")/gpu-env.sh"
STEP_TIMEOUT="${STEP_TIMEOUT:-300}"

status=0
run() {
  local name=$1
  shift
  if [ "$gpus" -lt 2 ]; then
    echo "SKIP $name (needs 2 GPUs, $gpus visible)"
    return
  fi
  echo "== $name: $*"
  timeout --kill-after=15 "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E 'PASS|FAIL|SKIP|skipped|passed' "$OUT/$name.log" | tail -n 80
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "== FAIL $name: timed out after ${STEP_TIMEOUT}s (log: $OUT/$name.log)"
  else
    echo "== $name: exit $rc (log: $OUT/$name.log)"
  fi
  [ "$rc" -eq 0 ] || status=1
}

run pipeline-threads ./gpu_nccl
run pipeline-mpi-np2 "${MPIRUN[@]}" -np 2 ./gpu_nccl_mpi --widths 1,1
run pipeline-mpi-np3 "${MPIRUN[@]}" -np 3 ./gpu_nccl_mpi --widths 1,1,1

if [ "$status" -ne 0 ]; then
  echo "SOME PIPELINE GPU CHECKS FAILED (logs in $OUT)"
else
  echo "ALL PIPELINE GPU CHECKS PASSED OR SKIPPED (logs in $OUT)"
fi
exit "$status"
