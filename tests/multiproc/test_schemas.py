#!/usr/bin/env python3
"""Every tool's JSON against its schema in docs/schemas/ (JSON Schema 2020-12, python3-jsonschema).

Usage: test_schemas.py BRAID STATUS_JOB. Produces, on this host: braid perf --json (checked and
-c 0), braid doctor --json, braid tune --json, braid status --json on a live job, and the flight
recorder files that job's ranks write when one of them is stopped and BRAID_TIMEOUT passes. Each
must validate; and each document with a required member removed must not (the schema is live).
"""
import copy
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import jsonschema

from braid_jobs import end_job, free_port

BRAID, JOB = sys.argv[1], sys.argv[2]
SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "schemas")
ENV = dict(os.environ, BRAID_SECRET="braid-schema-test-secret")
failures = []


VERSIONS = {"perf": 2}  # the others are at 1


def validate(tool, doc, what):
    version = VERSIONS.get(tool, 1)
    with open(os.path.join(SCHEMAS, f"braid.{tool}-{version}.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message[:160]}" for e in v.iter_errors(doc)]
    if errors:
        failures.append(f"{what}: {len(errors)} error(s): {errors[:3]}")
    if doc.get("schema") != f"braid.{tool}/{version}":
        failures.append(f"{what}: schema member {doc.get('schema')!r}")
    broken = copy.deepcopy(doc)
    broken.pop(schema["required"][-1])
    if v.is_valid(broken):
        failures.append(f"{what}: still valid without {schema['required'][-1]!r}: the schema checks nothing")


with tempfile.TemporaryDirectory(prefix="braid-schemas-") as tmp:
    # Checked, unchecked, and with every per-rank and per-iteration member (-I 1).
    for k, extra in enumerate((["-c", "1"], ["-c", "0"], ["-c", "0", "-I", "1", "-K", "1", "--floor"])):
        out = os.path.join(tmp, f"perf{k}.json")
        r = subprocess.run([BRAID, "run", "-n", "2", "--", BRAID, "perf", "allreduce", "-b", "8", "-e", "4K"] + extra +
                           ["--json", out], env=ENV, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            failures.append(f"braid perf {' '.join(extra)}: exit {r.returncode}: {r.stderr[-300:]}")
        else:
            with open(out) as f:
                doc = json.load(f)
            validate("perf", doc, f"braid perf {' '.join(extra)}")
            if "-I" in extra and not (doc["straggler"] and "iterations" in doc["rows"][0]["out_of_place"] and
                                      doc["floor"] and "floor_share" in doc["rows"][-1]["in_place"]):
                failures.append("braid perf -I 1 --floor: no straggler, iteration statistics or floor in the JSON")

    out = os.path.join(tmp, "doctor.json")
    r = subprocess.run([BRAID, "run", "-n", "2", "--", BRAID, "doctor", "--json", out], env=ENV, capture_output=True,
                       text=True, timeout=180)
    if not os.path.exists(out):
        failures.append(f"braid doctor: no JSON (exit {r.returncode}): {r.stderr[-300:]}")
    else:
        with open(out) as f:
            validate("doctor", json.load(f), "braid doctor")

    r = subprocess.run([BRAID, "tune", "--hosts", "4", "--per-host", "7-9", "--json"], capture_output=True, text=True, timeout=120)
    validate("tune", json.loads(r.stdout), "braid tune")

    traces = os.path.join(tmp, "traces")
    port = free_port()
    job = subprocess.Popen([BRAID, "run", "-n", "3", "--master-port", str(port), "--", JOB, "--count", "1000", "--calls",
                            "100000000"], env=dict(ENV, BRAID_TRACE_DIR=traces, BRAID_TIMEOUT="3"), start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = []
    try:
        status = None
        for _ in range(100):
            # (braid run's launcher hosts the store on MASTER_PORT + 1)
            r = subprocess.run([BRAID, "status", "--addr", f"127.0.0.1:{port + 1}", "--json"], env=ENV, capture_output=True,
                               text=True, timeout=30)
            if r.returncode == 0:
                status = json.loads(r.stdout)
                break
            time.sleep(0.2)
        if status is None:
            failures.append("braid status: the job never answered")
        else:
            validate("status", status, "braid status")
            pids = [x["pid"] for x in status["ranks"]]
            os.kill(pids[1], signal.SIGSTOP)  # the others time out after 3 s and write their files
            deadline = time.monotonic() + 30
            while len(glob.glob(os.path.join(traces, "*.json"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            files = sorted(glob.glob(os.path.join(traces, "*.json")))
            if len(files) < 2:
                failures.append(f"flight recorder: {len(files)} file(s) written")
            for path in files:
                with open(path) as f:
                    validate("trace", json.load(f), os.path.basename(path))
    finally:
        end_job(job, pids)

for f in failures:
    print("FAIL:", f)
print(f"schemas: {'every tool validates' if not failures else str(len(failures)) + ' failed'}")
sys.exit(1 if failures else 0)
