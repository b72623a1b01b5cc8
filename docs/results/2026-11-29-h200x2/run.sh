#!/usr/bin/env bash
# One device call: kolo-nccl benches (2 GPUs, both modes), PyTorch baseline,
# engine checks + bench, pipeline NCCL checks, kolo-nccl checks.
export NCCL_NVLS_ENABLE=0
cd gpu-dist
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  dir=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi -L > $OUT/gpus.txt 2>&1
start=$(date +%s)
step() { local name=$1 t=$2; shift 2; echo "== $name $(($(date +%s)-start))s" >> $OUT/progress.txt; timeout $t "$@" > $OUT/$name.txt 2>&1; echo "== $name rc=$? $(($(date +%s)-start))s" >> $OUT/progress.txt; }
step bench-threads 110 ./gpu_threads --gpus 2 --bench --no-checks
step bench-mpi 110 mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np 2 ./gpu_mpi --bench --no-checks
step engine 100 env OUT=$OUT/engine BENCH=1 bash run-engine.sh
step pipeline 60 ./gpu_nccl
cd ..
step torch 90 torchrun --nproc_per_node=2 benches/torch-baseline/collectives.py --min-bytes 1M --max-bytes 1G
cd gpu-dist
step checks 100 env OUT=$OUT/checks CHECKS=1 BENCH=0 GPUS=2 STEP_TIMEOUT=45 bash run.sh
echo done >> $OUT/progress.txt
