#!/usr/bin/env bash
# The "same run" comparison of kolo's threads backend with OpenMPI's
# MPI_Allreduce on this machine: f32 sum, 2 ranks, 8 B .. 64 MiB, the same
# iterations and the same timing (warm-up, a barrier, then timed calls back
# to back, the input restored untimed before each; median over iterations
# of the slowest rank). Prints both tables, then busbw kolo / MPI at 16 MiB
# and 64 MiB.
#
#   scripts/bench-threads-vs-mpi.sh            # ITERS=20 WARMUP=5 RANKS=2
#   ITERS=50 scripts/bench-threads-vs-mpi.sh
#
# Installs openmpi-bin and libopenmpi-dev (apt-get) when missing.
set -euo pipefail

ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
RANKS=${RANKS:-2}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-64M}

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

missing=()
for pkg in openmpi-bin libopenmpi-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench-threads-vs-mpi: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

echo "bench-threads-vs-mpi: building kolo-bench (release) and the MPI baseline" >&2
(cd "$root" && cargo build --release -q -p kolo-bench)
mkdir -p "$target/mpi-baseline"
mpicc -O2 -o "$target/mpi-baseline/allreduce" "$root/benches/mpi-baseline/allreduce.c"

"$target/release/kolo-bench" --backend threads --ranks "$RANKS" --op allreduce --dtype f32 \
  --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --iters "$ITERS" --warmup "$WARMUP" --quiet \
  | tee "$out/kolo.txt"
echo
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np "$RANKS" --allow-run-as-root --oversubscribe \
  "$target/mpi-baseline/allreduce" "$MIN_BYTES" "$MAX_BYTES" 2 "$ITERS" "$WARMUP" \
  | tee "$out/mpi.txt"
echo

# busbw is column 7 of a data row; column 1 is the size in bytes.
busbw() { awk -v size="$2" '$1 == size { print $7 }' "$1"; }
echo "# busbw ratio kolo threads / MPI_Allreduce, $RANKS ranks, f32 sum"
for size in 16777216 67108864; do
  kolo=$(busbw "$out/kolo.txt" "$size")
  mpi=$(busbw "$out/mpi.txt" "$size")
  if [ -z "$kolo" ] || [ -z "$mpi" ]; then
    echo "# $size B: not in both sweeps (MAX_BYTES=$MAX_BYTES)"
  else
    awk -v s="$size" -v k="$kolo" -v m="$mpi" \
      'BEGIN { printf "# %9d B: kolo %8.3f GB/s  mpi %8.3f GB/s  ratio %6.2fx\n", s, k, m, (m > 0 ? k / m : 0) }'
  fi
done
