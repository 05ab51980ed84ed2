#!/usr/bin/env bash
# braid doctor on one host (the runs across test hosts, with injected faults, are in tests/hosts/):
#   1. 8 ranks, healthy: exit 0 on every rank, "verdict: healthy", under 30 s; --json has every pair
#      measured and both rings exact; --svg is an SVG with a cell per pair
#   2. a setting that differs on one rank: exit 1, that rank and variable named, nothing else
#   3. BRAID_SOCKET_IFNAME matching nothing: exit 1, the finding names it and the fix; the doctor ran
#   4. bad arguments, and no launcher: exit 2 with a message
#   5. segments a job killed during set-up left in /dev/shm: named, with the pids, and removed
# Usage: test_doctor.sh BRAID PYTHON
set -uo pipefail
braid=$1
python=$2
export BRAID_IB_DISABLE=1  # (meson test puts the verbs emulation on LD_LIBRARY_PATH)
work=$(mktemp -d /tmp/braid-doctor-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
check() {  # NAME CONDITION...
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; sed 's/^/    /' "$work/out.log" | tail -n 40; fail=1; fi
}
findings() { grep -o '^  \[[0-9]*\] [^:]*' "$work/out.log" | sed 's/^  \[[0-9]*\] //' | tr '\n' '|'; }

# The 30 s bound is the plain build's; a sanitizer build's runs take up to 4 times longer (as
# tools/check scales the timeouts).
limit=30000
if ldd "$braid" 2>/dev/null | grep -Eq 'libasan|libtsan'; then
  limit=120000
  echo "(a sanitizer build: the healthy run may take $((limit / 1000)) s here; the plain run holds it to 30 s)"
fi
healthy() {
  local t0 ms st
  t0=$(date +%s%N)
  timeout 60 "$braid" run -n 8 -- "$braid" doctor --json "$work/d.json" --svg "$work/d.svg" >"$work/out.log" 2>&1
  st=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "  8 ranks: exit $st after $ms ms; findings: $(findings)"
  [ "$st" = 0 ] && grep -q "^verdict: healthy" "$work/out.log" && [ "$ms" -lt "$limit" ] || return 1
  [ "$python" = none ] && { echo "  (no python3: the JSON is not read)"; return 0; }
  "$python" - "$work/d.json" "$work/d.svg" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["nranks"] == 8 and d["verdict"] == "healthy" and d["findings"] == [], d["findings"]
assert len(d["pairs"]) == 28 and all(p["gbps"] > 0 and p["lat_us"] > 0 and p["transport"] == "shm" for p in d["pairs"]), d["pairs"]
assert len(d["rings"]) == 2 and all(r["wrong"] == 0 and r["busbw_gbps"] > 0 for r in d["rings"]), d["rings"]
assert len(d["ranks"]) == 8 and all(len(r["transports"]) == 8 for r in d["ranks"])
svg = open(sys.argv[2]).read()
assert svg.startswith("<svg") and svg.count("<rect") == 64, svg[:200]
PY
}
check "8 ranks on one host, healthy: exit 0 within 30 s, every pair in --json, --svg" healthy

one_differs() {
  # Rank 2 alone runs with BRAID_DEBUG_SUBSYS set (a harmless setting, which must still be the same everywhere).
  timeout 60 "$braid" run -n 4 -- sh -c 'if [ "$RANK" = 2 ]; then export BRAID_DEBUG_SUBSYS=NET; fi; exec "$0" doctor' "$braid" \
    >"$work/out.log" 2>&1
  local st=$?
  echo "  exit $st; findings: $(findings)"
  [ "$st" = 1 ] && [ "$(findings)" = "BRAID_DEBUG_SUBSYS on rank 2 on $(hostname)|" ] &&
    grep -q "rank 2 set NET, the other 3 leave it unset" "$work/out.log"
}
check "a BRAID_* setting on one rank only: that rank and variable named, nothing else" one_differs

bad_ifname() {
  BRAID_SOCKET_IFNAME=nosuch0 timeout 60 "$braid" run -n 2 -- "$braid" doctor >"$work/out.log" 2>&1
  local st=$?
  echo "  exit $st; findings: $(findings)"
  [ "$st" = 1 ] && [ "$(findings)" = "BRAID_SOCKET_IFNAME on host $(hostname)|" ] &&
    grep -q "BRAID_SOCKET_IFNAME='nosuch0' matches no interface" "$work/out.log" && grep -q "^4. Findings" "$work/out.log"
}
check "BRAID_SOCKET_IFNAME matching nothing: named with the fix, and the doctor still ran" bad_ifname

cannot_run() {
  "$braid" doctor --bytes x >"$work/out.log" 2>&1
  [ $? = 2 ] && grep -q "bad argument '--bytes'" "$work/out.log" || return 1
  env -u RANK -u WORLD_SIZE "$braid" doctor >"$work/out.log" 2>&1
  [ $? = 2 ] && grep -q "RANK and WORLD_SIZE are not set" "$work/out.log"
}
check "bad arguments, or no launcher: exit 2 with the reason" cannot_run

# Segments of a job killed during set-up (kill -9 as soon as its first segment appears in /dev/shm,
# before its ranks could unlink them): braid doctor names the host and the dead pids, removes them,
# and leaves nothing of that job behind.
dead_job_leftovers() {
  local try left=""
  for try in 1 2 3 4 5; do
    "$braid" run -n 8 -- "$braid" perf allreduce -b 8 -e 8 -n 1 -w 0 >/dev/null 2>&1 &
    local launcher=$! i
    for i in $(seq 1 6000); do  # up to ~30 s: a sanitizer build starts its ranks slowly
      compgen -G "/dev/shm/braid-pid*" >/dev/null && break
      kill -0 "$launcher" 2>/dev/null || break
      sleep 0.005
    done
    kill -9 "$launcher" 2>/dev/null
    wait "$launcher" 2>/dev/null
    sleep 0.3  # the ranks die with the launcher (PR_SET_PDEATHSIG)
    left=$(cd /dev/shm && ls -d braid-pid* 2>/dev/null | tr '\n' ' ')
    [ -n "$left" ] && break
  done
  echo "  left by the killed job (try $try): ${left:-nothing}"
  [ -n "$left" ] || return 1
  timeout 60 "$braid" run -n 2 -- "$braid" doctor >"$work/out.log" 2>&1
  local st=$? rest
  rest=$(cd /dev/shm && ls -d braid-pid* 2>/dev/null | tr '\n' ' ')
  echo "  doctor: exit $st; findings: $(findings); left after it: ${rest:-nothing}"
  [ "$st" = 1 ] && [ "$(findings)" = "/dev/shm on host $(hostname)|" ] && grep -q "left when they died during set-up" "$work/out.log" &&
    grep -q "the doctor removed them" "$work/out.log" && [ -z "$rest" ]
}
check "segments a killed job left in /dev/shm: named with the pids and removed by braid doctor" dead_job_leftovers
exit "$fail"
