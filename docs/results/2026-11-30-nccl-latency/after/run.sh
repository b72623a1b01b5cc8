#!/usr/bin/env bash
# After (and before, same call): small-allreduce breakdown both modes, the
# engine bench (thread and process per GPU), PyTorch's small numbers, and
# every GPU check. target-h2-before = binaries of the first call (old code
# paths, same bench), target-h2-dist = this change.
export NCCL_NVLS_ENABLE=0
R=$PWD; B=$R/target-h2-before; A=$R/target-h2-dist
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  dir=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
L=$OUT/logs; mkdir -p $L
start=$(date +%s)
step() { local name=$1 t=$2; shift 2; echo "== $name $(($(date +%s)-start))s" >> $OUT/progress.txt; timeout --kill-after=10 $t "$@" > $L/$name.txt 2>&1; local rc=$?; echo "== $name rc=$rc $(($(date +%s)-start))s" >> $OUT/progress.txt; { echo "== $name rc=$rc"; grep -E 'FAIL|^small:|^step:|^engine-|passed|PASS|SKIP|skipped|^ *(allreduce|small|step)' $L/$name.txt | grep -v '^json' | tail -n 60; } >> $OUT/summary.txt; }
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np 2"
cd $A
step small-before-threads 30 $B/gpu_threads --gpus 2 --small --no-checks
step small-after-threads 30 $A/gpu_threads --gpus 2 --small --no-checks
step small-before-mpi 30 $MPI $B/gpu_mpi --small --no-checks
step small-after-mpi 30 $MPI $A/gpu_mpi --small --no-checks
step engine-before 60 $B/gpu_engine --gpus 2 --bench
step engine-after 60 $A/gpu_engine --gpus 2 --bench
step engine-mpi-after 60 $MPI $A/gpu_engine --bench
cd $R
step torch 90 torchrun --nproc_per_node=2 benches/torch-baseline/collectives.py --min-bytes 1M --max-bytes 1M
cd $A
step checks 200 env OUT=$L/checks CHECKS=1 BENCH=0 GPUS=2 STEP_TIMEOUT=45 bash run.sh
step engine-checks 120 env OUT=$L/engine BENCH=0 bash run-engine.sh
step pipeline 45 ./gpu_nccl
cd $OUT && tar czf logs.tgz logs && rm -rf logs
echo done >> $OUT/progress.txt
