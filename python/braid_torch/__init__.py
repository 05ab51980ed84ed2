"""Braid as a torch.distributed backend.

    import braid_torch                      # registers the backend "braid"
    torch.distributed.init_process_group("braid", init_method="env://")

The process group rendezvouses through the store torch gives it (env://, tcp://, file://), runs
every collective on Braid's C++ API, and raises Braid's error (rank, peer, collective, sequence
number) as a RuntimeError. See docs/PYTORCH.md for what is supported.
"""
import atexit
import inspect
import json

import torch
import torch.distributed as _dist

from ._C import ProcessGroupBraid, create as _create, cuda as _cuda, _finish_all_queued

# Calls still queued when the interpreter exits (a DDP comm hook's last all-reduce, an async call
# nobody waited on) run now, while Python can still run their futures' callbacks.
atexit.register(_finish_all_queued)


def _create_braid(store, rank, size, timeout):
    return _create(store, rank, size, timeout)


if not hasattr(_dist.Backend, "BRAID"):
    # torch 2.1 and later ask which device types a backend serves (and warn when not told); CUDA
    # tensors where this build takes them (torch with CUDA, Braid with -Dcuda).
    if "devices" in inspect.signature(_dist.Backend.register_backend).parameters:
        _dist.Backend.register_backend("braid", _create_braid, devices=["cpu", "cuda"] if _cuda else ["cpu"])
    else:
        _dist.Backend.register_backend("braid", _create_braid)


def _braid_of(group):
    """The ProcessGroupBraid that runs `group`'s calls, or None when another backend runs them.

    In torch 1.13 the group is the ProcessGroupBraid itself; in torch 2.x a group holds one backend
    per device type, and Braid's is the CPU one (inside torch's wrapper under
    TORCH_DISTRIBUTED_DEBUG=DETAIL).
    """
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupBraid):
        return pg
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except (AttributeError, RuntimeError):  # torch 1.13's other groups; a group without a CPU backend
        return None
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: torch 2.x wraps every backend in a _ProcessGroupWrapper.
    backend = getattr(backend, "wrapped_pg", backend)
    return backend if isinstance(backend, ProcessGroupBraid) else None


def status(group=None):
    """What this rank is doing now, as `braid status` hears it: a dict with the call it is in (if
    any) and for how long, the bytes it has moved, the peer it last waited on, and its calls,
    failures, bytes and seconds per collective (by_collective)."""
    pg = _braid_of(group)
    if pg is None:
        raise ValueError("braid_torch.status: the group is not run by the braid backend")
    return json.loads(pg._status_record())


def unique_id(group=None):
    """The group's rendezvous as `braid status --unique-id` takes it ("host:port/nonce"). The nonce
    admits a process to the job's store: share it as the job's secret."""
    pg = _braid_of(group)
    if pg is None:
        raise ValueError("braid_torch.unique_id: the group is not run by the braid backend")
    return pg._unique_id()


_torch_batch_isend_irecv = _dist.batch_isend_irecv


def batch_isend_irecv(p2p_op_list):
    """torch.distributed.batch_isend_irecv, with a batch on a Braid group run as one Braid group.

    Torch groups a batch only for NCCL (torch 2.x: for CUDA tensors) and otherwise issues the
    operations one by one, which deadlocks on a backend whose calls run in order once two ranks
    both send a large message before receiving. This runs the batch as braidGroupStart/End would; other backends' batches go
    to torch's own function. Returns one request per operation.
    """
    if not p2p_op_list:
        return _torch_batch_isend_irecv(p2p_op_list)
    group = p2p_op_list[0].group
    pg = _braid_of(group)
    if pg is None:
        return _torch_batch_isend_irecv(p2p_op_list)
    ops = []
    for op in p2p_op_list:
        if op.group is not group:
            raise RuntimeError("braid: all operations of a batch_isend_irecv must use the same group")
        peer = getattr(op, "group_peer", None)  # torch 2.5 and later say the peer's rank in the group
        if peer is None:
            peer = op.peer if group is None else _dist.distributed_c10d._get_group_rank(group, op.peer)
        ops.append((op.op in (_dist.isend, _dist.send), op.tensor, peer, op.tag))
    return pg._batch_isend_irecv(ops)


_dist.batch_isend_irecv = batch_isend_irecv

_torch_monitored_barrier = _dist.monitored_barrier


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier, which torch refuses for every backend but gloo.

    On a Braid group it runs the group's own (ProcessGroupBraid.monitored_barrier): rank 0 waits
    up to `timeout` (default: the group's timeout) for every other rank and raises naming the first
    that did not arrive, or all of them with wait_all_ranks=True; the other ranks raise with rank
    0's verdict. Other backends go to torch's own function.
    """
    pg = _braid_of(group)
    if pg is None:
        return _torch_monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
    if timeout is None:
        return pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


_dist.monitored_barrier = monitored_barrier

__all__ = ["ProcessGroupBraid"]
