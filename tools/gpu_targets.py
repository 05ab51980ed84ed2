#!/usr/bin/env python3
"""Braid's CUDA targets, computed from what tools/gpu-run wrote under OUT (run last by gpu-run).
Usage: gpu_targets.py OUT     Prints one line per target with the figures, the formula and PASS/FAIL;
exit status 0 only if every target was computed and passed (a missing input is MISSING, and fails).

Formulas (S: bytes per rank, n: ranks on the one GPU, B_copy: cudaMemcpy D2D bandwidth counted as
read + write, i.e. 2 x size / time, as braid-gpu-bench reports it):
  kernel      fp32 and bf16 sum of 1 GiB: reduce GB/s (3 x size / time) >= 0.90 x B_copy, and >= torch.add's
  HBM bound   all-reduce of S on n ranks sharing one GPU must read every rank's input and write every
              rank's output at least once: 2 n S bytes through one HBM. bound time = 2 n S / B_copy;
              efficiency = bound time / measured time >= 0.70
  latency     8-byte all-reduce, 2 ranks on one GPU: time < 50 us
  staging     all-reduce of S through pinned host memory (BRAID_CUDA_IPC=0), 2 ranks: every rank's data
              crosses PCIe once each way, so n S bytes each way; bound time = n S / B_pinned (the slower
              of H2D and D2H). Printed against that bound and against max(bound, the same all-reduce on
              host buffers), which says how much the pipelining hides; the 80% target is the first.
"""
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "gpu-run-out"
failed = False


def load(name):
    path = os.path.join(out, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def verdict(name, ok, text):
    global failed
    if ok is None:
        print(f"MISSING {name}: {text}")
        failed = True
        return
    failed = failed or not ok
    print(f"{'PASS' if ok else 'FAIL'}    {name}: {text}")


def row(perf, size):
    for r in (perf or {}).get("rows", []):
        if r["size"] == size:
            return r
    return None


kb = load("kernel-bench.json")
ta = load("torch-add.json")
res = {r["name"]: r for r in (kb or {}).get("results", [])}
copy = res.get("cudaMemcpy D2D", {}).get("gbps")
torch_res = {r["name"]: r for r in (ta or {}).get("results", [])}
for ours, theirs in (("reduce float32 sum", "torch.add float32"), ("reduce bfloat16 sum", "torch.add bfloat16")):
    g = res.get(ours, {}).get("gbps")
    t = torch_res.get(theirs, {}).get("gbps")
    if g is None or copy is None:
        verdict(f"kernel {ours}", None, "kernel-bench.json has no figure")
        continue
    ok = g >= 0.90 * copy and (t is None or g >= t)
    verdict(f"kernel {ours}", ok, f"{g:.0f} GB/s = {g / copy:.1%} of D2D copy {copy:.0f} GB/s (target 90%)" +
            (f", torch.add {t:.0f} GB/s ({g / t:.2f}x)" if t else ", torch.add not measured"))

S = 256 << 20
for n in (2, 4):
    perf = load(f"perf-cuda-{n}ranks.json")
    r = row(perf, S)
    if r is None or copy is None:
        verdict(f"HBM bound, {n} ranks, 256 MiB", None, "no perf or copy figure")
        continue
    bound_us = 2 * n * S / (copy * 1e9) * 1e6
    for place in ("out_of_place", "in_place"):
        t = max(r[place]["time_us"], 1e-9)
        eff = bound_us / t
        wrong = r[place]["wrong"]  # None: the run did not check (braid perf -c 0)
        verdict(f"HBM bound, {n} ranks, 256 MiB, {place.replace('_', '-')}", eff >= 0.70 and wrong == 0,
                f"{t:.0f} us against 2*{n}*S/B_copy = {bound_us:.0f} us: {eff:.1%} (target 70%), "
                + ("results not checked (-c 0)" if wrong is None else f"{wrong} wrong"))

r = row(load("perf-cuda-2ranks.json"), 8)
if r is None:
    verdict("latency, 8 B, 2 ranks", None, "no perf figure")
else:
    t = min(r["out_of_place"]["time_us"], r["in_place"]["time_us"])
    verdict("latency, 8 B, 2 ranks", t < 50, f"{t:.1f} us (target < 50 us)")

pinned = [res.get(k, {}).get("gbps") for k in ("pinned host to device", "pinned device to host")]
r = row(load("perf-staged-2ranks.json"), S)
host = row(load("perf-host-2ranks.json"), S)
if r is None or None in pinned:
    verdict("staging, 2 ranks, 256 MiB", None, "no staged perf or pinned copy figure")
else:
    b = min(pinned)
    bound_us = 2 * S / (b * 1e9) * 1e6
    t = max(r["out_of_place"]["time_us"], 1e-9)
    floor_us = max(bound_us, host["out_of_place"]["time_us"]) if host else bound_us
    verdict("staging, 2 ranks, 256 MiB", bound_us / t >= 0.80,
            f"{t:.0f} us against n*S/B_pinned = {bound_us:.0f} us ({b:.1f} GB/s): {bound_us / t:.1%} (target 80%); "
            f"against max(that, host-buffer all-reduce {host['out_of_place']['time_us']:.0f} us) = {floor_us / t:.1%}"
            if host else f"{t:.0f} us against {bound_us:.0f} us: {bound_us / t:.1%} (target 80%)")

sys.exit(1 if failed else 0)
