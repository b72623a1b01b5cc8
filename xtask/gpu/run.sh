#!/usr/bin/env bash
# kolo-nccl's GPU checks (gpu_threads, gpu_mpi, and gpu_conformance: the
# conformance suite on device memory) and, with BENCH=1, its
# timings (nccl_bench), run from the folder `cargo xtask test-gpu` builds
# (gpu-dist/, where this file is run.sh): at 1, 2 and GPUS GPUs, in thread
# mode (one process, a thread per GPU) and in process mode (one process
# per GPU under mpirun); then the peer allreduce kernels on GPU 0 (steps
# peer-*: simulated ranks, threads, processes through CUDA IPC, a dead
# peer; peer-bench-1gpu with BENCH=1). Every step runs under `timeout`;
# its log goes to $OUT/<step>.log, its bench rows as JSON lines to
# $OUT/<step>.jsonl, and one line per step to $OUT/summary.txt:
#
#   PASS <step>                 every check of the step passed
#   FAIL <step> (exit N)        a check failed (its `FAIL` lines are shown)
#   FAIL <step> (timed out)     the step hit STEP_TIMEOUT and was killed
#   SKIP <step> (...)           not enough GPUs visible
#
# The exit status is 0 only if no step failed.
#
#   bash run.sh                  # checks at 1, 2 and all visible GPUs
#   GPUS=4 bash run.sh           # checks at 1, 2 and 4 GPUs
#   BENCH=1 bash run.sh          # checks, then bench tables at the same counts
#   CHECKS=0 BENCH=1 bash run.sh # bench tables only
#   SMALL=1 BENCH=1 bash run.sh  # bench without the bandwidth tables
#   STEP_TIMEOUT=900 bash run.sh # seconds per step (default 600)
#   MPIRUN=/opt/openmpi/bin/mpirun bash run.sh
#   KOLO_NCCL_LIBRARY=/path/to/libnccl.so.2 bash run.sh
#
# The folder's other scripts: run-engine.sh (kolo's engine with GPU
# tensors), run-pipeline.sh (kolo-pipeline's NCCL channels); gpu-env.sh is
# what all three share. kolo-bench (built alongside) is not run here; see
# its --help.
# shellcheck source=/dev/null
source "$(dirname "$0")/gpu-env.sh"
: >"$OUT/summary.txt"

visible=$gpus
GPUS="${GPUS:-$visible}"
STEP_TIMEOUT="${STEP_TIMEOUT:-600}"
echo "GPUs visible: $visible; testing at 1, 2 and $GPUS"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
counts=$(printf '%s\n' 1 2 "$GPUS" | awk '$1 > 0' | sort -n | uniq)

status=0
# Keeps the folder small: a log over 8 MiB keeps its last 8 MiB.
trim() { [ "$(stat -c %s "$1" 2>/dev/null || echo 0)" -le $((8 << 20)) ] || { tail -c $((8 << 20)) "$1" >"$1.tmp" && mv "$1.tmp" "$1"; }; }
step() {
  local name=$1 need=$2
  shift 2
  if [ "$visible" -lt "$need" ]; then
    echo "SKIP $name (needs $need GPUs, $visible visible)" | tee -a "$OUT/summary.txt"
    return
  fi
  echo "== $name: $*"
  timeout --kill-after=15 "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  trim "$OUT/$name.log"
  grep '^json: ' "$OUT/$name.log" | sed 's/^json: //' >"$OUT/$name.jsonl"
  [ -s "$OUT/$name.jsonl" ] || rm -f "$OUT/$name.jsonl"
  grep -E 'FAIL|skipped|passed|^excluded:|^bench|^small:|^step:' "$OUT/$name.log" | tail -n 150
  local verdict="PASS $name"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict="FAIL $name (timed out after ${STEP_TIMEOUT}s)"
  elif [ "$rc" -ne 0 ]; then
    verdict="FAIL $name (exit $rc)"
  fi
  [ "$rc" -eq 0 ] || status=1
  echo "$verdict (log: $OUT/$name.log)" | tee -a "$OUT/summary.txt"
}

if [ "${CHECKS:-1}" != 0 ]; then
  for n in $counts; do
    step "threads-${n}gpu" "$n" ./gpu_threads --gpus "$n"
    step "mpi-np$n" "$n" "${MPIRUN[@]}" -np "$n" ./gpu_mpi
    step "conformance-threads-${n}gpu" "$n" ./gpu_conformance --gpus "$n"
    step "conformance-mpi-np$n" "$n" "${MPIRUN[@]}" -np "$n" ./gpu_conformance
  done
  # The peer allreduce kernels on GPU 0: simulated ranks and threads, then
  # processes through CUDA IPC, then a dead peer (last: it breaks its
  # context).
  step "peer-threads" 1 ./gpu_threads --peer
  step "peer-ipc-np2" 1 "${MPIRUN[@]}" -np 2 ./gpu_mpi --peer
  step "peer-ipc-np4" 1 "${MPIRUN[@]}" -np 4 ./gpu_mpi --peer
  step "peer-trap" 1 ./gpu_threads --peer-trap
fi
if [ "${BENCH:-0}" = 1 ]; then
  small=()
  [ "${SMALL:-0}" = 1 ] && small=(--small)
  for n in $counts; do
    step "threads-bench-${n}gpu" "$n" ./nccl_bench --bench --gpus "$n" "${small[@]}"
    step "mpi-bench-np$n" "$n" "${MPIRUN[@]}" -np "$n" ./nccl_bench --bench "${small[@]}"
  done
  step "peer-bench-1gpu" 1 ./gpu_threads --peer-bench
fi

echo "== summary"
cat "$OUT/summary.txt"
if [ "$status" -ne 0 ]; then
  echo "SOME GPU CHECKS FAILED (logs in $OUT)"
elif [ "$visible" -eq 0 ]; then
  echo "NO GPU VISIBLE: nothing was tested (logs in $OUT)"
else
  echo "ALL GPU CHECKS PASSED (logs in $OUT)"
fi
exit "$status"
