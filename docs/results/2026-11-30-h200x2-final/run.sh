#!/usr/bin/env bash
# Final 2 x H200 call of session 3 (one device call): the host engine on this
# host (kolo-bench, threads backend), the GPU engine checks + bench (thread
# and process per GPU), kolo-nccl checks, pipeline NCCL checks (threads and
# mpirun), small-message breakdown, kolo-nccl bench tables, PyTorch.
export NCCL_NVLS_ENABLE=0
R=$PWD; D=$R/gpu-dist
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  dir=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
L=$OUT/logs; mkdir -p $L
nvidia-smi -L > $L/gpus.txt 2>&1; nproc >> $L/gpus.txt; command -v perf >> $L/gpus.txt 2>&1
start=$(date +%s)
step() { local name=$1 t=$2; shift 2; echo "== $name $(($(date +%s)-start))s" >> $OUT/progress.txt; timeout --kill-after=10 $t "$@" > $L/$name.txt 2>&1; local rc=$?; echo "== $name rc=$rc $(($(date +%s)-start))s" >> $OUT/progress.txt; { echo "== $name rc=$rc"; grep -E 'FAIL|^small:|^step:|^engine-|passed|PASS|SKIP|skipped|^ +[0-9]+ +[0-9]+ +f32|per step' $L/$name.txt | grep -v '^json' | tail -n 60; } >> $OUT/summary.txt; }
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np 2"
cd $D
step engine 200 env OUT=$L/engine BENCH=1 bash run-engine.sh
step pipeline 120 env OUT=$L/pipeline bash run-pipeline.sh
step checks 200 env OUT=$L/checks CHECKS=1 BENCH=0 GPUS=2 STEP_TIMEOUT=60 bash run.sh
step small-threads 40 ./gpu_threads --gpus 2 --small --no-checks
step small-mpi 40 $MPI ./gpu_mpi --small --no-checks
step host-engine-4B 60 ./kolo-bench --engine --op allreduce --tensors 1000 --grouped --min-bytes 4000 --max-bytes 4000 --iters 40
step host-engine-4KiB 90 bash -c './kolo-bench --engine --op allreduce --tensors 1000 --scoped --grouped --min-bytes 4000K --max-bytes 4000K --iters 40; ./kolo-bench --engine --op allreduce --tensors 1000 --scoped --grouped --min-bytes 4000K --max-bytes 4000K --iters 40 --fusion-threshold 0; ./kolo-bench --engine --op allreduce --min-bytes 4 --max-bytes 4 --iters 2000'
cd $R
step torch 100 torchrun --nproc_per_node=2 benches/torch-baseline/collectives.py --min-bytes 1M --max-bytes 1G
cd $D
step bench-threads 110 ./gpu_threads --gpus 2 --bench --no-checks
cd $OUT && tar czf logs.tgz logs && rm -rf logs
echo done >> $OUT/progress.txt
