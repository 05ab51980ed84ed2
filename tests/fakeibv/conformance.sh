#!/usr/bin/env bash
# Real verbs programs that no one here wrote, unmodified, over the emulation: Debian's
# ibv_rc_pingpong (ibverbs-utils: SEND/RECV, completion channels) and perftest's ib_write_bw and
# ib_write_lat (RDMA WRITE; the latency test spins on the last byte the peer writes), ib_write_bw
# --odp (on-demand paging) and ib_read_bw, each as a server and a client process on this machine. Every run must succeed, and
# each process must end holding no verbs object (FAKEIBV_REPORT). Exit 77 (skip) when the programs
# are not installed.
#   tests/fakeibv/conformance.sh FAKEIBV_BUILD_DIR
set -uo pipefail
lib=$1
for p in ibv_rc_pingpong ib_write_bw ib_write_lat ib_read_bw; do
  command -v "$p" >/dev/null || { echo "SKIP: $p is not installed (apt-get install ibverbs-utils perftest)"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$lib FAKEIBV_DIR=$work/state FAKEIBV_REPORT=$work/report
fail=0
# Ports below the kernel's ephemeral range (32768 up), where the connections of tests running
# beside this one take theirs; a server that still finds its port taken is retried on the next.
port=$((20000 + RANDOM % 10000))
# run NAME SERVER-ARGS... -- CLIENT-ARGS...: both ends, bounded; prints the client's last lines.
run() {
  local name=$1; shift
  local server=() client=()
  while [ "$1" != -- ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  local rc=1 src=1 try
  for try in 1 2 3; do
    port=$((port + 1))
    : >"$work/report"
    timeout 60 "${server[@]}" -p "$port" >"$work/server.log" 2>&1 &
    local spid=$!
    rc=1
    for _ in $(seq 50); do  # the server listens within a moment; the client retries until it does
      sleep 0.1
      timeout 60 "${client[@]}" -p "$port" localhost >"$work/client.log" 2>&1 && { rc=0; break; }
      grep -q "Couldn't connect\|Unable to Connect\|connect to" "$work/client.log" || break
      kill -0 "$spid" 2>/dev/null || break  # the server is gone (its port was taken)
    done
    wait "$spid"; src=$?
    grep -q "Couldn't listen to port" "$work/server.log" || break
  done
  if [ "$rc" != 0 ] || [ "$src" != 0 ]; then
    echo "FAIL $name: client exit $rc, server exit $src"; cat "$work/client.log" "$work/server.log"; fail=1; return
  fi
  local leaks
  leaks=$(grep -v "live ctx=0 pd=0 mr=0 cq=0 qp=0 srq=0 channel=0 ah=0 fd=0" "$work/report" || true)
  if [ "$(wc -l <"$work/report")" -ne 2 ] || [ -n "$leaks" ]; then
    echo "FAIL $name: what the processes held at exit:"; cat "$work/report"; fail=1; return
  fi
  echo "ok   $name: $(grep -E '^ *[0-9]+ +[0-9]+ ' "$work/client.log" | tail -1 | tr -s ' ')$(grep -E 'bytes in|iters in' "$work/client.log" | tail -1)"
}
run rc_pingpong ibv_rc_pingpong -d fib0 -n 200 -- ibv_rc_pingpong -d fib0 -n 200
run rc_pingpong_events_64k ibv_rc_pingpong -d fib0 -e -s 65536 -n 100 -- ibv_rc_pingpong -d fib0 -e -s 65536 -n 100
FAKEIBV_DEVICES="roce0:link=eth,mtu=1024" run rc_pingpong_roce_v2 \
  ibv_rc_pingpong -d roce0 -g 1 -n 100 -- ibv_rc_pingpong -d roce0 -g 1 -n 100
run ib_write_bw ib_write_bw -d fib0 -s 1048576 -n 200 -- ib_write_bw -d fib0 -s 1048576 -n 200
# On-demand paging (perftest's --odp reads odp_caps, then registers its buffer with
# IBV_ACCESS_ON_DEMAND); a device configured without it must refuse that registration.
run ib_write_bw_odp ib_write_bw -d fib0 --odp -s 1048576 -n 200 -- ib_write_bw -d fib0 --odp -s 1048576 -n 200
port=$((port + 1))
FAKEIBV_DEVICES="fib0:odp=none" timeout 20 ib_write_bw -d fib0 --odp -p "$port" >/dev/null 2>&1 &
sleep 0.3
if FAKEIBV_DEVICES="fib0:odp=none" timeout 20 ib_write_bw -d fib0 --odp -p "$port" localhost >"$work/client.log" 2>&1 ||
   ! grep -q "failed to create mr" "$work/client.log"; then
  echo "FAIL ib_write_bw_odp_refused: a device without ODP took an on-demand registration"; cat "$work/client.log"; fail=1
else
  echo "ok   ib_write_bw_odp_refused: $(grep -m1 'failed to create mr' "$work/client.log")"
fi
wait
run ib_write_bw_all_sizes ib_write_bw -d fib0 -a -n 20 -- ib_write_bw -d fib0 -a -n 20
run ib_write_lat ib_write_lat -d fib0 -n 500 -- ib_write_lat -d fib0 -n 500
run ib_read_bw ib_read_bw -d fib0 -s 65536 -n 200 -- ib_read_bw -d fib0 -s 65536 -n 200
exit $fail
