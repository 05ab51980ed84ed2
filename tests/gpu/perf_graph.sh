#!/usr/bin/env bash
# braid perf -G on the CUDA emulation (or a GPU): the -n iterations' calls captured into a CUDA graph
# and launched -G times. Every launch reaches Braid: each rank's BRAID_INSPECT_DIR records hold
# 2 columns x (1 warm-up + 3 launches x 2 iterations) = 14 all-reduces of the size; -G without
# --device cuda, or with -c 1, is refused. Usage: perf_graph.sh BRAID BRAID_PROGRAM
set -uo pipefail
braid=$1
program=$2
dir=$(mktemp -d /tmp/braid-perf-graph-XXXXXX)
trap 'rm -rf "$dir"' EXIT
out=$(BRAID_INSPECT_DIR=$dir "$braid" run -n 2 -- "$program" perf allreduce --device cuda -b 4000 -e 4000 -n 2 -w 1 \
      -c 0 -G 3 --json "$dir/g.json" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -E "^# time|^ +4000"
echo "$out" | grep -q "3 launches of a CUDA graph of the iterations' calls" || { echo "the header does not say -G"; exit 1; }
grep -q '"graph_launches": 3' "$dir/g.json" || { echo "the JSON does not say -G"; exit 1; }
bad=0
for f in "$dir"/braid-inspect-*.jsonl; do
  k=$(grep -c '"call": "allreduce(count=1000,' "$f")
  echo "  $(basename "$f"): $k all-reduces of 1000 elements"
  [ "$k" = 14 ] || bad=1
done
[ "$(ls "$dir"/braid-inspect-*.jsonl | wc -l)" = 2 ] || { echo "not two ranks' records"; exit 1; }
[ "$bad" = 0 ] || { echo "expected 14 each"; exit 1; }
for args in "-G 2 -c 0" "-G 2 -c 1 --device cuda"; do
  # shellcheck disable=SC2086
  err=$("$program" perf allreduce $args 2>&1) && { echo "-G accepted with: $args"; exit 1; }
  echo "  refused ($args): $(echo "$err" | head -n 1)"
done
