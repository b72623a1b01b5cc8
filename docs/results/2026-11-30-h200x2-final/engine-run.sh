#!/usr/bin/env bash
# Engine bench without a timeline (thread and process per GPU) and PyTorch's
# 1,000 separate all_reduce calls, same call.
export NCCL_NVLS_ENABLE=0
R=$PWD; D=$R/gpu-dist
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  dir=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np 2"
cd $D
for i in 1 2; do
  timeout 120 ./gpu_engine --gpus 2 --bench > $OUT/engine-threads-$i.txt 2>&1; echo "threads-$i rc=$?" >> $OUT/progress.txt
  timeout 120 $MPI ./gpu_engine --bench > $OUT/engine-mpi-$i.txt 2>&1; echo "mpi-$i rc=$?" >> $OUT/progress.txt
done
timeout 60 ./kolo-bench --engine --op allreduce --min-bytes 4 --max-bytes 4 --iters 3000 > $OUT/host-4B.txt 2>&1
cd $R
timeout 100 torchrun --nproc_per_node=2 benches/torch-baseline/collectives.py --min-bytes 1M --max-bytes 1M > $OUT/torch.txt 2>&1; echo "torch rc=$?" >> $OUT/progress.txt
grep -h -E "^ +4 +1 |^engine-|passed|FAIL|^step:|^small:" $OUT/*.txt > $OUT/summary.txt
