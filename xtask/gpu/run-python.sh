#!/usr/bin/env bash
# The `kolo` Python package on a GPU host: installs gpu-dist's wheel (and
# pytest, shipped beside it) for the host's Python and its PyTorch, runs
# python/tests with CUDA tensors (KOLO_TEST_CUDA=1: torch checks and both
# examples on 1 GPU and on every GPU), and with BENCH=1 the comparison
# with torch.distributed on NCCL (benches/python/torch_vs_kolo.py) at 1
# process and at every GPU. Logs in ${OUT:-./gpu-out}.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 KOLO_LOG_LEVEL=${KOLO_LOG_LEVEL:-error} UCX_TLS=${UCX_TLS:-sm,self}
lib="$here/pylib"
rm -rf "$lib"
# --no-deps: numpy and torch are the host's; pytest's own wheels are here.
python3 -m pip install -q --no-index --no-deps --target "$lib" "$here"/wheels/*.whl \
  > "$out/python-install.log" 2>&1 || { cat "$out/python-install.log"; exit 1; }
export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import kolo, torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "gpus", torch.cuda.device_count())'
status=0
(cd "$here/python/tests" && KOLO_TEST_CUDA=1 python3 -m pytest -q -p no:cacheprovider . ) 2>&1 | tee "$out/python-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ "${BENCH:-0}" = 1 ]; then
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  for n in $(printf '%s\n' 1 "$gpus" | sort -un); do
    python3 -m kolo.run -n "$n" --master-port 0 python3 "$here/benches/python/torch_vs_kolo.py" \
      2>&1 | grep -v 'UCX  ERROR' | tee "$out/python-bench-np$n.log" || status=1
  done
fi
exit $status
