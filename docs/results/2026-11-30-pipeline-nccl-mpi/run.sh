#!/usr/bin/env bash
# One device call (2 x H200): kolo-pipeline's NCCL channels, thread mode
# (gpu_nccl) and one process per GPU under mpirun (gpu_nccl_mpi, widths
# 1,1 on 2 processes and 1,1,1 on 3). Run from the lead's tree with
# gpu-dist copied to target-h1-dist.
export NCCL_NVLS_ENABLE=0
cd target-h1-dist
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  dir=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi -L > $OUT/gpus.txt 2>&1
start=$(date +%s)
step() { local name=$1 t=$2; shift 2; echo "== $name $(($(date +%s)-start))s" >> $OUT/progress.txt; timeout --kill-after=5 $t "$@" > $OUT/$name.txt 2>&1; echo "== $name rc=$? $(($(date +%s)-start))s" >> $OUT/progress.txt; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
step pipeline-threads 90 ./gpu_nccl
step pipeline-mpi-np2 100 $MPIRUN -np 2 ./gpu_nccl_mpi --widths 1,1
step pipeline-mpi-np3 80 $MPIRUN -np 3 ./gpu_nccl_mpi --widths 1,1,1
echo done >> $OUT/progress.txt
