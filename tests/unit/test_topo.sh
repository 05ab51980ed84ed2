#!/usr/bin/env bash
# braid topo: the JSON parses and agrees with braid info (cores, hardware threads, NUMA nodes, this
# process's CPUs), the text has its host line, taskset's mask and the launcher's ranks show in the
# binding, and an unknown option exits 2.   usage: test_topo.sh BRAID [PYTHON3]
set -uo pipefail
braid=$1
py=${2:-/usr/bin/python3}
[ -x "$py" ] || { echo "SKIP: no $py to read the JSON with"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

"$braid" info >"$tmp/info" || bad "braid info exited $?"
"$braid" topo --json >"$tmp/topo.json" || bad "braid topo --json exited $?"
"$py" - "$tmp/topo.json" "$tmp/info" <<'EOF' || fail=1
import json, re, sys
topo = json.load(open(sys.argv[1]))
info = open(sys.argv[2]).read()
bad = []
for key, kind in [("host", str), ("source", str), ("packages", list), ("numa_nodes", list), ("l3", list),
                  ("cores", int), ("pus", int), ("nics", list), ("gpus", list), ("binding", dict)]:
    if not isinstance(topo.get(key), kind):
        bad.append(f"{key} is {topo.get(key)!r}, not a {kind.__name__}")
host = re.search(r"^host: (\d+) cores, (\d+) hardware threads, (\d+) NUMA nodes", info, re.M)
if not host:
    bad.append("braid info has no host: line")
elif "hwloc yes" in info:  # without hwloc, braid info counts the affinity mask, topo the online CPUs
    cores, pus, nodes = map(int, host.groups())
    if (topo["cores"], topo["pus"], len(topo["numa_nodes"])) != (cores, pus, nodes):
        bad.append(f"topo says {topo['cores']} cores, {topo['pus']} PUs, {len(topo['numa_nodes'])} NUMA nodes; "
                   f"braid info {cores}, {pus}, {nodes}")
else:
    print("note: built without hwloc, so the counts are not compared with braid info's")
cpus = re.search(r"^this process may run on: CPUs ([0-9,-]+),", info, re.M)
binding = topo.get("binding", {})
if not cpus or binding.get("cpus") != cpus.group(1):
    bad.append(f"binding.cpus {binding.get('cpus')!r}, braid info: {cpus.group(1) if cpus else None!r}")
if not isinstance(binding.get("numa_nodes"), list) or binding.get("rank") is not None:
    bad.append(f"binding {binding!r}: numa_nodes should be a list and rank null outside a launcher")
for d in topo.get("nics", []) + topo.get("gpus", []):
    if not isinstance(d.get("numa_node"), (int, type(None))) or d.get("kind") not in ("net", "ib", "gpu"):
        bad.append(f"device {d!r}")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
EOF

"$braid" topo >"$tmp/topo.txt" || bad "braid topo exited $?"
grep -q '^host ' "$tmp/topo.txt" || bad "braid topo printed no 'host ' line: $(cat "$tmp/topo.txt")"
grep -q '^this process: CPUs ' "$tmp/topo.txt" || bad "braid topo printed no 'this process' line"

if command -v taskset >/dev/null; then
  got=$(taskset -c 0 "$braid" topo --json | "$py" -c 'import json, sys; print(json.load(sys.stdin)["binding"]["cpus"])')
  [ "$got" = 0 ] || bad "under taskset -c 0 binding.cpus is '$got', not '0'"
  taskset -c 0 "$braid" topo | grep -q '^this process: CPUs 0 on NUMA node' || bad "taskset -c 0: no 'CPUs 0 on' line"
else
  echo "note: no taskset, the binding under a mask is not checked"
fi

RANK=3 LOCAL_RANK=1 "$braid" topo --json >"$tmp/ranked.json" || bad "braid topo --json with RANK set exited $?"
"$py" -c 'import json, sys; b = json.load(open(sys.argv[1]))["binding"]; sys.exit(0 if (b["rank"], b["local_rank"]) == (3, 1) else 1)' \
  "$tmp/ranked.json" || bad "RANK=3 LOCAL_RANK=1: binding is $(cat "$tmp/ranked.json")"
RANK=3 LOCAL_RANK=1 "$braid" topo | grep -q '^this process (rank 3, local rank 1): CPUs ' || bad "RANK=3: no ranked line"

"$braid" run -n 2 -- "$braid" topo >"$tmp/run.txt" 2>&1 || bad "braid run -n 2 braid topo exited $?"
for r in 0 1; do
  grep -q "^this process (rank $r, local rank $r): CPUs " "$tmp/run.txt" || bad "braid run: rank $r printed no binding line: $(cat "$tmp/run.txt")"
done

"$braid" topo --no-such-option 2>"$tmp/err" >/dev/null
rc=$?
[ "$rc" = 2 ] || bad "an unknown option exited $rc, not 2"
[ -s "$tmp/err" ] || bad "an unknown option printed nothing on stderr"

[ "$fail" = 0 ] && echo "braid topo agrees with braid info; text, taskset, ranks and bad options behave"
exit "$fail"
