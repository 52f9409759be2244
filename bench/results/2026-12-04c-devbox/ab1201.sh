#!/bin/bash
# The dev-VM A/B behind ../cpu_attention-devbox-zen4-2026-12-04-ab1201.log: the CPU attention
# bench of the 2026-12-01 tree (13f0e0b, a git worktree) and of this tree, three alternating
# runs of GQA and MLA 8x32K. Run from the repository root.
set -e
WT=/tmp/old1201
git worktree add -q $WT 13f0e0b
for i in 1 2 3; do
  for t in old1201 main; do
    d=$PWD; [ $t = old1201 ] && d=$WT
    (cd $d && PYTHONPATH=$d timeout 300 python -m writescope.bench.cpu_attention --shapes gqa-32/4/128,mla-16/1/576 --sizes 8x32K --reps 5 --torch-reps 0 --no-variants --no-gpu-layout 2>&1 | grep -E "^(gqa|mla)|DRAM" | sed "s/^/$t $i: /")
  done
done
git worktree remove --force $WT
