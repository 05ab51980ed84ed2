#!/usr/bin/env python3
"""braid perf's nccl-tests options and its own, each on a job of this host (braid run):
  -a 0|1|2|3   the time column is rank 0's, the average, the minimum or the maximum of the ranks'
               mean times (read back from --per-rank's per-rank means in the JSON)
  -m AGG       AGG calls per timed iteration: counted in every rank's BRAID_INSPECT_DIR records;
               refused with -c 1
  -z 1, -C 1   blocking calls and CPU time: said in the header and the JSON, results exact
  -T SECONDS   a rank stopped (SIGSTOP) inside the sweep: the others fail within the limit, naming it
  -u BYTES     misaligned buffers: exact, in place and out of place; 64 refused
  -I 1, -K     per-iteration statistics: samples = iterations - skipped, min <= p50 <= p99 <= max
  --per-rank   per-rank times without the statistics
  -R 1         buffers from braidMemAlloc
  --split      parallel communicators (MOD 2, DIV 3): exact, the header says how many
  --compare    two runs side by side with the ratio; a file that is not a run is refused
  --floor      every collective on 2 and 4 ranks: busbw over the floor within [0, 1.1], at least 0.05
               at its highest where copying is the work (not for the reductions, which may be
               compute-bound)
  straggler    one rank's core shared with a busy loop (SCHED_FIFO, half of every 0.2 ms): that rank
               is named, by its busy time
Usage: test_perf_options.py BRAID
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

BRAID = sys.argv[1]
ENV = dict(os.environ, BRAID_SECRET="braid-perf-options-secret")
failures = []
skipped = None  # a case this machine cannot run: the test then says skipped (77), not passed


def perf(n, args, env=None, timeout=180):
    r = subprocess.run([BRAID, "run", "-n", str(n), "--", BRAID, "perf"] + args, env=env or ENV,
                       capture_output=True, text=True, timeout=timeout)
    return r


def expect(cond, what):
    if not cond:
        failures.append(what)
    return cond


def cells(doc):
    for row in doc["rows"]:
        for name in ("out_of_place", "in_place"):
            yield row, row[name]


def done(before, text):
    """Says how the case that began with `before` failures went."""
    print(("ok   " if len(failures) == before else "FAIL ") + text)
    return len(failures)


def combine(mode, ranks):
    return [ranks[0], sum(ranks) / len(ranks), min(ranks), max(ranks)][mode]


n = 0
with tempfile.TemporaryDirectory(prefix="braid-perf-options-") as tmp:
    # -a: the time column from every rank's mean, four ways.
    runs = []
    for mode in range(4):
        out = os.path.join(tmp, f"a{mode}.json")
        r = perf(3, ["allreduce", "-b", "4K", "-e", "64K", "-f", "4", "-n", "8", "-c", "0", "-a", str(mode), "--per-rank",
                     "--json", out])
        if not expect(r.returncode == 0, f"-a {mode}: exit {r.returncode}: {r.stderr[-300:]}"):
            continue
        doc = json.load(open(out))
        runs.append(out)
        bad = [(row["size"], c["time_us"], combine(mode, c["per_rank_us"])) for row, c in cells(doc)
               if abs(c["time_us"] - combine(mode, c["per_rank_us"])) > 0.0015 + 1e-6 * c["time_us"]]
        expect(doc["settings"]["time_of"] == mode and not bad, f"-a {mode}: time_us is not that of the ranks: {bad[:3]}")
        expect(f"(-a {mode})" in r.stdout, f"-a {mode}: the header does not say it")
    n = done(n, "-a 0..3: every cell's time is rank 0's, the average, the minimum or the maximum of 3 ranks' means")

    # -m: AGG calls per timed iteration, as every rank's records count them (the warm-up calls too).
    inspect = os.path.join(tmp, "inspect")
    os.mkdir(inspect)
    r = perf(2, ["allreduce", "-b", "4000", "-e", "4000", "-n", "5", "-w", "1", "-c", "0", "-m", "3"],
             env=dict(ENV, BRAID_INSPECT_DIR=inspect))
    counts = []
    for f in sorted(os.listdir(inspect)):
        with open(os.path.join(inspect, f)) as lines:
            counts.append(sum('"call": "allreduce(count=1000,' in line for line in lines))
    expect(r.returncode == 0 and counts == [2 * (1 + 3 * 5)] * 2,
           f"-m 3 -n 5 -w 1: all-reduces of 1000 elements per rank {counts}, expected {2 * (1 + 3 * 5)} each")
    r = perf(2, ["allreduce", "-b", "8", "-e", "8", "-m", "2"])
    expect(r.returncode == 2 and "-m aggregates the unchecked timing loop" in r.stderr, f"-m with -c 1: {r.stderr[-200:]}")
    n = done(n, f"-m 3: {counts} timed all-reduces per rank (2 columns x (1 warm-up + 3 x 5)); refused with -c 1")

    # -z 1 and -C 1: said, and exact.
    out = os.path.join(tmp, "zc.json")
    r = perf(2, ["reducescatter", "-b", "8", "-e", "64K", "-f", "8", "-z", "1", "-C", "1", "--json", out])
    ok = r.returncode == 0 and "Out of bounds values : 0 OK" in r.stdout and "CPU time" in r.stdout and \
        "each call waited for" in r.stdout
    doc = json.load(open(out)) if ok else {}
    expect(ok and doc["settings"]["blocking"] == 1 and doc["settings"]["cputime"] == 1 and
           all(c["time_us"] > 0 for _, c in cells(doc)), f"-z 1 -C 1: {r.stdout[-300:]} {r.stderr[-300:]}")
    n = done(n, "-z 1 -C 1: exact, CPU time per call in the time column, both in the header and the JSON")

    # -T 2: rank 1 stopped mid-sweep; rank 0 fails within the limit (plus slack), naming rank 1.
    proc = subprocess.Popen([BRAID, "run", "-n", "2", "--", BRAID, "perf", "allreduce", "-b", "64K", "-e", "64K",
                             "-n", "100000000", "-c", "0", "-T", "2"], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    kids = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout

    def rank_of(pid):  # from the RANK that braid run gave the process
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            return None
        return next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)

    victims = [int(line.split()[0]) for line in kids.splitlines() if " perf " in line]
    stopped = next((p for p in victims if rank_of(p) == 1), None)
    if expect(len(victims) == 2 and stopped, f"-T: the ranks of braid run: {kids!r}"):
        os.kill(stopped, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    took = time.monotonic() - t0
    if stopped:
        try:
            os.kill(stopped, signal.SIGKILL)
        except ProcessLookupError:
            pass
    expect(proc.returncode != 0 and took < 8 and "timed out after 2 s" in err and "rank 1" in err,
           f"-T 2: exit {proc.returncode} after {took:.1f} s: {err[-400:]}")
    n = done(n, f"-T 2: with rank 1 stopped, the job failed {took:.1f} s later naming it")

    # -u: misaligned buffers, exact; out of range refused.
    for coll in ("allgather", "reducescatter", "alltoall", "broadcast"):
        out = os.path.join(tmp, "u.json")
        r = perf(3, [coll, "-b", "1", "-e", "100K", "-f", "7", "-u", "5", "--json", out])
        expect(r.returncode == 0 and "Out of bounds values : 0 OK" in r.stdout and
               json.load(open(out))["settings"]["misalign"] == 5, f"-u 5 {coll}: {r.stdout[-300:]} {r.stderr[-300:]}")
    r = perf(2, ["allreduce", "-u", "64"])
    expect(r.returncode == 2 and "-u takes a whole number from 0 to 63" in r.stderr, f"-u 64: {r.stderr[-200:]}")
    n = done(n, "-u 5: all-gather, reduce-scatter, all-to-all and broadcast exact from 1 B, in and out of place; -u 64 refused")

    # -I 1 -K 3: statistics over 7 of 10 iterations, per-rank times and the straggler.
    out = os.path.join(tmp, "i.json")
    r = perf(3, ["allreduce", "-b", "8", "-e", "64K", "-f", "16", "-n", "10", "-I", "1", "-K", "3", "--json", out])
    if expect(r.returncode == 0, f"-I 1: exit {r.returncode}: {r.stderr[-300:]}"):
        doc = json.load(open(out))
        bad = [row["size"] for row, c in cells(doc)
               if not (c["iterations"]["samples"] == 7 and c["iterations"]["min_us"] <= c["iterations"]["p50_us"] <=
                       c["iterations"]["p99_us"] <= c["iterations"]["max_us"] and c["iterations"]["cv"] >= 0 and
                       len(c["per_rank_us"]) == 3 and len(c["per_rank_busy_us"]) == 3)]
        expect(not bad and doc["straggler"] and "# Straggler" in r.stdout and r.stdout.count("#   iterations:") == 4,
               f"-I 1 -K 3: rows {bad}; straggler {doc.get('straggler')}")
    n = done(n, "-I 1 -K 3: 7 samples per cell, min <= p50 <= p99 <= max, three ranks' times, a straggler line")

    # --per-rank: the times without the statistics.
    out = os.path.join(tmp, "p.json")
    r = perf(2, ["allgather", "-b", "8", "-e", "1K", "-f", "8", "--per-rank", "--json", out])
    doc = json.load(open(out)) if r.returncode == 0 else {"rows": []}
    expect(r.returncode == 0 and all(len(c["per_rank_us"]) == 2 and "iterations" not in c for _, c in cells(doc)),
           f"--per-rank: {r.stderr[-300:]}")
    n = done(n, "--per-rank: per-rank times, no iteration statistics")

    # -R 1: buffers from braidMemAlloc.
    out = os.path.join(tmp, "r.json")
    r = perf(3, ["allreduce", "-b", "8", "-e", "1M", "-f", "16", "-R", "1", "--json", out])
    expect(r.returncode == 0 and "Out of bounds values : 0 OK" in r.stdout and "memory braid" in r.stdout and
           json.load(open(out))["settings"]["mem"] == "braid", f"-R 1: {r.stderr[-300:]}")
    n = done(n, "-R 1: braidMemAlloc buffers, exact")

    # --split: parallel communicators, exact; groups of unequal size too.
    for split, ranks, groups, size in (("MOD 2", 4, 2, 2), ("DIV 3", 4, 2, 3)):
        r = perf(ranks, ["allgather", "-b", "8", "-e", "16K", "-f", "8", "--split", split])
        expect(r.returncode == 0 and "Out of bounds values : 0 OK" in r.stdout and
               f"split {split}: {groups} parallel communicators, rank 0's of {size} ranks" in r.stdout,
               f"--split {split}: {r.stdout[-400:]} {r.stderr[-300:]}")
    r = perf(2, ["allreduce", "--split", "XOR 1"])
    expect(r.returncode == 2 and "unknown operation 'XOR'" in r.stderr, f"--split XOR: {r.stderr[-200:]}")
    n = done(n, "--split MOD 2 and DIV 3 on 4 ranks: exact, the groups said; XOR refused")

    # --compare: two runs side by side, without a launcher.
    if len(runs) == 4:
        r = subprocess.run([BRAID, "perf", "--compare", runs[1], runs[3]], capture_output=True, text=True, timeout=30)
        table = [line for line in r.stdout.splitlines() if line.strip() and not line.startswith("#")]
        ratios_ok = all(len(line.split()) == 9 for line in table)
        expect(r.returncode == 0 and len(table) == 3 and ratios_ok and "[2] over [1]: busbw x" in r.stdout,
               f"--compare: {r.stdout[-500:]} {r.stderr[-200:]}")
    r = subprocess.run([BRAID, "perf", "--compare", os.path.join(tmp, "nothing.json")], capture_output=True, text=True)
    expect(r.returncode == 2 and "cannot read" in r.stderr, f"--compare of a missing file: {r.stderr[-200:]}")
    n = done(n, "--compare: 3 sizes side by side with the ratio of busbw; a missing file refused")

    # --floor: every cell's busbw within 1.1 of what the memory allows (the floor is a limit), and
    # the largest share at least 0.05 (a floor far above any busbw says nothing).
    shares = {}
    for ranks in (2, 4):
        for coll in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv"):
            out = os.path.join(tmp, "f.json")
            r = perf(ranks, [coll, "-b", "8", "-e", "16M", "-f", "8", "-n", "8", "-w", "2", "-c", "0", "--floor", "--json", out])
            if not expect(r.returncode == 0 and "%floor" in r.stdout and "# floor: memory" in r.stdout,
                          f"--floor {coll} on {ranks}: exit {r.returncode}: {r.stderr[-300:]}"):
                continue
            s = [c["floor_share"] for _, c in cells(json.load(open(out))) if "floor_share" in c]
            shares[(ranks, coll)] = (min(s), max(s))
            # (The lower bound only where copying is the work: reductions may be compute-bound, as
            # the scalar kernels of a sanitizer build are, far below what memory allows.)
            low = 0 if coll in ("allreduce", "reducescatter", "reduce") else 0.05
            expect(s and 0 <= min(s) and max(s) <= 1.1 and max(s) >= low,
                   f"--floor {coll} on {ranks} ranks: busbw over the floor from {min(s):.3f} to {max(s):.3f}")
    top = max(shares.items(), key=lambda kv: kv[1][1]) if shares else None
    n = done(n, f"--floor: 14 runs, every cell's busbw/floor in [0, 1.1]; the highest {top[1][1]:.2f} ({top[0][1]} on {top[0][0]})"
             if top else "--floor: no run")

    # The straggler: rank 1's core is shared with a busy loop that takes half of every 0.2 ms at a
    # real-time priority, so every call of rank 1's is slowed alike. (braid run pins rank i to the
    # i-th core it may use: rank 1 on the second, alone.) Two ranks: the median rank is the faster.
    cores = sorted(os.sched_getaffinity(0))
    if os.geteuid() != 0 or len(cores) < 2:
        skipped = "the straggler case needs root (SCHED_FIFO) and 2 cores"
        print("skip", skipped)
    else:
        duty = ("import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end:\n"
                "    t = time.perf_counter()\n    while time.perf_counter() - t < 1e-4: pass\n    time.sleep(1e-4)\n")
        loop = subprocess.Popen(["chrt", "-f", "10", "taskset", "-c", str(cores[1]), sys.executable, "-c", duty])
        try:
            time.sleep(0.3)
            out = os.path.join(tmp, "s.json")
            r = perf(2, ["allreduce", "-b", "256K", "-e", "4M", "-f", "4", "-n", "12", "-w", "2", "-c", "0", "--per-rank",
                         "--json", out])
        finally:
            loop.kill()
            loop.wait()
        s = json.load(open(out))["straggler"] if r.returncode == 0 else None
        line = [x for x in r.stdout.splitlines() if x.startswith("# Straggler")]
        expect(s and s["rank"] == 1 and s["ratio"] >= 1.3 and line and "rank 1 (host " in line[0],
               f"straggler: {s}; {line}; {r.stderr[-300:]}")
        n = done(n, f"straggler: {line[0] if line else None}")

for f in failures:
    print("FAIL", f)
if not failures and skipped:
    print(f"skipped: {skipped} (every other case passed)")
    sys.exit(77)
sys.exit(1 if failures else 0)
