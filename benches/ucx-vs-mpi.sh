#!/usr/bin/env bash
# kolo-ucx's allreduce against plain MPI_Allreduce, shared memory, in one
# run: rounds alternate which goes first; each runs 8 B, then 1-64 MiB
# (x4), f32 sum, 20 timed iterations after 5 warm-up. The same comparison
# as `cargo xtask bench ucx-vs-mpi`, for a host without cargo (the GPU
# host): build there-ready binaries here, copy the folder, run it there.
#
#   cargo build --release -p kolo-bench --features mpi,ucx -p kolo-run
#   mpicc -O2 -o target/release/mpi-allreduce benches/mpi-baseline/allreduce.c
#   bash benches/ucx-vs-mpi.sh target/release 2 5     # BIN NP ROUNDS
#
# Prints every row ("ucx|mpi ROUND size count type redop time algbw
# busbw wrong") and per size the median over rounds of ucx / MPI (time at
# 8 B, busbw above). Needs python3 for the medians.
#
# TLS=tcp: both over TCP (loopback) instead: UCX_TLS=tcp,self against
# OpenMPI's ob1 with the self,tcp BTLs.
#
# OLD=DIR: also kolo-bench and kolo-run from DIR (an earlier build), as
# rows "old" beside "ucx" in every round, and their ratio in the summary.
#
# ENGINE=1: the engine instead (`kolo-bench --engine`, one tensor per step,
# 8 B to 16 MiB x8, 30 iterations) over kolo-ucx and over kolo-mpi under mpirun; the
# summary compares times at every size.
set -euo pipefail
bin=$1 np=${2:-2} rounds=${3:-5}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
engine=${ENGINE:-0}
old=${OLD:-}
tls=${TLS:-sm}
case "$tls" in
  sm) ucx_tls=sm,self mpi_btl=self,vader ;;
  tcp) ucx_tls=tcp,self mpi_btl=self,tcp; export OMPI_MCA_pml=ob1 ;;
  *) echo "TLS=$tls: sm or tcp" >&2; exit 2 ;;
esac
bench_args=(--op allreduce --iters 20 --warmup 5 --quiet)
[ "$engine" = 1 ] && bench_args=(--op allreduce --iters 30 --warmup 5 --quiet)
ucx() {
  local sizes=(--min-bytes "${1:-}" --max-bytes "${2:-}" --factor 4) from=${3:-$bin}
  [ "$engine" = 1 ] && sizes=(--engine --min-bytes 8 --max-bytes 16M --factor 8)
  UCX_TLS=$ucx_tls "$from/kolo-run" -n "$np" --master-port 0 "$from/kolo-bench" --backend ucx \
    "${sizes[@]}" "${bench_args[@]}" 2>/dev/null | grep -v '^#'
}
old() { ucx "${1:-}" "${2:-}" "$old"; }
mpi() {
  export OMPI_MCA_btl=$mpi_btl OMPI_MCA_btl_vader_single_copy_mechanism=cma
  if [ "$engine" = 1 ]; then
    mpirun -np "$np" --oversubscribe --bind-to none "$bin/kolo-bench" --backend mpi --engine \
      --min-bytes 8 --max-bytes 16M --factor 8 "${bench_args[@]}" 2>/dev/null | grep -v '^#'
  else
    mpirun -np "$np" --oversubscribe --bind-to none "$bin/mpi-allreduce" "$1" "$2" 4 20 5 2>/dev/null |
      grep -v '^#'
  fi
}
side() {
  if [ "$engine" = 1 ]; then $1; else { $1 8 8; $1 1M 64M; }; fi | sed "s/^/$1 $2 /"
}
rows=$(for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then side ucx "$r"; side mpi "$r"; else side mpi "$r"; side ucx "$r"; fi
  if [ -n "$old" ]; then side old "$r"; fi
done)
echo "$rows"
echo "$rows" | python3 -c '
import statistics, sys
rows = {}
for line in sys.stdin:
    p = line.split()
    if len(p) >= 9 and p[2].isdigit():
        rows.setdefault((p[0], int(p[2])), {})[int(p[1])] = (float(p[6]), float(p[8]))
engine = "'"$engine"'" == "1"
base = "kolo-mpi, both through the engine" if engine else "MPI_Allreduce"
print(f"kolo-ucx / {base}, '"$np"' processes, '"$tls"', medians of the rounds")
for size in sorted({s for _, s in rows}):
    u, m = rows.get(("ucx", size), {}), rows.get(("mpi", size), {})
    both = [r for r in u if r in m]
    col, what = (0, "time") if size == 8 or engine else (1, "busbw")
    ratio = statistics.median(u[r][col] / m[r][col] for r in both)
    mu = statistics.median(u[r][col] for r in both)
    mm = statistics.median(m[r][col] for r in both)
    line = f"{size:>9} B: ucx {mu:9.3f} MPI {mm:9.3f} {what} ratio {ratio:5.2f}x"
    o = rows.get(("old", size), {})
    olds = [r for r in o if r in m]
    if olds:
        ro = statistics.median(o[r][col] / m[r][col] for r in olds)
        line += f"; old {statistics.median(o[r][col] for r in olds):9.3f} ratio {ro:5.2f}x"
    print(line)
'
