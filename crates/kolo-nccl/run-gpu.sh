#!/usr/bin/env bash
# Runs kolo's GPU checks from the folder `cargo xtask test-gpu` builds
# (gpu-dist/): thread mode on 1 and 2 GPUs, then one process per GPU under
# mpirun with 1 and 2 processes. Logs go to ${OUT:-./gpu-out}; the exit
# status is 0 only if every run passed (or was skipped for lack of GPUs).
#
#   bash run.sh                 # the checks
#   BENCH=1 bash run.sh         # plus nccl-tests-style bandwidth tables (8 B
#                               # to 1 GiB), `small:` latency and `step:` lines
#   MPIRUN=/opt/openmpi/bin/mpirun bash run.sh
#   KOLO_NCCL_LIBRARY=/path/to/libnccl.so.2 bash run.sh
#
# kolo-bench (built alongside) is not run here; see its --help.
set -uo pipefail
cd "$(dirname "$0")"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"

# NVLink SHARP (NVLS) off, as in the recorded anchors.
export NCCL_NVLS_ENABLE=0

# kolo-nccl loads libnccl.so.2 at run time. pip wheels (PyTorch's NCCL)
# keep it inside site-packages, off the loader's path: find it there.
if [ -z "${KOLO_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  for py in python3 python; do
    dir=$("$py" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) || continue
    if [ -e "$dir/libnccl.so.2" ]; then
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "using NCCL from $dir"
      break
    fi
  done
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "GPUs visible: ${gpus:-0}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true

status=0
run() {
  local name=$1
  shift
  echo "== $name: $*"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E 'FAIL|skipped|passed|bench|^small:|^step:' "$OUT/$name.log" | tail -n 120
  echo "== $name: exit $rc (log: $OUT/$name.log)"
  [ "$rc" -eq 0 ] || status=1
}

MPIRUN=(${MPIRUN:-mpirun} --allow-run-as-root --oversubscribe --bind-to none
  -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
[ -n "${KOLO_NCCL_LIBRARY:-}" ] && MPIRUN+=(-x KOLO_NCCL_LIBRARY)

run threads-1gpu ./gpu_threads --gpus 1
run threads-2gpu ./gpu_threads --gpus 2
for np in 1 2; do
  if [ "${gpus:-0}" -ge "$np" ]; then
    run "mpi-np$np" "${MPIRUN[@]}" -np "$np" ./gpu_mpi
  else
    echo "== mpi-np$np: skipped (needs $np GPUs)"
  fi
done

if [ "${BENCH:-0}" = 1 ]; then
  run threads-bench ./gpu_threads --gpus "$([ "${gpus:-0}" -ge 2 ] && echo 2 || echo 1)" --bench
  [ "${gpus:-0}" -ge 2 ] && run mpi-bench "${MPIRUN[@]}" -np 2 ./gpu_mpi --bench
fi

if [ "$status" -ne 0 ]; then
  echo "SOME GPU CHECKS FAILED (logs in $OUT)"
elif [ "${gpus:-0}" -eq 0 ]; then
  echo "NO GPU VISIBLE: nothing was tested (logs in $OUT)"
else
  echo "ALL GPU CHECKS PASSED (logs in $OUT)"
fi
exit "$status"
