"""Braid as a torch.distributed backend.

    import braid_torch                      # registers the backend "braid"
    torch.distributed.init_process_group("braid", init_method="env://")

The process group rendezvouses through the store torch gives it (env://, tcp://, file://), runs
every collective on Braid's C++ API, and raises Braid's error (rank, peer, collective, sequence
number) as a RuntimeError. See docs/PYTORCH.md for what is supported.
"""
import torch.distributed as _dist

from ._C import ProcessGroupBraid, create as _create


def _create_braid(store, rank, size, timeout):
    return _create(store, rank, size, timeout)


if not hasattr(_dist.Backend, "BRAID"):
    _dist.Backend.register_backend("braid", _create_braid)

__all__ = ["ProcessGroupBraid"]
