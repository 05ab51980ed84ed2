#!/usr/bin/env python3
"""braid tune against the formulas the plans are held to (docs/architecture/algorithms.md).

Usage: test_tune.py BRAID  (the braid program). Each check runs `braid tune --json` with the
algorithm forced by BRAID_ALGO where the tuner's own choice is not the point, and holds the counted
figures to what the plans must do: the ring all-reduce's critical path 2(n-1) messages, the
hierarchical all-reduce's 2(L-1) + 2(H-1) and its 2(H-1)/H of the data out of each host, the tree
across hosts 2(floor(log2 H) + floor(log2 L)); the model's time to the tuner's ring formula; a
world of 16,384 ranks in seconds, with plans over the message limit refused, not built.
"""
import json
import math
import os
import subprocess
import sys
import time

BRAID = sys.argv[1]
failures = []


def tune(*args, algo=None):
    env = dict(os.environ)
    env.pop("BRAID_ALGO", None)
    if algo:
        env["BRAID_ALGO"] = algo
    out = subprocess.run([BRAID, "tune", "--json", *args], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"braid tune {' '.join(args)} failed ({out.returncode}): {out.stderr}")
    doc = json.loads(out.stdout)
    assert doc["schema"] == "braid.tune/1", doc["schema"]
    return doc


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got}, want {want}")


def only_row(doc):
    assert len(doc["rows"]) == 1, doc["rows"]
    return doc["rows"][0]


H, L = 8, 4
n = H * L
row = only_row(tune("--hosts", str(H), "--per-host", str(L), "--collectives", "allreduce", "--sizes", "1M", algo="ring"))
check("ring all-reduce: algo", row["algo"], "ring")
check("ring all-reduce: critical path 2(n-1)", row["path"], 2 * (n - 1))
check("ring all-reduce: messages a rank 2(n-1) per channel", row["most_rank_messages"], 2 * (n - 1) * row["channels"])
# The tuner's ring formula with tcp across hosts (15 us, 2000 B/us) and its reduction (6000 B/us).
S = row["bytes"]
want_us = 2 * (n - 1) * 15 + 2 * (n - 1) / n * S / 2000 + (n - 1) / n * S / 6000
if abs(row["model_us"] - want_us) > 1e-3 * want_us:
    failures.append(f"ring all-reduce: model {row['model_us']} us, the formula gives {want_us:.3f}")

row = only_row(tune("--hosts", str(H), "--per-host", str(L), "--collectives", "allreduce", "--sizes", "1M", algo="hier"))
check("hier all-reduce: algo", row["algo"], "hier")
check("hier all-reduce: critical path 2(L-1) + 2(H-1)", row["path"], 2 * (L - 1) + 2 * (H - 1))
check("hier all-reduce: bytes out of a host 2(H-1)/H S", row["most_host_out_bytes"] * H, 2 * (H - 1) * row["bytes"])

t0 = time.monotonic()
big = tune("--hosts", "2048", "--per-host", "8", "--collectives", "allreduce,broadcast", "--sizes", "8,1M", algo="tree")
elapsed = time.monotonic() - t0
check("16,384 ranks: ranks", big["ranks"], 16384)
for r in big["rows"]:
    check(f"16,384 ranks: {r['collective']} {r['bytes']} B built", r["built"], True)
    depth = int(math.log2(2048)) + int(math.log2(8))
    check(f"16,384 ranks: {r['collective']} {r['bytes']} B tree path", r["path"], 2 * depth if r["collective"] == "allreduce" else depth)
if elapsed > 60:
    failures.append(f"16,384 ranks took {elapsed:.1f} s")

# The ring skips its empty blocks: an 8-byte all-reduce (2 elements, 2 blocks) is 2(n-1) hops of
# each block in each phase, a send and a receive each; 1 MiB fills every block, n^2 messages.
n = 16384
ring = only_row(tune("--hosts", "2048", "--per-host", "8", "--collectives", "allreduce", "--sizes", "8", algo="ring"))
check("16,384-rank ring, 8 B: built", ring["built"], True)
check("16,384-rank ring, 8 B: messages", ring["messages"], 2 * 2 * 2 * (n - 1))
check("16,384-rank ring, 8 B: path 2(n-1)", ring["path"], 2 * (n - 1))
ring = only_row(tune("--hosts", "2048", "--per-host", "8", "--collectives", "allreduce", "--sizes", "1M", algo="ring"))
check("16,384-rank ring, 1 MiB, over the limit: built", ring["built"], False)
if not ring["messages"] > 20000000:
    failures.append(f"16,384-rank ring, 1 MiB: estimate {ring['messages']} messages is not over the limit")

bad = subprocess.run([BRAID, "tune", "--hosts", "0"], capture_output=True, text=True, timeout=30)
check("--hosts 0: exit status", bad.returncode, 2)
if "--hosts takes" not in bad.stderr:
    failures.append(f"--hosts 0: no reason given: {bad.stderr!r}")

for f in failures:
    print("FAIL:", f)
print(f"braid tune: {'all checks hold' if not failures else str(len(failures)) + ' failed'} (16,384 ranks in {elapsed:.1f} s)")
sys.exit(1 if failures else 0)
