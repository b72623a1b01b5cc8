#!/usr/bin/env bash
# kolo over MPI against plain MPI, in the same run: builds kolo-bench with
# the `mpi` feature (release) and runs `mpirun -np 2` and `-np 4` sweeps of
# `kolo-bench --backend mpi --compare`. Each process is one rank; every
# iteration of every size runs kolo's MpiComm allreduce and a plain
# MPI_Allreduce (in place, identical buffers, the same timing: warm-up, a
# barrier, timed calls back to back; median over iterations of the slowest
# rank), alternating which goes first so that a changing machine load hits
# both alike; then the whole sweep again through the kolo engine (one
# tensor per step, not interleaved: the engine owns the communicator). Prints
# the tables, then per process count:
#   - kolo direct vs plain MPI_Allreduce at 1 MiB and above (+ is slower),
#   - the engine's extra cost per operation at 8 B and 1 MiB (engine time
#     minus direct time).
#
#   scripts/bench-mpi.sh                      # ITERS=20 WARMUP=5 NPS="2 4"
#   ITERS=50 MAX_BYTES=16M scripts/bench-mpi.sh
#   OPS=all scripts/bench-mpi.sh              # every op (direct vs engine)
#
# The mpirun flags are those of kolo-mpi's launcher (docs/mpi.md): root
# allowed, oversubscription allowed, no process binding, and the shared
# memory transport without its cross-memory-attach single copy (ptrace is
# often forbidden in containers; SINGLE_COPY=cma to use it where allowed —
# kolo and plain MPI share the setting, so the comparison stays fair).
# OpenMPI yields the CPU while waiting when there are more processes than
# cores (YIELD=0|1 to force it either way).
set -euo pipefail

ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
NPS=${NPS:-"2 4"}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-64M}
OPS=${OPS:-allreduce}
DTYPE=${DTYPE:-f32}
SINGLE_COPY=${SINGLE_COPY:-none}
YIELD=${YIELD:-auto}

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  echo "bench-mpi: mpirun and mpicc are needed: run scripts/install-deps.sh" >&2
  exit 1
fi

echo "bench-mpi: building kolo-bench --features mpi (release)" >&2
(cd "$root" && cargo build --release -q -p kolo-bench --features mpi)
bench="$target/release/kolo-bench"

cores=$(nproc)
mpirun --version | head -n 1
echo "# $(uname -n): $cores cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

for np in $NPS; do
  yield=$YIELD
  if [ "$yield" = auto ]; then
    yield=$([ "$np" -gt "$cores" ] && echo 1 || echo 0)
  fi
  echo
  echo "## mpirun -np $np (mpi_yield_when_idle=$yield)"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism="$SINGLE_COPY" \
    OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
    OMPI_MCA_mpi_yield_when_idle="$yield" \
    mpirun -np "$np" --oversubscribe --bind-to none \
    "$bench" --backend mpi --compare --op "$OPS" --dtype "$DTYPE" \
    --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --iters "$ITERS" --warmup "$WARMUP" --quiet \
    | tee "$out/np$np.txt"
done

# Comparison rows: op, size, MPI, direct, vs MPI %, engine, engine-direct.
echo
echo "# summary ($DTYPE sum; median of the slowest rank; same run per process count)"
for np in $NPS; do
  awk -v np="$np" '
    /^# same-run comparison/ { table = 1; next }
    table && $1 == "allreduce" {
      if ($2 >= 1048576 && $5 != "-")
        printf "# np %d  %9d B: kolo direct %10.2f us, plain MPI_Allreduce %10.2f us: %s%%\n", np, $2, $4, $3, $5
      if (($2 == 8 || $2 == 1048576) && $7 != "-")
        printf "# np %d  %9d B: engine %10.2f us - direct %10.2f us = %s us per operation\n", np, $2, $6, $4, $7
    }' "$out/np$np.txt"
done
