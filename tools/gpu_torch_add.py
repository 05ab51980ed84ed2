#!/usr/bin/env python3
"""The reference for braid-gpu-bench: torch.add(a, b, out=c) and c.copy_(a) on the same sizes, timed
with CUDA events and counted the same way (add: 3 x size, copy: 2 x size).
Usage: gpu_torch_add.py [BYTES] [ITERS] [JSON_OUT]"""
import json
import sys

try:
    import torch
except ImportError as e:  # the device machine has PyTorch; elsewhere say why and skip
    print(f"gpu_torch_add: SKIPPED: {e}")
    sys.exit(77)

nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 20
out = sys.argv[3] if len(sys.argv) > 3 else None
if not torch.cuda.is_available():
    print("gpu_torch_add: SKIPPED: torch.cuda.is_available() is False")
    sys.exit(77)


def timed(body, moved):
    for _ in range(3):
        body()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(iters):
        body()
    t1.record()
    torch.cuda.synchronize()
    ms = t0.elapsed_time(t1) / iters
    return ms, moved / (ms * 1e-3) / 1e9


results = []
for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    a = torch.ones(n, dtype=dtype, device="cuda")
    b = torch.full((n,), 2, dtype=dtype, device="cuda")
    c = torch.empty_like(a)
    ms, gbps = timed(lambda: torch.add(a, b, out=c), 3.0 * nbytes)
    results.append({"name": f"torch.add {name}", "ms": ms, "gbps": gbps})
    if name == "float32":
        ms, gbps = timed(lambda: c.copy_(a), 2.0 * nbytes)
        results.append({"name": "torch copy_ (D2D)", "ms": ms, "gbps": gbps})
    del a, b, c
    torch.cuda.empty_cache()

print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}, {nbytes / 2**30:.2f} GiB per buffer, {iters} iterations")
print(f"{'kernel':22s} {'ms':>10s} {'GB/s':>10s}")
for r in results:
    print(f"{r['name']:22s} {r['ms']:10.3f} {r['gbps']:10.1f}")
if out:
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "bytes": nbytes, "iters": iters,
                   "results": results}, f)
