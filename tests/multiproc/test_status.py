#!/usr/bin/env python3
"""braid status against running jobs of 8 ranks on this host (braid run + braid-status-job).

Usage: test_status.py BRAID STATUS_JOB. Checks, each on a live job:
- a healthy job: every rank answers, "all progressing", exit status 0;
- a query with a wrong secret: refused (exit 2, "authentication failed"), and the job unaffected;
- without --addr and outside the job's environment: the job whose ranks run on this host, found;
- one rank stopped with SIGSTOP: named "stopped" within 2 s, every other rank waiting, exit 1;
  after SIGCONT: all progressing again, and the wait counted against it per peer (stall seconds);
- one rank busy outside any call (compute) while the others wait: named as not entered, exit 1;
- --prom: read by prometheus_client's parser, and every line held to the exposition format's grammar;
- BRAID_METRICS_PORT: each rank serves its metrics on the port plus its index on the host (parsed
  the same way; the all-reduces counted), 404 elsewhere; BRAID_INSPECT_DIR: one JSON line per call
  per rank, its peers' bytes adding up to its bytes.
Every job is killed at the end, also when a check fails.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from braid_jobs import end_job, free_port

BRAID, JOB = sys.argv[1], sys.argv[2]
SECRET = "braid-status-test-secret"
failures = []
jobs = []


def start(extra=(), env_extra=None):
    port = free_port()
    env = dict(os.environ, BRAID_SECRET=SECRET, **(env_extra or {}))
    p = subprocess.Popen([BRAID, "run", "-n", "8", "--master-port", str(port), "--", JOB, "--count", "262144",
                          "--calls", "1000000", *extra], env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jobs.append({"proc": p, "pids": []})
    return port + 1  # the store's: braid run's launcher hosts it on MASTER_PORT + 1


def status(port, secret=SECRET):
    env = dict(os.environ, BRAID_SECRET=secret)
    t0 = time.monotonic()
    r = subprocess.run([BRAID, "status", "--addr", f"127.0.0.1:{port}", "--json"], env=env, capture_output=True,
                       text=True, timeout=30)
    took = time.monotonic() - t0
    doc = json.loads(r.stdout) if r.returncode in (0, 1) and r.stdout else None
    if doc:
        assert doc["schema"] == "braid.status/1", doc["schema"]
        jobs[-1]["pids"] = [x["pid"] for x in doc["ranks"] if x["pid"] > 0] or jobs[-1]["pids"]
    return r.returncode, doc, took, r.stderr


def until(port, want, seconds=30):
    """Asks until want(rc, doc) holds; returns the last (rc, doc, took)."""
    deadline = time.monotonic() + seconds
    while True:
        rc, doc, took, err = status(port)
        if doc and want(rc, doc):
            return rc, doc, took
        if time.monotonic() > deadline:
            return rc, doc, took
        time.sleep(0.2)


def check(what, ok, detail=""):
    if not ok:
        failures.append(f"{what}: {detail}")


def stop_jobs():
    while jobs:
        j = jobs.pop()
        end_job(j["proc"], j["pids"])


def progressing(rc, doc):
    return rc == 0 and doc["verdict"].startswith("all progressing")


def free_ports(n):
    """A base port with n free ports after it (each bound once to see)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        socks = []
        try:
            for k in range(n):
                t = socket.socket()
                t.bind(("127.0.0.1", base + k))
                socks.append(t)
            return base
        except OSError:
            pass
        finally:
            for t in socks:
                t.close()
    raise SystemExit("no 8 free ports in a row")


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


inspect_dir = tempfile.mkdtemp(prefix="braid-inspect-")
try:
    metrics_base = free_ports(8)
    port = start(env_extra={"BRAID_METRICS_PORT": str(metrics_base), "BRAID_INSPECT_DIR": inspect_dir})
    rc, doc, _ = until(port, progressing)
    check("healthy job", progressing(rc, doc), f"exit {rc}: {doc and doc['verdict']}")
    # Every rank answers: progressing, or, on this loaded 2-core machine, between two calls in both
    # samples (idle; seen once with a suite running beside it), never stopped, silent or gone.
    check("healthy job: every rank answers",
          doc and all(r["state"] in ("progressing", "idle") for r in doc["ranks"])
          and sum(r["state"] == "progressing" for r in doc["ranks"]) >= len(doc["ranks"]) - 1,
          doc and [r["state"] for r in doc["ranks"]])

    prom = subprocess.run([BRAID, "status", "--addr", f"127.0.0.1:{port}", "--prom"], capture_output=True, text=True,
                          env=dict(os.environ, BRAID_SECRET=SECRET), timeout=30)
    check("--prom: exit 0", prom.returncode == 0, f"{prom.returncode}: {prom.stderr!r}")
    families = {f.name: f for f in text_string_to_metric_families(prom.stdout)}
    up = [s for s in families["braid_rank_up"].samples] if "braid_rank_up" in families else []
    check("--prom: every rank up", len(up) == 8 and all(s.value == 1 for s in up), up)
    check("--prom: not stalled", "braid_job_stalled" in families and families["braid_job_stalled"].samples[0].value == 0)
    check("--prom: bytes counted", "braid_rank_bytes" in families and all(s.value > 0 for s in families["braid_rank_bytes"].samples
                                                                            if s.name == "braid_rank_bytes_total"))
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? [-+0-9.eEinfaN]+$')
    for line in prom.stdout.splitlines():
        ok = line.startswith("# HELP ") or re.match(r"^# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge)$", line) or sample.match(line)
        check("--prom: a line the exposition format allows", ok, line)

    for k in range(8):
        code, text = get(f"http://127.0.0.1:{metrics_base + k}/metrics")
        fams = {f.name: f for f in text_string_to_metric_families(text)} if code == 200 else {}
        calls = [x for x in fams["braid_collective_calls"].samples if x.labels.get("collective") == "allreduce"] \
            if "braid_collective_calls" in fams else []
        check(f"metrics port {metrics_base + k}: rank {k}'s all-reduces counted",
              code == 200 and len(calls) == 1 and calls[0].value > 0 and calls[0].labels["rank"] == str(k), f"{code}: {text[:200]!r}")
    code, _ = get(f"http://127.0.0.1:{metrics_base}/other")
    check("metrics port: 404 off /metrics", code == 404, code)
    time.sleep(1.2)  # (records are flushed at least once a second)
    files = sorted(os.listdir(inspect_dir), key=lambda f: int(f.rsplit("rank", 1)[1].split(".")[0]))
    check("BRAID_INSPECT_DIR: a file per rank, named by the communicator",
          len(files) == 8 and all(re.fullmatch(rf"braid-inspect-[0-9a-f]{{16}}-rank{k}\.jsonl", f) for k, f in enumerate(files)), files)
    for name in files:
        with open(os.path.join(inspect_dir, name)) as f:
            lines = f.read().splitlines()
        good = 0
        for line in lines[:-1][:200]:  # (the last line may be cut by the buffer)
            r = json.loads(line)
            good += (r["collective"] == "allreduce" and r["ok"] and name.startswith(f"braid-inspect-{r['comm']}-") and r["path"] in ("ring", "tree", "hier", "oneshot", "shm mailbox",
                                                                                  "zero copy", "cross-memory attach")
                     and r["bytes"] == sum(p["sent"] + p["recv"] for p in r["peers"]) and r["bytes"] > 0)
        check(f"{name}: every record whole", len(lines) > 1 and good == min(len(lines) - 1, 200), f"{good} of {len(lines)}")

    rc, _, _, err = status(port, secret="not-the-job-secret-at-all")
    check("wrong secret refused", rc == 2 and "authentication failed" in err, f"exit {rc}: {err!r}")
    rc, doc, _ = until(port, progressing, seconds=10)
    check("job unaffected by the refused query", progressing(rc, doc), f"exit {rc}: {doc and doc['verdict']}")

    # Outside the job's environment (no MASTER_*, no BRAID_SECRET): the job whose ranks run on this
    # host, found through their /proc/PID/environ. (Where another suite's job runs here too, it
    # lists both and asks for --addr.)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "BRAID_", "RANK", "WORLD_SIZE"))}
    r = subprocess.run([BRAID, "status", "--json"], env=env, capture_output=True, text=True, timeout=30)
    found = json.loads(r.stdout) if r.returncode in (0, 1) and r.stdout else None
    check("without --addr: the job on this host found",
          (found is not None and len(found["ranks"]) == 8 and found["addr"].endswith(f":{port}"))
          or (r.returncode == 2 and f"--addr 127.0.0.1:{port}" in r.stderr), f"exit {r.returncode}: {r.stderr[-300:]!r}")

    victim = doc["ranks"][3]["pid"]
    os.kill(victim, signal.SIGSTOP)
    time.sleep(0.5)
    rc, doc, took, err = status(port)
    check("stopped rank: exit 1", rc == 1, f"exit {rc}: {err!r}")
    check("stopped rank: answered within 2 s", took < 2.0, f"{took:.2f} s")
    if doc:
        check("stopped rank named", doc["ranks"][3]["state"] == "stopped" and "rank 3" in doc["verdict"]
              and "stopped" in doc["verdict"], doc["verdict"])
        others = [r["state"] for r in doc["ranks"] if r["rank"] != 3]
        check("the others wait", all(s == "waiting" for s in others), others)
    stopped_for = time.monotonic()
    os.kill(victim, signal.SIGCONT)
    rc, doc, _ = until(port, progressing, seconds=10)
    check("after SIGCONT: progressing", progressing(rc, doc), f"exit {rc}: {doc and doc['verdict']}")
    # The ranks that waited on rank 3 counted the wait against it (braid_peer_stall_seconds_total).
    prom = subprocess.run([BRAID, "status", "--addr", f"127.0.0.1:{port}", "--prom"], capture_output=True, text=True,
                          env=dict(os.environ, BRAID_SECRET=SECRET), timeout=30).stdout
    stalls = [x.value for f in text_string_to_metric_families(prom) if f.name == "braid_peer_stall_seconds"
              for x in f.samples if x.labels.get("peer") == "3"]
    check("the wait for the stopped rank counted against it", stalls and max(stalls) >= 1.0, stalls)
    stop_jobs()

    port = start(["--busy-rank", "5", "--busy-after", "200", "--busy-seconds", "6"])
    rc, doc, _ = until(port, lambda rc, doc: "has not entered" in doc["verdict"])
    check("busy rank named as not entered", rc == 1 and doc and doc["verdict"].startswith("rank 5 ")
          and "has not entered" in doc["verdict"] and doc["ranks"][5]["state"] == "idle",
          f"exit {rc}: {doc and doc['verdict']}")
finally:
    stop_jobs()
    for name in os.listdir(inspect_dir):
        os.remove(os.path.join(inspect_dir, name))
    os.rmdir(inspect_dir)

for f in failures:
    print("FAIL:", f)
print(f"braid status: {'all checks hold' if not failures else str(len(failures)) + ' failed'}")
sys.exit(1 if failures else 0)
