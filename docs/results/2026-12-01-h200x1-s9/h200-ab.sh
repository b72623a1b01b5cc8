#!/usr/bin/env bash
# base vs new on the host CPUs, N rounds interleaved: floor; tensor group fused/unfused;
# scoped grouped (async handle) fused; 4-byte allreduce. Rows then medians.
n=${1:-8}
args="--engine --op allreduce --tensors 1000 --min-bytes 4000K --max-bytes 4000K --iters 40 --warmup 5"
eng() { "$@" 2>/dev/null | awk '$1==4096000{print $5}'; }
lat() { "$@" --engine --op allreduce --min-bytes 4 --max-bytes 4 --iters 500 2>/dev/null | awk '$1==4{print $5}'; }
rows=$(for i in $(seq $n); do
  fl=$(./memory-floor --bytes 4000K --run 4K --iters 40 --warmup 5 | awk '$1==4096000{print $2}')
  bf=$(eng ./base-kolo-bench $args --tensor-group)
  nf=$(eng ./kolo-bench-cpu $args --tensor-group)
  bu=$(eng ./base-kolo-bench $args --tensor-group --fusion-threshold 0)
  nu=$(eng ./kolo-bench-cpu $args --tensor-group --fusion-threshold 0)
  bs=$(eng ./base-kolo-bench $args --scoped --grouped)
  ns=$(eng ./kolo-bench-cpu $args --scoped --grouped)
  bl=$(lat ./base-kolo-bench); nl=$(lat ./kolo-bench-cpu)
  echo "$fl $bf $nf $bu $nu $bs $ns $bl $nl"
done)
echo "columns: floor | tensor group fused: base new | unfused: base new | scoped grouped fused: base new | 4-byte: base new (us)"
echo "$rows"
echo "$rows" | python3 -c '
import sys, statistics as s
rows=[list(map(float,l.split())) for l in sys.stdin if l.strip()]
fl,bf,nf,bu,nu,bs,ns,bl,nl=zip(*rows); m=s.median
r=lambda a,b: m([y/x for x,y in zip(a,b)])
print("medians: floor %.0f; tensor group: base fused %.0f unfused %.0f ratio %.2fx; new fused %.0f unfused %.0f ratio %.2fx"%(m(fl),m(bf),m(bu),r(bf,bu),m(nf),m(nu),r(nf,nu)))
print("new/base (median of rounds): tensor group fused %.3f, unfused %.3f, scoped grouped fused %.3f (%.0f -> %.0f us), 4-byte %.3f (%.1f -> %.1f us)"%(r(bf,nf),r(bu,nu),r(bs,ns),m(bs),m(ns),r(bl,nl),m(bl),m(nl)))
print("fused over floor: base %.2fx new %.2fx; new rounds at 10x or more: %d of %d"%(r(fl,bf),r(fl,nf),sum(u/f>=10 for f,u in zip(nf,nu)),len(nf)))'
