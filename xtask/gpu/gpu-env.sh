# Sourced by the GPU scripts in gpu-dist/ (run.sh, run-engine.sh,
# run-pipeline.sh; `cargo xtask test-gpu` copies this folder, xtask/gpu/,
# there): what they share. After sourcing, the working directory is
# gpu-dist/ and
#   OUT       the log folder (${OUT:-./gpu-out}), created;
#   gpus      the number of GPUs nvidia-smi lists (0 without a driver);
#   MPIRUN    an array: mpirun with the flags kolo's GPU runs use
#             (root allowed, oversubscription, no binding) and the
#             variables the ranks need forwarded.
# NVLink SHARP (NVLS, NVLink multicast) is off: the baselines kolo's
# numbers are compared with were measured without it, and on shared GPU
# hosts it must stay off. kolo-nccl finds libnccl.so.2 (loaded at run time) inside a pip wheel — PyTorch's
# NCCL keeps it in site-packages, off the loader's path — when the loader
# does not know one and KOLO_NCCL_LIBRARY does not name one.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[1]:-$0}")" || exit 1
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0

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
gpus=${gpus:-0}
# shellcheck disable=SC2206 # MPIRUN may carry its own arguments
MPIRUN=(${MPIRUN:-mpirun} --allow-run-as-root --oversubscribe --bind-to none
  -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
[ -n "${KOLO_NCCL_LIBRARY:-}" ] && MPIRUN+=(-x KOLO_NCCL_LIBRARY)
