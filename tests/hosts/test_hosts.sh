#!/usr/bin/env bash
# Runs across test hosts (tools/testhosts: network + UTS + mount namespaces on one machine, each
# with its own hostname and /dev/shm, joined by a bridge). Each case starts `braid run` on every
# host with --nnodes/--node-rank/--master-addr, as a user does across machines:
#   1. 2 hosts x 2 ranks: every collective, every type and op, in place and not, checked element by
#      element by braid perf -c 1; shm inside a host and tcp across, as the header says
#   2. 3 hosts x 1 rank: all-reduce and all-gather, checked; 3 hosts x 2 ranks: all-reduce (the
#      tuner's hierarchical one, and forced), all-gather and reduce-scatter, checked
#   3. all ranks of one host killed: braid run on the other host exits non-zero within 10 s, and
#      its ranks' errors name a rank of the killed host
#   4. torchrun across 2 hosts starting a Braid program (where torch is installed); Open MPI's mpirun
#      across 2 hosts (where it is installed): a clear error without MASTER_ADDR, exact with it
#   5. a host that vanishes (its link set down, nothing closed): the survivors fail within
#      BRAID_TIMEOUT naming the silent ranks and their host, and the knob
#   6. interfaces: each host has a second interface whose route is a blackhole. By default tcp
#      takes the one toward the rendezvous host; BRAID_SOCKET_IFNAME naming no interface fails at
#      once naming the ones there are; naming the blackholed one fails within BRAID_TIMEOUT, saying
#      which address could not be reached and which variable to check
#   7. ib across hosts over the verbs emulation (tests/fakeibv, which works across test hosts):
#      2 hosts x 2 ranks, every collective exact with shm inside a host and ib across; then a host
#      without an ib device: the pairs across agree on tcp, on every rank, and stay exact
#   7b. braid perf --floor on 2 hosts x 2 with the link capped: the link's rate measured within
#      0.6x-1.2x of the cap, every cell's busbw within 1.1 of the floor it sets
#   8. braid doctor: healthy on 3 x 1 and 2 x 2 (exit 0, no finding); each injected fault named with
#      its host or link and nothing else: one link capped, one host's links capped, an MTU mismatch,
#      a 1 MiB /dev/shm, memlock lowered where ib is used, an ib port DOWN, a blackholed interface
#      and a BRAID_SOCKET_IFNAME matching nothing; every link capped alike, found only against the
#      healthy run's JSON (--baseline) as system-wide
#   9. 128 ranks on 32 hosts x 4: every collective exact; each rank connected only its host's ranks
#      and its algorithms' peers at creation (perf's header and braid info say so); send/recv
#      between ranks half the job apart, all-to-all and the communicator split 8 ways (rank % 8)
#      exact; under ulimit -n 64 the job runs and the all-to-all fails on every rank with the
#      numbers; a rank killed on one host is named by the ranks of host 1 within 10 s, and every
#      launcher fails; braid doctor with one host's link capped names that host (one rank pair
#      per two hosts)
# Usage: test_hosts.sh BRAID TESTHOSTS [FAKEIBV_LIB [SCALE_CHECK]]. Exit 77 (skip) with the reason where namespaces cannot be
# made (not root, no ip/unshare/nsenter, a kernel without veth or bridges). Every test host is
# removed at the end, also when a case fails.
set -uo pipefail
braid=$1
testhosts=$2
fakeibv=${3:-}
scale_check=${4:-}  # tests/hosts/scale_check.c: the collectives, peers reached on first use, a split, checked
status_job=${5:-}   # tests/multiproc/status_job.cc: all-reduces in a loop, for braid status
port=29611
export BRAID_SECRET=braid-testhosts-$$-secret  # the same on every host
# The cases below are about tcp across hosts, except the ib one, which turns ib back on: meson
# test puts the verbs emulation on LD_LIBRARY_PATH (a dependency of this test), where Braid's
# default BRAID_IBVERBS_LIB would find it.
export BRAID_IB_DISABLE=1
fail=0
passed=0

cleanup() { "$testhosts" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap "exit 143" TERM INT  # (the EXIT trap then removes the hosts)

if [ "$(id -u)" != 0 ]; then echo "skipped: test hosts need root (network namespaces)"; exit 77; fi
for tool in ip unshare nsenter tc; do
  command -v "$tool" >/dev/null || { echo "skipped: '$tool' is missing (apt-get install iproute2 util-linux)"; exit 77; }
done
# The whole run holds the test hosts' lock: a benchmark or another run started meanwhile is refused
# rather than tearing these hosts down (and this run waits up to 120 s for one already going).
[ -n "${TESTHOSTS_SESSION:-}" ] || exec "$testhosts" session --wait 120 "$0" "$@"

# Starts `braid run` on hosts h1..hN in the background, each bounded by LIMIT s, as across
# machines (--nnodes, --node-rank, --master-addr h1); their PIDs in `pids`, logs in $work/hK.log.
# HOST_ENV_hK (NAME=VALUE ...) adds to host K's environment only; HOST_WRAP_hK (a command and its
# arguments) runs host K's `braid run` under it (prlimit, setpriv). Every host's ranks run unpinned
# (--bind-to none): the test hosts share this machine's cores, and each host's launcher, knowing only
# its own ranks, would pin its first rank to the same core as every other host's. 3 hosts x 1 then
# measured three processes on one core while the other idled, and the doctor's link figures
# scattered by 5x from run to run (0.6 to 6 GB/s; unpinned: within 1.6x).
start_on_hosts() {
  local hosts=$1 ranks=$2 limit=$3 k extra wrap
  shift 3
  pids=()
  for k in $(seq 1 "$hosts"); do
    extra=HOST_ENV_h$k
    wrap=HOST_WRAP_h$k
    # shellcheck disable=SC2086
    timeout "$limit" env ${!extra:-} "$testhosts" exec "h$k" ${!wrap:-} "$braid" run --nnodes "$hosts" --node-rank $((k - 1)) \
      --master-addr "$("$testhosts" addr h1)" --master-port "$port" -n "$ranks" --bind-to none -- "$@" >"$work/h$k.log" 2>&1 &
    pids+=($!)
  done
  port=$((port + 2))  # MASTER_PORT and the launcher's store on the next one
}

# start_on_hosts, then waits for all of them; returns the number that exited non-zero.
# The launchers that exited non-zero, "hK=STATUS ...", in `failed_hosts`.
run_on_hosts() {
  start_on_hosts "$@"
  local bad=0 k st
  failed_hosts=""
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}"
    st=$?
    [ "$st" = 0 ] || { bad=$((bad + 1)); failed_hosts+=" h$((k + 1))=$st"; }
  done
  return "$bad"
}

# HOSTS_CASES=PATTERN (a shell pattern matched against a case's function) runs only those cases.
# Some need an earlier one: the 128-rank cases (*_32x4) the hosts scale_32x4 makes, and
# doctor_everything the baseline doctor_healthy writes ('*32x4', 'doctor_*' run them together).
check() {  # NAME CONDITION...
  local name=$1
  shift
  # shellcheck disable=SC2053
  [[ $1 == ${HOSTS_CASES:-*} ]] || return 0
  if "$@"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    for f in "$work"/h*.log; do echo "--- $f"; tail -n 15 "$f"; done
    fail=$((fail + 1))
  fi
}

work=$(mktemp -d /tmp/braid-hosts-XXXXXX)
if ! "$testhosts" up 3 --shm-size 512M >"$work/up.log" 2>&1; then
  echo "skipped: the test hosts could not be made here: $(tail -n 1 "$work/up.log")"
  exit 77
fi

opts=(-b 8 -e 1M -f 16 -n 2 -w 1 -c 1)
two_by_two() {
  local c
  for c in "allreduce -d all -o all" "allgather -d all" "reducescatter -d all -o all" "broadcast -d all -r 3" \
           "reduce -o all -r 2" "alltoall -d all" "sendrecv" "barrier"; do
    # shellcheck disable=SC2086
    run_on_hosts 2 2 120 "$braid" perf $c "${opts[@]}" || { echo "  $c failed"; return 1; }
    grep -q "4 ranks on 2 host(s)" "$work/h1.log" || { echo "  $c: not 4 ranks on 2 hosts"; return 1; }
    grep -q "rank 2 on braid-h2: shm x1 tcp x2" "$work/h1.log" || { echo "  $c: transports"; return 1; }
    grep -q "Out of bounds values : 0 OK" "$work/h1.log" || { echo "  $c: wrong elements"; return 1; }
  done
}
check "2 hosts x 2 ranks: every collective exact, shm within a host and tcp across" two_by_two

three_by_one() {
  run_on_hosts 3 1 120 "$braid" perf allreduce -d all "${opts[@]}" && grep -q "Out of bounds values : 0 OK" "$work/h1.log" &&
    run_on_hosts 3 1 120 "$braid" perf allgather "${opts[@]}" && grep -q "3 ranks on 3 host(s)" "$work/h1.log"
}
check "3 hosts x 1 rank: all-reduce and all-gather exact" three_by_one

# 3 hosts x 2 ranks: all-reduce by the tuner (hierarchical from 16 KiB here) and forced hier, all-
# gather and reduce-scatter on the host-ordered rings, every element checked.
three_by_two() {
  local c
  for c in "allreduce -d all -o all" "allgather -d all" "reducescatter -o all"; do
    # shellcheck disable=SC2086
    run_on_hosts 3 2 180 "$braid" perf $c "${opts[@]}" || { echo "  $c failed"; return 1; }
    grep -q "6 ranks on 3 host(s)" "$work/h1.log" && grep -q "Out of bounds values : 0 OK" "$work/h1.log" ||
      { echo "  $c: not exact on 6 ranks"; return 1; }
  done
  BRAID_ALGO=hier run_on_hosts 3 2 180 "$braid" perf allreduce -d all -o avg "${opts[@]}" &&
    grep -q "Out of bounds values : 0 OK" "$work/h1.log" || { echo "  forced hier failed"; return 1; }
}
check "3 hosts x 2 ranks: all-reduce (hier), all-gather and reduce-scatter exact" three_by_two

killed_host() {
  # Long enough that the kill lands mid-run: 20,000 checked all-reduces.
  start_on_hosts 2 2 60 "$braid" perf allreduce -b 64K -e 64K -n 20000 -w 1 -c 1
  sleep 3
  local t0 t1 status
  t0=$(date +%s%N)
  ip netns pids braid-h2 | xargs -r kill -9
  wait "${pids[0]}"
  status=$?
  t1=$(date +%s%N)
  wait "${pids[1]}"
  local ms=$(((t1 - t0) / 1000000))
  echo "  braid run on h1 exited with $status, $ms ms after the kill"
  # An error line of a rank of h1 that names a rank of h2 with its host (not braid perf's header).
  local named
  named=$(grep -E "rank [01].*rank [23] \(tcp, host braid-h2\)" "$work/h1.log" | head -n 1)
  echo "  ${named:0:200}"
  [ -n "$named" ] || { echo "  no error on h1 names a rank of braid-h2; h1's log:"; sed 's/^/    /' "$work/h1.log" | tail -n 30; }
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ "$ms" -lt 10000 ] && [ -n "$named" ]
}
check "all ranks of one host killed: the other host fails within 10 s naming them" killed_host

vanished_host() {
  BRAID_TIMEOUT=6 start_on_hosts 2 2 60 "$braid" perf allreduce -b 64K -e 64K -n 200000 -w 1 -c 0
  sleep 3
  local t0 t1 status
  t0=$(date +%s%N)
  ip -n braid-h2 link set eth0 down
  wait "${pids[0]}"
  status=$?
  t1=$(date +%s%N)
  ip netns pids braid-h2 | xargs -r kill -9
  wait "${pids[1]}"
  ip -n braid-h2 link set eth0 up
  local ms=$(((t1 - t0) / 1000000))
  echo "  braid run on h1 exited with $status, $ms ms after h2's link went down (BRAID_TIMEOUT=6)"
  local named
  named=$(grep -E "failed on rank [01]|timed out" "$work/h1.log" | grep -E "rank [23].*host braid-h2" | grep "BRAID_TIMEOUT" | head -n 1)
  echo "  ${named:0:300}"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ "$ms" -lt 16000 ] && [ -n "$named" ]
}
check "a host that vanishes: the other fails within BRAID_TIMEOUT naming its ranks and host" vanished_host

# torchrun across hosts (its static rendezvous: --nnodes, --node_rank, --master_addr), starting a
# Braid program on each (--no_python): Braid finds its ranks from torchrun's variables.
torchrun_across() {
  local k pids=() torchrun=/usr/bin/torchrun
  for k in 1 2; do
    timeout 120 "$testhosts" exec "h$k" "$torchrun" --nnodes 2 --node_rank $((k - 1)) --nproc_per_node 2 \
      --master_addr "$("$testhosts" addr h1)" --master_port "$port" --redirects 1 --tee 1 --no_python \
      "$braid" perf allreduce -d all "${opts[@]}" >"$work/h$k.log" 2>&1 &
    pids+=($!)
  done
  port=$((port + 2))
  local bad=0 p
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  [ "$bad" = 0 ] && grep -q "4 ranks on 2 host(s)" "$work/h1.log" && grep -q "Out of bounds values : 0 OK" "$work/h1.log"
}
if [ -x /usr/bin/torchrun ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  check "torchrun across 2 hosts x 2 ranks: a Braid program exact" torchrun_across
else
  echo "skip torchrun across hosts: /usr/bin/torchrun with torch is not installed here"
fi

# Open MPI's mpirun across 2 hosts x 2 ranks, started inside h1 and reaching h2 through its rsh
# agent (tools/testhosts mpirun, tests/hosts/mpi_agent.sh). Without MASTER_ADDR every rank fails at once saying what to
# export; with it (mpirun -x) every element is exact, shm within a host and tcp across.
mpirun_across() {
  local t0 ms st=0
  local mpirun=(timeout 60 "$testhosts" mpirun --mca btl tcp,self --mca btl_tcp_if_include eth0 -np 4
    --host 10.213.0.1:2,10.213.0.2:2 -x BRAID_IB_DISABLE -x BRAID_SECRET)
  t0=$(date +%s%N)
  "${mpirun[@]}" "$braid" perf allreduce -b 8 -e 8 -c 1 >"$work/h1.log" 2>&1 && { echo "  no MASTER_ADDR: did not fail"; st=1; }
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "  no MASTER_ADDR: failed after $ms ms: $(grep -o 'Open MPI started rank.*' "$work/h1.log" | head -n 1 | cut -c1-160)"
  grep -q "MASTER_ADDR is not set.*mpirun -x MASTER_ADDR=" "$work/h1.log" && [ "$ms" -lt 15000 ] || st=1
  if [ "$st" = 0 ]; then
    "${mpirun[@]}" -x MASTER_ADDR="$("$testhosts" addr h1)" -x MASTER_PORT="$port" -x BRAID_DEBUG=INFO -x BRAID_DEBUG_SUBSYS=INIT \
      "$braid" perf allreduce -d all "${opts[@]}" >"$work/h1.log" 2>&1 || { echo "  with MASTER_ADDR: failed"; st=1; }
    port=$((port + 1))
    grep -q "Out of bounds values : 0 OK" "$work/h1.log" && grep -q "\[0\] INIT INFO peer 1: shm" "$work/h1.log" &&
      grep -q "\[0\] INIT INFO peer 2: tcp" "$work/h1.log" && grep -q "^braid-h2:.*\[3\] INIT INFO peer 2: shm" "$work/h1.log" ||
      { echo "  with MASTER_ADDR: not exact, or not shm within a host and tcp across"; st=1; }
  fi
  return "$st"
}
if command -v mpirun.openmpi >/dev/null; then
  check "Open MPI's mpirun across 2 hosts x 2 ranks: a clear error without MASTER_ADDR, exact with it" mpirun_across
else
  echo "skip mpirun across hosts: Open MPI is not installed here (apt-get install openmpi-bin)"
fi

interfaces() {
  local k t0 ms
  for k in 1 2; do "$testhosts" blackhole "h$k" bh0 || return 1; done
  BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=NET run_on_hosts 2 1 60 "$braid" perf allreduce -b 1K -e 1M -f 32 -c 1 ||
    { echo "  the default interface did not work"; return 1; }
  grep -q "listening on 10.213.0.1:" "$work/h1.log" && grep -q "listening on 10.213.0.2:" "$work/h2.log" ||
    { echo "  tcp did not listen on eth0"; return 1; }
  echo "  default: $(grep -o 'tcp: .*listening on [0-9.:]*' "$work/h2.log" | head -n 1)"
  t0=$(date +%s%N)
  BRAID_SOCKET_IFNAME=nosuch0 run_on_hosts 2 1 60 "$braid" perf allreduce -b 1K -e 1K -c 1 &&
    { echo "  BRAID_SOCKET_IFNAME=nosuch0 did not fail"; return 1; }
  ms=$((($(date +%s%N) - t0) / 1000000))
  grep -q "BRAID_SOCKET_IFNAME='nosuch0' matches no interface" "$work/h2.log" && grep -q "bh0=10.214.0.2" "$work/h2.log" &&
    grep -q "eth0=10.213.0.2" "$work/h2.log" || { echo "  the error does not name the interfaces there are"; return 1; }
  echo "  nosuch0: failed after $ms ms: $(grep -o "BRAID_SOCKET_IFNAME='nosuch0'.*" "$work/h2.log" | head -n 1 | cut -c1-160)"
  [ "$ms" -lt 15000 ] || { echo "  took too long"; return 1; }
  t0=$(date +%s%N)
  BRAID_SOCKET_IFNAME==bh0 BRAID_TIMEOUT=5 run_on_hosts 2 1 60 "$braid" perf allreduce -b 1K -e 1K -c 1 &&
    { echo "  BRAID_SOCKET_IFNAME==bh0 did not fail"; return 1; }
  ms=$((($(date +%s%N) - t0) / 1000000))
  local named
  # (The set-up tree's connection to rank 0 meets the blackhole first.)
  named=$(grep -hoE "could not connect to rank 0 (\(its parent in the set-up tree\) )?at 10.214.0.1:[0-9]*.*BRAID_SOCKET_IFNAME" "$work"/h*.log | head -n 1)
  echo "  =bh0: failed after $ms ms: ${named:0:200}"
  [ -n "$named" ] && [ "$ms" -lt 20000 ]
}
check "a blackholed second interface: not taken by default; BRAID_SOCKET_IFNAME errors name it" interfaces

ib_across() {
  local c
  for c in "allreduce -d all -o all" "allgather -d all" "reducescatter -d all -o all" "broadcast -d all -r 1" \
           "reduce -o all -r 3" "alltoall" "sendrecv" "barrier"; do
    # shellcheck disable=SC2086
    BRAID_IB_DISABLE=0 BRAID_IBVERBS_LIB=$fakeibv run_on_hosts 2 2 120 "$braid" perf $c "${opts[@]}" ||
      { echo "  $c failed"; return 1; }
    grep -q "rank 2 on braid-h2: ib x2 shm x1" "$work/h1.log" || { echo "  $c: transports"; return 1; }
    grep -q "Out of bounds values : 0 OK" "$work/h1.log" || { echo "  $c: wrong elements"; return 1; }
  done
  # h2 has no ib device: every pair across uses tcp, and every rank says why.
  BRAID_IB_DISABLE=0 BRAID_IBVERBS_LIB=$fakeibv BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=INIT HOST_ENV_h2="FAKEIBV_DEVICES=" \
    run_on_hosts 2 2 120 "$braid" perf allreduce -d all "${opts[@]}" || { echo "  the mixed job failed"; return 1; }
  grep -q "rank 2 on braid-h2: shm x1 tcp x2" "$work/h1.log" && grep -q "Out of bounds values : 0 OK" "$work/h1.log" ||
    { echo "  mixed: not tcp across, or not exact"; return 1; }
  local k why
  for k in 1 2; do
    why=$(grep -o "ib skipped: unusable on rank [0-9]*: no InfiniBand device found" "$work/h$k.log" | head -n 1)
    [ -n "$why" ] || { echo "  h$k's ranks do not say why ib was skipped"; return 1; }
  done
  echo "  mixed: $why"
}
if [ -n "$fakeibv" ] && [ -e "$fakeibv" ]; then
  check "ib across 2 hosts x 2 ranks (verbs emulation): exact, shm inside and ib across; a host without ib gets tcp" ib_across
else
  echo "skip ib across hosts: the verbs emulation was not given (test_hosts.sh BRAID TESTHOSTS FAKEIBV_LIB)"
fi

# braid doctor (issue: each injected fault named, with the right host, link or rank, and nothing
# else). doctor HOSTS RANKS EXPECT_STATUS SUBJECT...: runs it, checks the exit status of every host's
# braid run (host 1's, with rank 0, is the verdict; the others exit 0), that the findings are
# exactly SUBJECT... (in any order), and that --json parses.
doctor() {
  local hosts=$1 ranks=$2 want=$3 p bad=0 got expected
  shift 3
  # shellcheck disable=SC2086
  start_on_hosts "$hosts" "$ranks" "${DOCTOR_LIMIT:-60}" "$braid" doctor --bytes "${DOCTOR_BYTES:-2M}" --json "$work/doctor.json" ${DOCTOR_ARGS:-}
  local k=0 st
  for p in "${pids[@]}"; do
    wait "$p"
    st=$?
    k=$((k + 1))
    local expect=0
    [ "$k" = 1 ] && expect=$want
    [ "$st" = "$expect" ] ||
      { echo "  h$k's braid run exited with $st, not $expect: $(grep -v '^ ' "$work/h$k.log" | tail -n 2 | cut -c1-300)"; bad=1; }
  done
  got=$(grep -o '^  \[[0-9]*\] [^:]*' "$work/h1.log" | sed 's/^  \[[0-9]*\] //' | sort)
  expected=$(printf '%s\n' "$@" | sed '/^$/d' | sort)
  [ "$got" = "$expected" ] || { echo "  findings: [${got//$'\n'/] [}], expected: [${expected//$'\n'/] [}]"; bad=1; }
  grep -A1 '^  \[[0-9]*\]' "$work/h1.log" | cut -c1-240 | sed 's/^/  /'
  /usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$work/doctor.json" 2>/dev/null ||
    { echo "  --json did not parse"; bad=1; }
  return "$bad"
}
# (the interfaces case left its blackholed bh0 on h1 and h2)
for k in 1 2; do ip -n "braid-h$k" link del bh0 2>/dev/null; done
doctor_healthy() {
  # (test hosts share this machine's kernel: the report says so, and holds their links to 25%)
  doctor 3 1 0 && grep -q "verdict: healthy" "$work/h1.log" &&
    grep -q "braid-h2–braid-h3 tcp: .*both hosts on one kernel: slow below 25% of the fastest" "$work/h1.log" &&
    cp "$work/doctor.json" "$work/baseline.json" && doctor 2 2 0 && grep -q "^ *ring all-reduce .* exact" "$work/h1.log"
}
check "doctor, healthy on 3 hosts x 1 and 2 x 2: exit 0, no finding" doctor_healthy
doctor_link() {
  "$testhosts" link h1 rate 200mbit to h2 && doctor 3 1 1 "link braid-h1–braid-h2"
  local st=$?
  "$testhosts" link h1 clear; "$testhosts" link h2 clear
  return "$st"
}
check "doctor, one link capped (tbf between h1 and h2 only): names that link" doctor_link

# Asks braid status (from h1) about the job started last on the hosts, at ADDR, until every rank
# answers (up to 60 s), then SAMPLES times more; prints the last report; returns non-zero unless
# every one of those exited 0 with "all progressing" within LIMIT_MS each.
status_samples() {
  local addr=$1 samples=$2 limit_ms=$3 out i t0 took rc
  for i in $(seq 1 200); do
    out=$("$testhosts" exec h1 "$braid" status --addr "$addr" 2>&1)
    rc=$?
    [ "$rc" != 2 ] && ! echo "$out" | grep -q "does not answer\|never joined" && break
    sleep 0.3
  done
  for i in $(seq 1 "$samples"); do
    t0=$(date +%s%N)
    out=$("$testhosts" exec h1 "$braid" status --addr "$addr" 2>&1)
    rc=$? took=$((($(date +%s%N) - t0) / 1000000))
    echo "$out" | grep -q "^verdict: all progressing" && [ "$rc" = 0 ] && [ "$took" -lt "$limit_ms" ] ||
      { echo "  sample $i (exit $rc, $took ms):"; echo "$out" | tail -n 4 | cut -c1-200 | sed 's/^/    /'; return 1; }
  done
  echo "  $(echo "$out" | tail -n 1 | cut -c1-200) ($took ms)"
}
# braid status across test hosts: 2 hosts x 2, the link between them capped at 100 Mbit/s, the
# job's 1 MiB all-reduces crawling across it: reported progressing (three samples), not stalled.
status_capped() {
  [ -n "$status_job" ] || { echo "  no braid-status-job given"; return 1; }
  "$testhosts" link h1 rate 100mbit to h2
  start_on_hosts 2 2 120 "$status_job" --count 262144 --calls 100000000
  status_samples "$("$testhosts" addr h1):$((port - 1))" 3 5000  # MASTER_PORT + 1: start_on_hosts moved port on by 2
  local st=$?
  "$testhosts" link h1 clear; "$testhosts" link h2 clear
  kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
  return "$st"
}
check "braid status, 2 hosts x 2 with the link between them capped: progressing, not stalled" status_capped

# braid perf --floor across 2 hosts x 2 with the link between them capped at 400 Mbit/s (0.05 GB/s):
# the header's link rate is that of the cap (within 0.6x-1.2x: tcp over tbf), and every cell's busbw
# stays within 1.1 of the floor it sets, the largest share at least 0.3 (the link is the limit).
floor_capped() {
  "$testhosts" link h1 rate 400mbit to h2 || return 1
  run_on_hosts 2 2 120 "$braid" perf allreduce -b 1M -e 4M -f 4 -n 4 -w 1 -c 0 --floor --json "$work/floor.json"
  local st=$?
  "$testhosts" link h1 clear; "$testhosts" link h2 clear
  [ "$st" = 0 ] || { echo "  braid perf --floor failed"; return 1; }
  grep "^# floor" "$work/h1.log" | cut -c1-200 | sed 's/^/  /'
  /usr/bin/python3 - "$work/floor.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
link = d["floor"]["link_gbps"]
shares = [r[c]["floor_share"] for r in d["rows"] for c in ("out_of_place", "in_place")]
print(f"  link {link:.4f} GB/s from {d['floor']['link_pairs']} pair(s); busbw over the floor {min(shares):.2f} to {max(shares):.2f}")
sys.exit(0 if 0.03 <= link <= 0.06 and 0 <= min(shares) and max(shares) <= 1.1 and max(shares) >= 0.3 else 1)
PY
}
check "braid perf --floor, 2 hosts x 2 with the link capped: the link's rate measured, busbw held to it" floor_capped
doctor_host() {
  "$testhosts" link h3 rate 200mbit && doctor 3 1 1 "host braid-h3"
  local st=$?
  "$testhosts" link h3 clear
  return "$st"
}
check "doctor, every link of one host capped: names that host" doctor_host
doctor_everything() {
  # Every host capped alike: nothing stands out within the run; against the healthy run's JSON,
  # everything is slow.
  local k st
  for k in 1 2 3; do "$testhosts" link "h$k" rate 200mbit || return 1; done
  doctor 3 1 0 && DOCTOR_ARGS="--baseline $work/baseline.json" doctor 3 1 1 "system-wide"
  st=$?
  for k in 1 2 3; do "$testhosts" link "h$k" clear; done
  return "$st"
}
check "doctor, every link capped alike: no finding alone, system-wide against a healthy run's --json (--baseline)" doctor_everything
doctor_full_ratio() {
  # The production ratio (--slow 0.5, with the re-measurement) on measured links: h3's links capped
  # at 200 Mbit/s, the link h1-h2 at 80 (40% of them). Between test hosts, which share a kernel,
  # the doctor holds links to half the ratio by default (25%: no finding); --one-kernel full holds
  # them to the whole of it, as between machines, and must name that link.
  local k st
  "$testhosts" link h3 rate 200mbit && "$testhosts" link h1 rate 80mbit to h2 || return 1
  doctor 3 1 0 && DOCTOR_ARGS="--one-kernel full" doctor 3 1 1 "link braid-h1–braid-h2" &&
    grep -q "measured again" "$work/h1.log"
  st=$?
  for k in 1 2 3; do "$testhosts" link "h$k" clear; done
  return "$st"
}
check "doctor, a link at 40% of the others: no finding at the one-kernel ratio, named at the whole --slow 0.5 (--one-kernel full)" doctor_full_ratio
doctor_mtu() {
  "$testhosts" mtu h3 1400 && doctor 3 1 1 "MTU on host braid-h3"
  local st=$?
  "$testhosts" mtu h3 1500
  return "$st"
}
check "doctor, MTU 1400 on one host, 1500 on the others: names that host" doctor_mtu
doctor_shm() {
  "$testhosts" exec h2 mount -o remount,size=1M /dev/shm && doctor 2 2 1 "/dev/shm on host braid-h2"
  local st=$?
  "$testhosts" exec h2 mount -o remount,size=512M /dev/shm
  return "$st"
}
check "doctor, a host whose /dev/shm is a 1 MiB tmpfs: names that host" doctor_shm
doctor_ib() {
  # memlock lowered with prlimit, without CAP_IPC_LOCK (as a user runs), on h2; then h2's port DOWN.
  BRAID_IB_DISABLE=0 BRAID_IBVERBS_LIB=$fakeibv HOST_WRAP_h2="setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock prlimit --memlock=65536:65536" \
    doctor 2 2 1 "ib on host braid-h2" && grep -q "memlock limit (ulimit -l) is 64 KiB" "$work/h1.log" &&
    grep -q "fix: ulimit -l unlimited" "$work/h1.log" || return 1
  BRAID_IB_DISABLE=0 BRAID_IBVERBS_LIB=$fakeibv HOST_ENV_h2="FAKEIBV_DEVICES=fib0:state=down" \
    doctor 2 2 1 "ib on host braid-h2" && grep -q "no ACTIVE port to use: fib0:1 (DOWN)" "$work/h1.log" &&
    grep -q "0–2: tcp because" "$work/h1.log"
}
if [ -n "$fakeibv" ] && [ -e "$fakeibv" ] && command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
  check "doctor, ib (verbs emulation): memlock lowered on one host, a port DOWN on one host: names that host" doctor_ib
else
  echo "skip doctor's ib cases: no verbs emulation given, or setpriv/prlimit missing"
fi
doctor_interfaces() {
  local k
  for k in 1 2; do "$testhosts" blackhole "h$k" bh1 || return 1; done
  doctor 2 1 1 "interface bh1 on hosts braid-h1, braid-h2" &&
    BRAID_SOCKET_IFNAME=nosuch0 doctor 2 1 1 "interface bh1 on hosts braid-h1, braid-h2" \
      "BRAID_SOCKET_IFNAME on hosts braid-h1, braid-h2" && grep -q "fix: BRAID_SOCKET_IFNAME=eth0" "$work/h1.log"
  local st=$?
  for k in 1 2; do ip -n "braid-h$k" link del bh1 2>/dev/null; done
  return "$st"
}
check "doctor, a second interface routed to a blackhole, and a BRAID_SOCKET_IFNAME matching nothing: names both" doctor_interfaces

# The lock: from outside this run's session (descriptor 9 closed, as an unrelated process has it),
# `down` and `up` are refused naming the holder, and the hosts stay; inside it `link` works.
outsiders_refused() {
  local cmd out
  for cmd in down "up 2"; do
    # shellcheck disable=SC2086
    out=$( (exec 9>&-; unset TESTHOSTS_SESSION; "$testhosts" $cmd) 2>&1 ) &&
      { echo "  '$cmd' from outside the session was not refused"; return 1; }
    grep -q "the test hosts are in use by PID [0-9]* (.*test_hosts.sh" <<<"$out" || { echo "  '$cmd' refused as: $out"; return 1; }
  done
  [ -e /run/netns/braid-h3 ] && "$testhosts" addr h3 >/dev/null || { echo "  the hosts went"; return 1; }
  "$testhosts" link h1 rate 1gbit && "$testhosts" link h1 clear
}
check "the test hosts' lock: down and up from outside the session refused, naming it; the hosts stay" outsiders_refused

# 128 ranks on 32 test hosts x 4 (tcp between hosts, shm within): every collective exact; then one
# rank killed on host 17: h1's ranks fail within 10 s naming a rank of braid-h17, and every launcher
# exits non-zero. (Last: it remakes the test hosts as 32.)
scale_32x4() {
  "$testhosts" up 32 --shm-size 64M >"$work/up32.log" 2>&1 || { echo "  up 32: $(tail -n 1 "$work/up32.log")"; return 1; }
  local c t0
  for c in "allreduce -d float32 -o sum" "allreduce -d int32 -o max" "allgather" "reducescatter" "broadcast -r 77" \
           "reduce -r 126" "alltoall" "sendrecv" "barrier"; do
    t0=$(date +%s%N)
    # shellcheck disable=SC2086
    run_on_hosts 32 4 240 "$braid" perf $c -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 || { echo "  $c failed"; return 1; }
    grep -q "128 ranks on 32 host(s)" "$work/h1.log" && grep -q "Out of bounds values : 0 OK" "$work/h1.log" ||
      { echo "  $c: not exact on 128 ranks"; return 1; }
    echo "  $c: $((($(date +%s%N) - t0) / 1000000)) ms for the launch, set-up and the sweep"
  done
  # Each rank connected its host's ranks and its algorithms' peers at creation, the rest left for
  # first use, as perf's header and braid info say.
  grep -qE "rank 5 on braid-h2: shm x3 tcp x[0-9]+ \(tcp x[0-9]+ on first use\)" "$work/h1.log" ||
    { echo "  perf's header does not show peers left for first use: $(grep -m1 'rank 5 on' "$work/h1.log")"; return 1; }
  run_on_hosts 32 4 120 "$braid" info && grep -q "connections of the job's 128 ranks at creation" "$work/h1.log" &&
    grep -qE "rank 127 on braid-h32: shm x3 tcp x[0-9]+ \(tcp x[0-9]+ on first use\)" "$work/h1.log" ||
    { echo "  braid info under the launcher: $(tail -n 2 "$work/h1.log")"; return 1; }
  echo "  $(grep -m1 'rank 5 on braid-h2' "$work/h1.log")"
  if [ -n "$scale_check" ]; then
    run_on_hosts 32 4 120 "$scale_check" &&
      grep -q "128 ranks: every collective exact, send/recv half the job apart exact, all-to-all exact; split 8 ways, every part exact" "$work/h1.log" ||
      { echo "  scale check: $(grep -m1 -h 'scale-check' "$work"/h*.log)"; return 1; }
    echo "  send/recv between ranks half the job apart (connected on first use, both ways at once), all-to-all, a split 8 ways: exact"
    # Every rank's open files capped at 64 (soft and hard), rank 0's too: the rendezvous store,
    # which holds a connection from each of the 128 ranks, runs in host 1's launcher (not capped),
    # not in rank 0. The job starts and runs every collective; the all-to-all, which would connect
    # every pair, fails on every rank within seconds with the numbers.
    t0=$(date +%s%N)
    run_on_hosts 32 4 120 prlimit --nofile=64:64 "$scale_check" --alltoall-refused
    local status=$? took=$((($(date +%s%N) - t0) / 1000000))
    [ "$status" = 0 ] && grep -q "all-to-all refused: .*open files" "$work/h1.log" ||
      { echo "  under ulimit -n 64: launchers non-zero:${failed_hosts:- none}; $(grep -m1 -h 'scale-check' "$work"/h*.log)"
        grep -h -v "without saying goodbye" "$work"/h*.log | head -n 20; return 1; }
    echo "  under ulimit -n 64 (every rank): set-up and every collective ran; $(grep -m1 -o 'rank 0 held [0-9]* descriptors after set-up' "$work/h1.log"); $(grep -m1 -o 'all-to-all refused: .\{0,160\}' "$work/h1.log")...; the whole run took $took ms"
  fi
}
check "128 ranks on 32 hosts x 4: every collective exact, peers beyond the algorithms' connected on first use, a split 8 ways exact, all-to-all refused under ulimit -n 64 on every rank, rank 0 too" scale_32x4

# braid status on 128 ranks (32 hosts x 4) running 1 MiB all-reduces: every rank answers, each of
# three reports within 2 s.
status_32x4() {
  [ -n "$status_job" ] || { echo "  no braid-status-job given"; return 1; }
  start_on_hosts 32 4 180 "$status_job" --count 262144 --calls 100000000
  status_samples "$("$testhosts" addr h1):$((port - 1))" 3 2000  # MASTER_PORT + 1
  local st=$?
  kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
  return "$st"
}
check "braid status on 128 ranks (32 hosts x 4): every rank answers, within 2 s" status_32x4

# braid doctor on the 32 hosts x 4 with host 17's link capped: one rank pair per two hosts (and
# each host's first two ranks), one pair at a time as the hosts share this machine's cores; the
# capped host is named and nothing else.
doctor_32x4() {
  "$testhosts" link h17 rate 200mbit || return 1
  local t0
  t0=$(date +%s%N)
  DOCTOR_LIMIT=150 DOCTOR_BYTES=1M doctor 32 4 1 "host braid-h17" || { "$testhosts" link h17 clear; return 1; }
  "$testhosts" link h17 clear
  grep -q "one rank pair per two hosts" "$work/h1.log" || { echo "  not measured by host pairs"; return 1; }
  echo "  $((($(date +%s%N) - t0) / 1000000)) ms for 128 ranks: $(grep -o '[0-9]* round(s) of disjoint pairs' "$work/h1.log")"
}
check "doctor on 32 hosts x 4, one host's link capped: names that host, from one rank pair per two hosts" doctor_32x4

# A rank killed on host 17 of the 32: h1's ranks fail within 10 s naming a rank of braid-h17, and
# every launcher exits non-zero.
kill_32x4() {
  local t0
  start_on_hosts 32 4 120 "$braid" perf allreduce -b 64K -e 64K -n 100000 -w 1 -c 1
  sleep 8
  local victim="" p t1 status bad=0 named
  for p in $(ip netns pids braid-h17); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$braid perf" && { victim=$p; break; }
  done
  [ -n "$victim" ] || { echo "  no rank found on braid-h17"; return 1; }
  t0=$(date +%s%N)
  kill -9 "$victim"
  wait "${pids[0]}"
  status=$?
  t1=$(date +%s%N)
  for p in "${pids[@]:1}"; do wait "$p" || bad=$((bad + 1)); done
  named=$(grep -E "rank [0-3].*rank (6[4-7]) \(tcp, host braid-h17\)" "$work/h1.log" | head -n 1)
  echo "  h1 exited with $status $(((t1 - t0) / 1000000)) ms after rank pid $victim on braid-h17 was killed; $bad of 31 other launchers non-zero"
  echo "  ${named:0:200}"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ $(((t1 - t0) / 1000000)) -lt 10000 ] && [ -n "$named" ] && [ "$bad" = 31 ]
}
check "128 ranks on 32 hosts x 4: a rank killed on one host is named within 10 s, every launcher fails" kill_32x4

rm -rf "$work"
echo "$passed passed, $fail failed"
[ $((passed + fail)) -gt 0 ] || { echo "HOSTS_CASES='${HOSTS_CASES:-}' matches no case"; exit 1; }
[ "$fail" = 0 ]
