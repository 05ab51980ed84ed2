#!/usr/bin/env bash
# braid perf -c 0 checks nothing: every #wrong column and the footer say N/A (as nccl-tests does),
# and the JSON's "wrong" is null, never 0. Usage: perf_unchecked.sh BRAID JSON
set -uo pipefail
braid=$1
json=$2
out=$("$braid" run -n 2 -- "$braid" perf allreduce -b 8 -e 1K -f 4 -n 2 -w 1 -c 0 --json "$json") || exit 1
echo "$out"
rows=$(echo "$out" | grep -c '^ *[0-9]')
na=$(echo "$out" | grep '^ *[0-9]' | grep -c ' N/A .* N/A$')
echo "rows: $rows, with N/A in both #wrong columns: $na"
[ "$rows" = 4 ] && [ "$na" = 4 ] &&
  echo "$out" | grep -q '^# Out of bounds values : N/A (not checked: -c 0)' &&
  grep -q '"wrong": null,' "$json" && ! grep -q '"wrong": [0-9]' "$json"
