"""torch.distributed on Braid (python/braid_torch), checked against computed references.

Run by meson (suite "torch") with /usr/bin/python3 and PYTHONPATH=build/python. Each check forks
its ranks with torch.multiprocessing (spawn), rendezvous over tcp:// on a free loopback port, and
compares every element with a reference each rank computes itself (integer-valued data: exact in
every type and any summation order). Prints "N passed, M failed" last; the exit status is the
verdict.
"""
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import braid_torch  # registers "braid"

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
          torch.uint8, torch.bool]
SIZES = [0, 1, 7, 4097, 100003]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank, world, port, backend="braid", timeout=60):
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))


def value(dtype, rank, n, salt=0):
    """What `rank` contributes: small integers that every type holds exactly, and whose sums over
    up to 4 ranks it holds too (int8: -4..4, uint8 and bool: 0..1 or 0..8)."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i * 7 + rank * 3 + salt) % 9
    if dtype == torch.bool:
        return (v % 2 == 0)
    if dtype == torch.uint8:
        return v.to(dtype)
    return (v - 4).to(dtype)


def reference(dtype, world, n, op, salt=0):
    vals = [value(dtype, r, n, salt).to(torch.float64) for r in range(world)]
    if dtype == torch.bool:
        stacked = torch.stack([v.bool() for v in vals])
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            return stacked.any(0)
        return stacked.all(0)
    acc = vals[0].clone()
    for v in vals[1:]:
        if op == dist.ReduceOp.SUM:
            acc += v
        elif op == dist.ReduceOp.PRODUCT:
            acc *= v
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, v)
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, v)
    return acc.to(dtype)


def expect_equal(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        bad = (got.to(torch.float64) != want.to(torch.float64)).nonzero()[:5].flatten().tolist() \
            if got.shape == want.shape else "shape"
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)} differing at {bad} from {want.dtype}{tuple(want.shape)}")


# ------------------------------------------------------------------ collectives

def collectives_body(rank, world, port):
    init(rank, world, port)
    assert dist.get_backend() == "braid", dist.get_backend()
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    for dtype in DTYPES:
        for n in SIZES:
            for op in ops:
                if op == dist.ReduceOp.PRODUCT and dtype not in (torch.bool,):
                    # products of -4..4 overflow the small types: use 1s and 2s instead
                    t = (value(dtype, rank, n) != 0).to(dtype) + (1 if dtype != torch.bool else 0)
                    t = t.to(dtype)
                    want = torch.stack([((value(dtype, r, n) != 0).to(dtype) + 1).to(torch.float64)
                                        for r in range(world)]).prod(0).to(dtype)
                else:
                    t = value(dtype, rank, n)
                    want = reference(dtype, world, n, op)
                w = dist.all_reduce(t, op=op, async_op=(n % 2 == 1))
                if w is not None:
                    w.wait()
                    assert w.is_completed()
                expect_equal(t, want, f"all_reduce {dtype} n={n} {op}")
        n = 4099
        for root in range(world):
            t = value(dtype, rank, n, salt=root) if rank == root else torch.zeros(n, dtype=dtype)
            dist.broadcast(t, src=root)
            expect_equal(t, value(dtype, root, n, salt=root), f"broadcast {dtype} root={root}")
            t = value(dtype, rank, n)
            dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
            if rank == root:
                expect_equal(t, reference(dtype, world, n, dist.ReduceOp.MAX), f"reduce {dtype} root={root}")
        outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, value(dtype, rank, n))
        for q in range(world):
            expect_equal(outs[q], value(dtype, q, n), f"all_gather {dtype} block {q}")
        flat = torch.zeros(world * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, value(dtype, rank, n))
        for q in range(world):
            expect_equal(flat[q * n:(q + 1) * n], value(dtype, q, n), f"all_gather_into_tensor {dtype} block {q}")
        if dtype != torch.bool:
            ins = [value(dtype, rank, n, salt=q) for q in range(world)]
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter(out, ins)
            expect_equal(out, reference(dtype, world, n, dist.ReduceOp.SUM, salt=rank), f"reduce_scatter {dtype}")
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, torch.cat(ins))
            expect_equal(out, reference(dtype, world, n, dist.ReduceOp.SUM, salt=rank), f"reduce_scatter_tensor {dtype}")
    # Non-contiguous tensors: a transposed matrix, reduced in place.
    m = value(torch.float32, rank, 35).reshape(5, 7).t()
    assert not m.is_contiguous()
    dist.all_reduce(m)
    expect_equal(m, reference(torch.float32, world, 35, dist.ReduceOp.SUM).reshape(5, 7).t(), "all_reduce non-contiguous")
    # all_to_all_single: equal blocks, then rows split by sizes that differ by pair.
    n = 6 * world
    inp = torch.arange(n, dtype=torch.float32) + 1000 * rank
    out = torch.zeros(n, dtype=torch.float32)
    dist.all_to_all_single(out, inp)
    for q in range(world):
        expect_equal(out[q * 6:(q + 1) * 6], torch.arange(rank * 6, rank * 6 + 6, dtype=torch.float32) + 1000 * q,
                     f"all_to_all_single block {q}")
    send_rows = [rank + q + 1 for q in range(world)]       # rows this rank sends to q
    recv_rows = [q + rank + 1 for q in range(world)]       # rows it gets from q
    inp = torch.cat([torch.full((send_rows[q], 3), float(rank * 10 + q)) for q in range(world)])
    out = torch.zeros(sum(recv_rows), 3)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_rows, input_split_sizes=send_rows)
    off = 0
    for q in range(world):
        expect_equal(out[off:off + recv_rows[q]], torch.full((recv_rows[q], 3), float(q * 10 + rank)),
                     f"all_to_all_single with splits, from {q}")
        off += recv_rows[q]
    outs = [torch.zeros(q + 2, dtype=torch.int64) for q in range(world)]
    dist.all_to_all(outs, [torch.full((rank + 2,), rank * 100 + q, dtype=torch.int64) for q in range(world)])
    for q in range(world):
        expect_equal(outs[q], torch.full((q + 2,), q * 100 + rank, dtype=torch.int64), f"all_to_all from {q}")
    # gather and scatter, every root.
    for root in range(world):
        mine = torch.full((5,), float(rank + root))
        gl = [torch.zeros(5) for _ in range(world)] if rank == root else None
        dist.gather(mine, gather_list=gl, dst=root)
        if rank == root:
            for q in range(world):
                expect_equal(gl[q], torch.full((5,), float(q + root)), f"gather root={root} from {q}")
        got = torch.zeros(4, dtype=torch.int32)
        sl = [torch.full((4,), q * 7 + root, dtype=torch.int32) for q in range(world)] if rank == root else None
        dist.scatter(got, scatter_list=sl, src=root)
        expect_equal(got, torch.full((4,), rank * 7 + root, dtype=torch.int32), f"scatter root={root}")
    # send/recv around the ring (even ranks send first), and isend/irecv.
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        buf = torch.zeros(1000)
        if rank % 2 == 0:
            dist.send(torch.full((1000,), float(rank)), dst=right)
            dist.recv(buf, src=left)
        else:
            dist.recv(buf, src=left)
            dist.send(torch.full((1000,), float(rank)), dst=right)
        expect_equal(buf, torch.full((1000,), float(left)), "send/recv ring")
        req = dist.irecv(buf, src=left) if rank % 2 else dist.isend(torch.full((1000,), float(rank) + 0.5), dst=right)
        req2 = dist.isend(torch.full((1000,), float(rank) + 0.5), dst=right) if rank % 2 else dist.irecv(buf, src=left)
        req.wait()
        req2.wait()
        expect_equal(buf, torch.full((1000,), float(left) + 0.5), "isend/irecv ring")
        # Every rank isends 4 MiB before it irecvs (each send larger than Braid's channel buffers):
        # posted one by one they would wait on each other until the timeout; held back until the
        # first wait, they go to Braid as one group. Then isend followed by a blocking recv, and
        # a receive that is only polled with is_completed().
        big4 = torch.full((1 << 20,), float(rank) + 0.25)
        got4 = torch.zeros(1 << 20)
        reqs = [dist.isend(big4, dst=right), dist.irecv(got4, src=left)]
        reqs[1].wait()
        reqs[0].wait()
        expect_equal(got4, torch.full((1 << 20,), float(left) + 0.25), "isend before irecv, 4 MiB")
        req = dist.isend(big4 * 2, dst=right)
        dist.recv(got4, src=left)
        req.wait()
        expect_equal(got4, torch.full((1 << 20,), (float(left) + 0.25) * 2), "isend then recv, 4 MiB")
        req = dist.isend(big4, dst=right)
        req2 = dist.irecv(got4, src=left)
        deadline = time.time() + 30
        while not req2.is_completed():
            assert time.time() < deadline, "an irecv polled with is_completed() never completed"
        req.wait()
        expect_equal(got4, torch.full((1 << 20,), float(left) + 0.25), "irecv polled with is_completed()")
        # batch_isend_irecv: every rank sends 4 MiB to both neighbours before it receives (issued
        # one by one, as torch 1.13 does for backends other than NCCL, this waits until the
        # timeout); one receive lands in a non-contiguous view.
        big = 1 << 20
        outs = [torch.full((big,), float(rank * 10 + k)) for k in range(2)]
        ins = [torch.zeros(big), torch.zeros(2 * big)[::2]]
        ops = [dist.P2POp(dist.isend, outs[0], right), dist.P2POp(dist.isend, outs[1], left),
               dist.P2POp(dist.irecv, ins[0], left), dist.P2POp(dist.irecv, ins[1], right)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        expect_equal(ins[0], torch.full((big,), float(left * 10)), "batch_isend_irecv from the left")
        expect_equal(ins[1], torch.full((big,), float(right * 10 + 1)), "batch_isend_irecv from the right")
        # Tags, as gloo and MPI match them: a receive takes the oldest message of its tag from its
        # source, whatever order the sends were made in (bad_input_body: a size that differs, a
        # tag never sent).
        sends = [dist.isend(torch.full((5,), float(rank * 100 + t)), dst=right, tag=t) for t in (3, 4)]
        got = [torch.zeros(5), torch.zeros(5)]
        for i, t in ((1, 4), (0, 3)):  # tag 4 first: tag 3 arrives with it and is held
            dist.irecv(got[i], src=left, tag=t).wait()
        for req in sends:
            req.wait()
        for i, t in enumerate((3, 4)):
            expect_equal(got[i], torch.full((5,), float(left * 100 + t)), f"isend tags 3, 4 received as 4, 3: tag {t}")
        for t in (7, 8, 9):  # blocking sends, received in reverse, into non-contiguous views
            dist.send(torch.full((3,), float(rank * 100 + t)), dst=right, tag=t)
        for t in (9, 8, 7):
            view = torch.zeros(6)[::2]
            dist.recv(view, src=left, tag=t)
            expect_equal(view, torch.full((3,), float(left * 100 + t)), f"blocking sends received in reverse: tag {t}")
        # 40 messages on 5 tags, more than one manifest lists, each tag's received in order, the
        # tags in the reverse of their order.
        sends = [dist.isend(torch.full((2,), float(i), dtype=torch.float64), dst=right, tag=i % 5) for i in range(40)]
        for t in reversed(range(5)):
            for k in range(8):
                x = torch.zeros(2, dtype=torch.float64)
                dist.recv(x, src=left, tag=t)
                expect_equal(x, torch.full((2,), float(t + 5 * k), dtype=torch.float64), f"message {k} of tag {t}")
        for req in sends:
            req.wait()
        ops = [dist.P2POp(dist.isend, outs[0][:9], right, tag=11), dist.P2POp(dist.irecv, ins[0][:9], left, tag=11)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        expect_equal(ins[0][:9], torch.full((9,), float(left * 10)), "batch_isend_irecv with tag 11")
    # A subgroup (new_group: its own store prefix, so a communicator of its own) beside the world.
    if world >= 3:
        sub = dist.new_group([0, 2])
        t = torch.full((5,), float(rank + 1))
        if rank in (0, 2):
            dist.all_reduce(t, group=sub)
            expect_equal(t, torch.full((5,), 4.0), "all_reduce on new_group([0, 2])")
            assert dist.get_backend(sub) == "braid"
    # The future of an async all-reduce completes with the result.
    t = torch.ones(8) * (rank + 1)
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.wait()
    expect_equal(res[0], torch.full((8,), float(world * (world + 1) // 2)), "all_reduce future")
    dist.barrier()
    # monitored_barrier (torch 1.13 refuses it for every backend but gloo; braid_torch routes a
    # Braid group's to the group): all ranks arrive, so it passes (silent_rank_body: when not).
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    dist.monitored_barrier(wait_all_ranks=True)
    dist.destroy_process_group()


# ------------------------------------------------------------------ DDP against gloo

class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)
        if unused:
            self.u = torch.nn.Linear(4, 4)  # never in the forward pass

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def ddp_body(rank, world, port, backend, variants, out_dir):
    """Each variant's training in turn on one process group; rank 0 saves each one's parameters."""
    init(rank, world, port, backend)
    for variant in variants:
        ddp_train(rank, world, backend, variant, os.path.join(out_dir, f"{backend}-{world}-{variant}.pt"))
    if backend == "gloo":
        # torch 1.13's ~ProcessGroupGloo (run by ~Reducer as `ddp` goes) joins gloo's worker threads
        # while it holds the GIL, and a worker finishing a work's future waits for the GIL: a
        # deadlock CI met once. The reference run leaves without running destructors.
        dist.barrier()
        os._exit(0)
    dist.destroy_process_group()


def ddp_train(rank, world, backend, variant, out_path):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(1234)
    model = Net(unused=(variant == "unused"))
    cap = 0.0005 if variant == "small-buckets" else 25
    ddp = DDP(model, bucket_cap_mb=cap, find_unused_parameters=(variant == "unused"))
    if variant == "hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif variant == "powersgd":
        # Its future's callback starts an all-reduce and waits for it (a callback calling its own
        # group); the hook's last all-reduce may still be queued as the process exits.
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                       min_compression_rate=0.5, random_seed=0)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(99)
    data = [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(20 * world)]
    for step in range(20):
        x, y = data[step * world + rank]
        accumulate = variant == "no_sync" and step % 2 == 0
        if accumulate:
            with ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            continue
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
        # Replicas stay identical on every rank, bit for bit.
        flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        for q in range(world):
            if not torch.equal(gathered[q], flat):
                raise AssertionError(f"{backend} {variant}: step {step}: rank {q}'s parameters differ from rank {rank}'s")
    if rank == 0:
        torch.save([p.detach().clone() for p in ddp.parameters()], out_path)


# ------------------------------------------------------------------ sequence numbers

def sequence_body(rank, world, port):
    """torch's sequence numbers (TORCH_DISTRIBUTED_DEBUG=DETAIL sets them on every group it wraps):
    0 once set, one more a call, the same on every rank; monitored_barrier through torch's wrapper."""
    init(rank, world, port)
    if hasattr(dist, "get_debug_level") and dist.get_debug_level() != dist.DebugLevel.DETAIL:
        raise AssertionError(f"rank {rank}: debug level {dist.get_debug_level()}, not DETAIL")
    pg = braid_torch._braid_of(None)
    pg._set_sequence_number_for_group()
    seen = [pg._get_sequence_number_for_group()]
    t = torch.ones(5)
    for _ in range(3):
        dist.all_reduce(t)
        seen.append(pg._get_sequence_number_for_group())
    if seen != [0, 1, 2, 3]:
        raise AssertionError(f"rank {rank}: sequence numbers {seen} after 0, 1, 2 and 3 all-reduces")
    mine = torch.tensor([pg._get_sequence_number_for_group()], dtype=torch.int64)
    every = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(every, mine)
    if any(int(e) != 3 for e in every):
        raise AssertionError(f"rank {rank}: the ranks' sequence numbers after 3 all-reduces: {every}")
    dist.monitored_barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ dtypes

def dtypes_body(rank, world, port):
    """int16 reduces exactly, and on torch >= 2.3 uint16, uint32 and uint64 past the signed types'
    ranges, on torch >= 2.1 float8_e4m3fn and float8_e5m2 (sums that the 8-bit floats hold); a
    type Braid does not have is refused with the list of those it has, and the group goes on."""
    init(rank, world, port)
    for name, base in (("int16", -(1 << 13)), ("uint16", 1 << 14), ("uint32", 1 << 30), ("uint64", 1 << 62)):
        dtype = getattr(torch, name, None)
        if dtype is None:  # torch < 2.3
            continue
        mine = [base + 1000 * rank + i for i in range(5)]
        t = torch.tensor(mine, dtype=dtype)
        dist.all_reduce(t)
        want = [sum(base + 1000 * q + i for q in range(world)) for i in range(5)]
        if t.tolist() != want:
            raise AssertionError(f"rank {rank}: {name} sum {t.tolist()} != {want}")
        t = torch.tensor([base + rank] * 3, dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if t.tolist() != [base + world - 1] * 3:
            raise AssertionError(f"rank {rank}: {name} max {t.tolist()}")
    for name in ("float8_e4m3fn", "float8_e5m2"):
        dtype = getattr(torch, name, None)
        if dtype is None:  # torch < 2.1
            continue
        mine = torch.tensor([(rank + i) % 3 - 1.0 for i in range(7)] + [0.5 * rank, -2.0])  # sums within -6..6
        t = mine.to(dtype)
        dist.all_reduce(t)
        want = sum(torch.tensor([(q + i) % 3 - 1.0 for i in range(7)] + [0.5 * q, -2.0]) for q in range(world))
        if not torch.equal(t.to(torch.float32), want):
            raise AssertionError(f"rank {rank}: {name} sum {t.to(torch.float32).tolist()} != {want.tolist()}")
        t = torch.full((4,), float(rank), dtype=torch.float32).to(dtype)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if t.to(torch.float32).tolist() != [world - 1.0] * 4:
            raise AssertionError(f"rank {rank}: {name} max {t.to(torch.float32).tolist()}")
    refused = getattr(torch, "float8_e4m3fnuz", None)  # torch >= 2.2: a type Braid does not have
    if refused is not None:
        try:
            dist.all_reduce(torch.ones(3).to(refused))
            raise AssertionError("a float8_e4m3fnuz all_reduce did not raise")
        except RuntimeError as e:
            if "not supported (Braid has" not in str(e):
                raise
    x = torch.ones(2)
    dist.all_reduce(x)
    if not torch.equal(x, torch.full((2,), float(world))):
        raise AssertionError(f"rank {rank}: the group afterwards: {x}")
    dist.destroy_process_group()


# ------------------------------------------------------------------ sparse

def sparse_part(rank, dtype, dense_dims):
    """Rank `rank`'s sparse COO tensor (10 x 6, `dense_dims` dense columns per entry when non-zero):
    indices shared with other ranks and its own, a repeated index (uncoalesced), none at all on rank 2."""
    if rank == 2:
        idx = torch.zeros((2, 0), dtype=torch.int64)
    else:
        idx = torch.tensor([[0, rank, 5, 9 - rank, 5], [1, 2, 3, rank, 3]], dtype=torch.int64)
    nnz = idx.shape[1]
    vals = (torch.arange(nnz * max(dense_dims, 1)) % 5 + rank + 1).to(dtype)
    if dense_dims:
        return torch.sparse_coo_tensor(idx[:1], vals.reshape(nnz, dense_dims), (10, dense_dims))
    return torch.sparse_coo_tensor(idx, vals, (10, 6))


def sparse_body(rank, world, port):
    init(rank, world, port)
    for dtype in (torch.float32, torch.float64, torch.int64):
        for dense_dims in (0, 3):
            t = sparse_part(rank, dtype, dense_dims)
            dist.all_reduce(t)
            want = sum(sparse_part(q, dtype, dense_dims).to_dense() for q in range(world))
            if not t.is_sparse or not torch.equal(t.to_dense(), want):
                raise AssertionError(f"rank {rank}: sparse all_reduce of {dtype}, {dense_dims} dense dims: "
                                     f"{t.to_dense()} != {want}")
    try:
        dist.all_reduce(sparse_part(rank, torch.float32, 0), op=dist.ReduceOp.MAX)
        raise AssertionError("a sparse all_reduce with MAX did not raise")
    except RuntimeError as e:
        if "SUM only" not in str(e):
            raise
    x = torch.ones(4)
    dist.all_reduce(x)  # the group goes on
    if not torch.equal(x, torch.full((4,), float(world))):
        raise AssertionError(f"rank {rank}: dense all_reduce after the refusal gave {x}")
    dist.destroy_process_group()


def sparse_ddp_body(rank, world, port, backend, out_path):
    """DDP over an nn.Embedding with sparse gradients (and a dense layer after it), 10 SGD steps."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    init(rank, world, port, backend)
    torch.manual_seed(4321)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8, sparse=True), torch.nn.Flatten(), torch.nn.Linear(24, 2))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7)
    for step in range(10):
        tokens = torch.randint(0, 50, (world, 4, 3), generator=g)[rank]
        target = torch.randn(world, 4, 2, generator=g)[rank]
        torch.nn.functional.mse_loss(ddp(tokens), target).backward()
        opt.step()
        opt.zero_grad()
    if rank == 0:
        torch.save([p.detach().clone() for p in ddp.parameters()], out_path)
    if backend == "gloo":
        dist.barrier()
        os._exit(0)  # (as ddp_body: torch 1.13's ~ProcessGroupGloo under the GIL)
    dist.destroy_process_group()


# ------------------------------------------------------------------ failure

def killed_rank_body(rank, world, port, out_path):
    init(rank, world, port, timeout=60)
    t = torch.ones(1 << 16)
    for step in range(1000):
        if rank == world - 1 and step == 5:
            os._exit(3)  # dies without a word
        start = time.monotonic()
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            with open(f"{out_path}.{rank}", "w") as f:
                f.write(f"{time.monotonic() - start:.3f}\n{e}\n")
            os._exit(0)
    os._exit(5)


# ------------------------------------------------------------------ bad input

def bad_input_body(rank, world, port, out_path):
    init(rank, world, port, timeout=5)  # every call bounded by 5 s
    msgs = []
    try:  # a peer outside the group: refused on this rank alone, the group goes on
        dist.send(torch.zeros(4), dst=world + 5)
        msgs.append("send to a rank out of range was accepted")
    except (RuntimeError, ValueError) as e:
        msgs.append(f"out of range: {e}")
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * 4, t
    # A receive of another size or dtype than the send of its tag: it raises on the receiver,
    # naming both, and the group goes on.
    if rank == 0:
        dist.send(torch.ones(3), dst=1, tag=5)
        dist.send(torch.ones(3), dst=1, tag=6)
        msgs.append("size: (the sender)")
    else:
        try:
            dist.recv(torch.zeros(4), src=0, tag=5)
            msgs.append("a receive of 4 elements took a send of 3")
        except RuntimeError as e:
            msgs.append(f"size: {e}".replace("\n", " "))
        try:
            dist.recv(torch.zeros(3, dtype=torch.int32), src=0, tag=6)
            msgs.append("an int32 receive took a float32 send")
        except RuntimeError as e:
            msgs[-1] += f" | dtype: {e}".replace("\n", " ")
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * 4, t
    # A receive of a tag that is never sent: it times out naming the tag it waits for and the tags
    # that came instead. On a group of its own, which that ends, so that the world group goes on.
    pair = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=5))
    start = time.monotonic()
    try:
        if rank == 0:
            dist.send(torch.ones(3), dst=1, tag=5, group=pair)
            dist.barrier(group=pair)  # the sender learns at its next call
        elif rank == 1:
            dist.recv(torch.zeros(3), src=0, tag=6, group=pair)
        msgs.append("a receive of a tag never sent succeeded")
    except RuntimeError as e:
        msgs.append(f"tags after {time.monotonic() - start:.1f} s: {e}".replace("\n", " "))
    try:  # ranks disagree on the size: every rank raises, naming both calls
        dist.all_reduce(torch.ones(10 + rank))
        msgs.append("mismatched sizes succeeded")
    except RuntimeError as e:
        msgs.append(f"mismatch: {e}")
    with open(f"{out_path}.{rank}", "w") as f:
        f.write("\n".join(msgs))
    os._exit(0)


def silent_rank_body(rank, world, port, out_path):
    init(rank, world, port, timeout=5)
    if rank == world - 1:
        time.sleep(12)  # never calls (while the others time out)
        os._exit(0)
    try:  # rank 0 names the missing rank; rank 1 raises with rank 0's verdict
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=True)
        barrier = "a monitored_barrier without the silent rank passed"
    except RuntimeError as e:
        barrier = str(e).replace("\n", " ")
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        msg = "an all-reduce without the silent rank succeeded"
    except RuntimeError as e:
        msg = str(e)
    with open(f"{out_path}.{rank}", "w") as f:
        f.write(f"{time.monotonic() - start:.3f}\n{barrier}\n{msg}")
    os._exit(0)


def unwaited_body(rank, world, port, out_path):
    # Async calls on temporaries, neither the tensors nor the Works kept, then the group destroyed
    # at once: destroying it drains the queue on Braid's worker, whose finished Works drop the last
    # reference to tensors Python made (which takes the GIL), while torch destroys the group from
    # Python, holding the GIL (a deadlock before ~ProcessGroupBraid let go of it).
    init(rank, world, port)
    for i in range(8):
        dist.all_reduce(torch.ones(4096) * (rank + i), async_op=True)
    dist.destroy_process_group()
    with open(f"{out_path}.{rank}", "w") as f:
        f.write("destroyed")


def status_body(rank, world, port, out_path):
    # Three all-reduces; then rank 1 stays out (sleeps) while rank 0 waits in the fourth and asks
    # `braid status --unique-id` about the job, and braid_torch.status() about itself.
    init(rank, world, port)
    for _ in range(3):
        dist.all_reduce(torch.ones(1024))
    if rank == 1:
        time.sleep(6)
        dist.all_reduce(torch.ones(1024))
        return
    mine = braid_torch.status()
    work = dist.all_reduce(torch.ones(1024), async_op=True)
    time.sleep(1)
    r = subprocess.run([os.environ["TEST_BRAID_PROGRAM"], "status", "--unique-id", braid_torch.unique_id(), "--json"],
                       capture_output=True, text=True, timeout=30)
    work.wait()
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump({"mine": mine, "rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}, f)


def run_ranks(fn, world, path, limit=60):
    port = free_port()
    spawner = mp.get_context("spawn")
    procs = [spawner.Process(target=fn, args=(r, world, port, path)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + limit
    for p in procs:
        p.join(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()


def check_bad_input_raises_on_every_rank():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bad")
        run_ranks(bad_input_body, 2, path)
        for rank in range(2):
            with open(f"{path}.{rank}") as f:
                out_of_range, size, tags, mismatch = f.read().split("\n", 3)
            if "outside 0..1" not in out_of_range:
                raise AssertionError(f"rank {rank}: {out_of_range}")
            if rank == 1:
                for want in ("rank 0 sent 3 elements of Float with that tag, this receive takes 4 of Float",
                             "rank 0 sent 3 elements of Float with that tag, this receive takes 3 of Int"):
                    if want not in size:
                        raise AssertionError(f"rank 1: the size or dtype mismatch is not named ({want}): {size}")
                if "recv from rank 0 with tag 6 on rank 1, waiting for a message with that tag" not in tags or \
                        "tag 5 (1 message)" not in tags or "timed out" not in tags:
                    raise AssertionError(f"rank 1: the tag waited for and the tag held are not named: {tags}")
            elif "tags after" not in tags:  # the sender's barrier fails: rank 1 is gone from it
                raise AssertionError(f"rank 0: the barrier after the send succeeded: {tags}")
            print(f"  rank {rank}: {size[:200]}")
            print(f"  rank {rank}: {tags[:240]}")
            if "allreduce(count=10, float32, sum)" not in mismatch or "allreduce(count=11, float32, sum)" not in mismatch:
                raise AssertionError(f"rank {rank}: the mismatch does not name both calls: {mismatch}")
            print(f"  rank {rank}: {mismatch[:150]}")
        path = os.path.join(d, "silent")
        run_ranks(silent_rank_body, 3, path)
        for rank in range(2):
            with open(f"{path}.{rank}") as f:
                took, barrier, msg = f.readline(), f.readline(), f.read()
            if "rank 2 has not reached monitored_barrier within 1000 ms" not in barrier or \
                    (rank == 1 and "rank 0 says" not in barrier):
                raise AssertionError(f"rank {rank}: monitored_barrier did not name rank 2: {barrier}")
            print(f"  rank {rank}: {barrier.strip()[:150]}")
            if float(took) > 10 or "rank 2" not in msg or "silent" not in msg:
                raise AssertionError(f"rank {rank} after {took.strip()} s: {msg}")
            print(f"  rank {rank} after {took.strip()} s: {msg[:150]}")


def check_destroy_with_unwaited_work():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "unwaited")
        start = time.monotonic()
        run_ranks(unwaited_body, 2, path, limit=30)
        for rank in range(2):
            if not os.path.exists(f"{path}.{rank}"):
                raise AssertionError(f"rank {rank}: destroy_process_group did not return within 30 s "
                                     "with unwaited async calls queued")
        print(f"  both ranks destroyed the group with 8 unwaited calls in {time.monotonic() - start:.1f} s")


# ------------------------------------------------------------------ driver

class Skipped(Exception):
    """A check that cannot run here, with the reason (listed as skipped, not passed)."""


def coalescing_body(rank, world, port):
    """torch >= 2.1's coalescing: all_reduce, all_gather_into_tensor and reduce_scatter_tensor lists
    (torch hands the backend the list), and sends and receives between start and end (device given)."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    init(rank, world, port)
    sizes = [1, 0, 7, 4097]
    ts = [value(torch.float32, rank, n, salt=i) for i, n in enumerate(sizes)]
    with _coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for i, n in enumerate(sizes):
        expect_equal(ts[i], reference(torch.float32, world, n, dist.ReduceOp.SUM, salt=i), f"coalesced all_reduce {i}")
    ins = [value(torch.int64, rank, n, salt=i) for i, n in enumerate([3, 0, 5])]
    ins[2] = ins[2].expand(2, 5)[1]  # (a view: any layout)
    outs = [torch.full((world * x.numel(),), -1, dtype=torch.int64) for x in ins]
    outs[2] = torch.full((world, 5), -1, dtype=torch.int64)
    with _coalescing_manager():
        for o, x in zip(outs, ins):
            dist.all_gather_into_tensor(o, x)
    for i, n in enumerate([3, 0, 5]):
        want = torch.cat([value(torch.int64, r, n, salt=i) for r in range(world)])
        expect_equal(outs[i].reshape(-1), want, f"coalesced all_gather_into_tensor {i}")
    outs = [torch.full((2,), -1.0, dtype=torch.float64), torch.full((3, 3), -1.0, dtype=torch.float64)]
    ins = [value(torch.float64, rank, world * o.numel(), salt=10 + i) for i, o in enumerate(outs)]
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        with _coalescing_manager():
            for o, x in zip(outs, ins):
                dist.reduce_scatter_tensor(o, x, op=op)
        for i, o in enumerate(outs):
            k = o.numel()
            want = reference(torch.float64, world, world * k, op, salt=10 + i)[rank * k:(rank + 1) * k]
            expect_equal(o.reshape(-1), want, f"coalesced reduce_scatter_tensor {i} ({op})")
    # Sends and receives between startCoalescing and endCoalescing: a ring, every rank's receive
    # posted before its send (one batch: no order deadlocks).
    got = torch.full((5,), -1.0)
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.irecv(got, (rank - 1) % world)
        dist.isend(value(torch.float32, rank, 5), (rank + 1) % world)
    cm.wait()
    expect_equal(got, value(torch.float32, (rank - 1) % world, 5), "a receive between start and end of coalescing")
    # A collective in between is refused with the reason, and the group goes on: collectives, and
    # coalescing again. (Raising out of the with-block leaves torch's own coalescing state behind,
    # whatever the backend: its next all_reduce would be recorded and never made. Cleared here.)
    try:
        with _coalescing_manager(device=torch.device("cpu")):
            dist.broadcast(torch.zeros(3), 0)
        raise AssertionError("a broadcast between startCoalescing and endCoalescing was not refused")
    except RuntimeError as e:
        if "only sends and receives may be made between startCoalescing and endCoalescing" not in str(e):
            raise
    dist.distributed_c10d._world.pg_coalesce_state.pop(dist.group.WORLD, None)
    t = value(torch.float32, rank, 11)
    dist.all_reduce(t)
    expect_equal(t, reference(torch.float32, world, 11, dist.ReduceOp.SUM), "all_reduce after a refused coalescing")
    got = torch.full((3,), -1.0)
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.isend(value(torch.float32, rank, 3, salt=1), (rank + 1) % world)
        dist.irecv(got, (rank - 1) % world)
    cm.wait()
    expect_equal(got, value(torch.float32, (rank - 1) % world, 3, salt=1), "coalescing again after a refused one")
    dist.destroy_process_group()


def spawn(fn, world, *args):
    mp.spawn(fn, args=(world, free_port()) + args, nprocs=world, join=True)


def check_collectives():
    for world in (1, 2, 3, 4):
        spawn(collectives_body, world)


def mixed_body(rank, world, port):
    """One group, a backend per device type: braid for CPU tensors, gloo for CUDA ones (which a
    CPU-only torch creates but cannot run)."""
    dist.init_process_group("cpu:braid,cuda:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    pg = dist.distributed_c10d._get_default_group()
    cpu, cuda = pg._get_backend(torch.device("cpu")), pg._get_backend(torch.device("cuda"))
    if not isinstance(cpu, braid_torch.ProcessGroupBraid):
        raise AssertionError(f"rank {rank}: the CPU backend is {type(cpu).__name__}, not braid's")
    if "Gloo" not in type(cuda).__name__:
        raise AssertionError(f"rank {rank}: the CUDA backend is {type(cuda).__name__}, not gloo's")
    t = torch.arange(5, dtype=torch.float32) + rank
    dist.all_reduce(t)
    want = torch.arange(5, dtype=torch.float32) * world + world * (world - 1) / 2
    if not torch.equal(t, want):
        raise AssertionError(f"rank {rank}: all_reduce through the mixed group gave {t}")
    dist.barrier()
    dist.destroy_process_group()


def check_mixed_backends():
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 0):
        raise Skipped(f"torch {torch.__version__} takes one backend a group ('cpu:braid,cuda:gloo' needs torch >= 2.0; "
                      "tools/torch2-check runs it)")
    spawn(mixed_body, 2)


def check_coalescing():
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 1):
        raise Skipped(f"torch {torch.__version__} has no coalescing on the backend (torch >= 2.1; tools/torch2-check runs it)")
    for world in (2, 3):
        spawn(coalescing_body, world)


def check_ddp_matches_gloo():
    # One job a world size and backend runs every variant in turn (powerSGD last: its hook's last
    # all-reduce may still be queued as the process exits).
    variants = ("plain", "no_sync", "small-buckets", "unused", "hook", "powersgd")
    with tempfile.TemporaryDirectory() as d:
        for world in (2, 3):
            for backend in ("braid", "gloo"):
                spawn(ddp_body, world, backend, variants, d)
            for variant in variants:
                res = {b: torch.load(os.path.join(d, f"{b}-{world}-{variant}.pt")) for b in ("braid", "gloo")}
                diff = max((a - b).abs().max().item() for a, b in zip(res["braid"], res["gloo"]))
                print(f"  DDP {world} ranks, {variant}: max |braid - gloo| = {diff:.3g}")
                if diff > 1e-6:
                    raise AssertionError(f"DDP {world} ranks {variant}: parameters differ from gloo's by {diff}")


def check_sequence_numbers():
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # read as torch is imported: the ranks inherit it
    try:
        spawn(sequence_body, 2)
    finally:
        del os.environ["TORCH_DISTRIBUTED_DEBUG"]


def check_dtypes():
    for world in (2, 3):
        spawn(dtypes_body, world)


def check_sparse_all_reduce():
    for world in (1, 2, 3):
        spawn(sparse_body, world)
    with tempfile.TemporaryDirectory() as d:
        for world in (2, 3):
            res = {}
            for backend in ("braid", "gloo"):
                path = os.path.join(d, f"{backend}-{world}.pt")
                spawn(sparse_ddp_body, world, backend, path)
                res[backend] = torch.load(path)
            diff = max((a - b).abs().max().item() for a, b in zip(res["braid"], res["gloo"]))
            print(f"  DDP {world} ranks, sparse embedding: max |braid - gloo| = {diff:.3g}")
            if diff > 1e-6:
                raise AssertionError(f"DDP {world} ranks with a sparse embedding: parameters differ from gloo's by {diff}")


def anysource_body(rank, world, port, backend):
    """dist.recv without src: rank 0 takes one message from every other rank in whatever order
    they come and learns who sent each, as gloo does; then (braid: gloo's send of tag 7 waits for
    its receive, which deadlocks here) a receive of tag 8 from any rank while rank 1's tag-7
    message comes first (held), and the tag-7 one from any rank afterwards."""
    init(rank, world, port, backend)
    if rank == 0:
        got = {}
        for _ in range(world - 1):
            t = torch.zeros(5)
            src = dist.recv(t)
            got[src] = t.tolist()
        want = {q: [q * 10.0 + i for i in range(5)] for q in range(1, world)}
        if got != want:
            raise AssertionError(f"{backend}: recv from any rank gave {got}, not {want}")
    if rank == 0 and backend == "braid":
        t8, t7 = torch.zeros(3), torch.zeros(2)
        src8 = dist.recv(t8, tag=8)
        src7 = dist.recv(t7, tag=7)
        if (src8, src7, t8.tolist(), t7.tolist()) != (1, 1, [8.0] * 3, [7.0] * 2):
            raise AssertionError(f"{backend}: tags from any rank: {src8} {t8.tolist()}, {src7} {t7.tolist()}")
    if rank > 0:
        dist.send(torch.tensor([rank * 10.0 + i for i in range(5)]), dst=0)
        if rank == 1 and backend == "braid":
            dist.send(torch.full((2,), 7.0), dst=0, tag=7)
            dist.send(torch.full((3,), 8.0), dst=0, tag=8)
    dist.barrier()
    if backend == "gloo":
        os._exit(0)  # (as in ddp_body: torch 1.13's gloo teardown)
    dist.destroy_process_group()


def check_recv_from_any_rank():
    for world in (2, 3, 4):
        for backend in ("braid", "gloo"):
            spawn(anysource_body, world, backend)


def check_killed_rank_is_named():
    world = 3
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "err")
        port = free_port()
        spawner = mp.get_context("spawn")
        procs = [spawner.Process(target=killed_rank_body, args=(r, world, port, path)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                raise AssertionError("a rank did not end within 60 s of the kill")
        for rank in range(world - 1):
            with open(f"{path}.{rank}") as f:
                took, msg = f.readline(), f.read()
            if float(took) > 10:
                raise AssertionError(f"rank {rank} took {took.strip()} s to fail")
            if f"rank {world - 1}" not in msg:
                raise AssertionError(f"rank {rank}'s error does not name rank {world - 1}: {msg}")
            print(f"  survivor {rank} failed after {took.strip()} s: {msg.strip()[:160]}")


def check_status_names_the_rank_outside_the_call():
    if "TEST_BRAID_PROGRAM" not in os.environ:
        raise Skipped("TEST_BRAID_PROGRAM (the braid program) is not set")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "status")
        run_ranks(status_body, 2, path)
        with open(f"{path}.0") as f:
            got = json.load(f)
    mine = got["mine"]
    if mine["rank"] != 0 or mine["in_call"] or mine["by_collective"].get("allreduce", {}).get("calls", 0) < 3:
        raise AssertionError(f"braid_torch.status(): {mine}")
    if got["rc"] != 1:
        raise AssertionError(f"braid status exited {got['rc']}: {got['stderr']}")
    verdict = json.loads(got["stdout"])["verdict"]
    if not (verdict.startswith("rank 1 ") and "has not entered allreduce" in verdict):
        raise AssertionError(f"braid status: {verdict}")
    print(f"  braid status: {verdict[:160]}")


CHECKS = [check_collectives, check_coalescing, check_mixed_backends, check_dtypes, check_recv_from_any_rank, check_ddp_matches_gloo, check_sequence_numbers, check_sparse_all_reduce, check_killed_rank_is_named, check_bad_input_raises_on_every_rank,
          check_destroy_with_unwaited_work, check_status_names_the_rank_outside_the_call]

if __name__ == "__main__":
    passed = failed = skipped = 0
    chosen = [c for c in CHECKS if not sys.argv[1:] or c.__name__ in sys.argv[1:]]
    for check in chosen:
        start = time.monotonic()
        try:
            check()
            passed += 1
            print(f"ok   {check.__name__} ({time.monotonic() - start:.1f} s)", flush=True)
        except Skipped as why:
            skipped += 1
            print(f"skip {check.__name__}: {why}", flush=True)
        except Exception:  # noqa: BLE001  (every failure is reported, then counted)
            failed += 1
            print(f"FAIL {check.__name__} ({time.monotonic() - start:.1f} s)", flush=True)
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    sys.exit(1 if failed else 0)
