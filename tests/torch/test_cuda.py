"""torch.distributed on Braid with CUDA tensors (python/braid_torch built with BRAID_TORCH_CUDA).

Two ranks (on one GPU when the machine has one): collectives on device tensors against references
each rank computes itself (integer-valued data, exact), non-contiguous and in-place, ordering on
torch's current stream (a side stream that is still busy writing the input when the call is
made), async Works waited on another stream, and a few DDP steps on the GPU whose replicas must
match. Exits 77 (skipped, with the reason) without a GPU or without the CUDA build; tools/gpu-run
runs it on the GPU machine. Prints "N passed, M failed" last; the exit status is the verdict.
"""
import datetime
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import braid_torch

WORLD = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def value(dtype, rank, n, device):
    i = torch.arange(n, dtype=torch.int64, device=device)
    return ((i * 7 + rank * 3) % 9 - 4).to(dtype)


def expect_equal(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"{what}: got {got.cpu().flatten()[:8].tolist()} want {want.cpu().flatten()[:8].tolist()}")


def body(rank, port, results):
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("braid", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    done = []
    try:
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for n in (0, 1, 7, 4097, (1 << 20) + 3):
                t = value(dtype, rank, n, dev)
                dist.all_reduce(t)
                expect_equal(t, sum(value(torch.float64, r, n, dev) for r in range(WORLD)).to(dtype),
                             f"all_reduce {dtype} n={n}")
        done.append("all_reduce")
        # Ordering on the current stream: the input is written by a side stream that is still busy
        # (a sleep kernel first) when the call is made; the call must wait for it, and the doubling
        # queued after it must see the sum.
        side = torch.cuda.Stream()
        x = torch.zeros(1 << 22, device=dev)
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            x.fill_(rank + 1)
            dist.all_reduce(x)
            y = x * 2
        side.synchronize()
        expect_equal(y, torch.full_like(y, 2 * sum(r + 1 for r in range(WORLD))), "stream order")
        done.append("stream order")
        # Async, waited on the default stream while the call ran on the side stream.
        with torch.cuda.stream(side):
            z = torch.full((4097,), float(rank + 1), device=dev)
            work = dist.all_reduce(z, async_op=True)
        work.wait()
        expect_equal(z * 1, torch.full_like(z, float(sum(r + 1 for r in range(WORLD)))), "async wait")
        done.append("async")
        # Non-contiguous: every other column of a matrix.
        m = torch.zeros(64, 6, device=dev)
        cols = m[:, ::2]
        cols.fill_(rank + 1)
        dist.all_reduce(cols)
        expect_equal(m[:, ::2].contiguous(), torch.full((64, 3), 3.0, device=dev), "non-contiguous")
        expect_equal(m[:, 1::2].contiguous(), torch.zeros(64, 3, device=dev), "non-contiguous: untouched columns")
        done.append("non-contiguous")
        b = value(torch.float32, rank, 1001, dev)
        dist.broadcast(b, src=1)
        expect_equal(b, value(torch.float32, 1, 1001, dev), "broadcast")
        n = 1009
        flat = torch.empty(WORLD * n, device=dev)
        dist.all_gather_into_tensor(flat, value(torch.float32, rank, n, dev))
        for q in range(WORLD):
            expect_equal(flat[q * n:(q + 1) * n], value(torch.float32, q, n, dev), f"all_gather_into_tensor block {q}")
        out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(out, torch.cat([value(torch.float32, rank + q, n, dev) for q in range(WORLD)]))
        expect_equal(out, sum(value(torch.float32, r + rank, n, dev) for r in range(WORLD)), "reduce_scatter_tensor")
        a2a = torch.arange(WORLD * 5, dtype=torch.float32, device=dev) + 100 * rank
        got = torch.empty_like(a2a)
        dist.all_to_all_single(got, a2a)
        want = torch.cat([torch.arange(rank * 5, rank * 5 + 5, dtype=torch.float32, device=dev) + 100 * q
                          for q in range(WORLD)])
        expect_equal(got, want, "all_to_all_single")
        done.append("broadcast, all_gather, reduce_scatter, all_to_all")
        # Sends and receives of device tensors (through host memory): the sent tensor written on a
        # side stream just before, the receive read by a kernel on the current stream right after
        # wait(), into a non-contiguous view; then a batch both ways.
        peer = 1 - rank
        side = torch.cuda.Stream(device=dev)
        src = torch.zeros(4096, device=dev)
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)
            src.fill_(float(rank + 7))
        torch.cuda.current_stream(dev).wait_stream(side)
        holder = torch.full((4096, 2), -1.0, device=dev)
        dst = holder[:, 1]
        if rank == 0:
            dist.send(src, peer)
            dist.recv(dst, peer)
        else:
            dist.recv(dst, peer)
            dist.send(src, peer)
        expect_equal(dst * 1, torch.full((4096,), float(peer + 7), device=dev), "recv of a device tensor")
        expect_equal(holder[:, 0] * 1, torch.full((4096,), -1.0, device=dev), "recv: untouched column")
        a, b = value(torch.float32, rank, 333, dev), torch.empty(333, device=dev)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, peer), dist.P2POp(dist.isend, a, peer)])
        for r in reqs:
            r.wait()
        expect_equal(b, value(torch.float32, peer, 333, dev), "batch_isend_irecv of device tensors")
        done.append("send, recv, batch_isend_irecv")
        # DDP on the GPU: replicas equal after every step.
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index], bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(5):
            torch.manual_seed(100 + 10 * step + rank)
            loss = ddp(torch.randn(8, 32, device=dev)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            mine = torch.cat([p.detach().flatten() for p in model.parameters()])
            theirs = [torch.empty_like(mine) for _ in range(WORLD)]
            dist.all_gather(theirs, mine)
            for q in range(WORLD):
                expect_equal(theirs[q], mine, f"DDP step {step}: replica of rank {q}")
        done.append("DDP")
        dist.destroy_process_group()
        results.put((rank, True, ", ".join(done)))
    except Exception:  # noqa: BLE001 - reported to the parent with its traceback
        results.put((rank, False, f"after [{', '.join(done)}]: {traceback.format_exc()}"))
        os._exit(1)


def main():
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        return 77
    if not braid_torch._C.cuda:
        print("skipped: braid_torch was built without CUDA tensors (python/meson.build says why)")
        return 77
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=body, args=(r, port, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    passed = failed = 0
    for _ in range(WORLD):
        try:
            rank, ok, what = results.get(timeout=240)
        except Exception:  # noqa: BLE001 - a rank that died without a word, or a hang
            print("FAIL a rank gave no result within 240 s")
            failed += 1
            break
        print(f"{'ok  ' if ok else 'FAIL'} rank {rank}: {what}")
        passed += ok
        failed += not ok
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed == WORLD else 1


if __name__ == "__main__":
    sys.exit(main())
