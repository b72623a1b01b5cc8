#!/usr/bin/env bash
# Before: latency breakdown (both modes) and the engine bench, current code.
export NCCL_NVLS_ENABLE=0
cd target-h2-dist
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  dir=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
start=$(date +%s)
step() { local name=$1 t=$2; shift 2; echo "== $name $(($(date +%s)-start))s" >> $OUT/progress.txt; timeout $t "$@" > $OUT/$name.txt 2>&1; echo "== $name rc=$? $(($(date +%s)-start))s" >> $OUT/progress.txt; }
(nvidia-smi -L; which nsys ncu; ls /usr/local/cuda*/bin 2>/dev/null | head -30; nproc) > $OUT/env.txt 2>&1
step small-threads 60 ./gpu_threads --gpus 2 --small --no-checks
step small-mpi 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np 2 ./gpu_mpi --small --no-checks
step engine-bench 90 ./gpu_engine --gpus 2 --bench
echo done >> $OUT/progress.txt
