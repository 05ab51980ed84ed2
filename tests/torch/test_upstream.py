#!/usr/bin/env python3
"""torch's own distributed tests against the braid backend: a chosen list of the CPU tests of
torch/testing/_internal/distributed/distributed_test.py, run as torch's test_distributed_spawn.py
runs them for gloo (3 ranks, file:// init, one process per rank), as a second opinion beside
tests/torch/test_backend.py. torch 2.x only (exit 77 on older torch, with the reason).

Prints one line per test (ok; skip, with torch's reason; xfail, a failure torch causes for every
backend registered from outside it, with the reason; FAIL) and a summary; exits non-zero if any
test failed. Skips are torch's own decisions (a test for another backend or a GPU), never
counted as passes. docs/PYTORCH.md records the last run.

usage: test_upstream.py [--world-size N] [TEST_NAME ...]
  (default: the chosen list at 3 ranks, then the group tests that need 8 at 8)
"""
import os
import subprocess
import sys
import time
import unittest

if len(sys.argv) > 2 and sys.argv[1] == "--world-size":
    os.environ["WORLD_SIZE"] = sys.argv[2]
    del sys.argv[1:3]
os.environ["BACKEND"] = "braid"
os.environ.setdefault("WORLD_SIZE", "3")

import torch  # noqa: E402

if int(torch.__version__.split(".")[0]) < 2:
    print(f"skipped: torch {torch.__version__}: the chosen list is torch 2.x's distributed_test.py "
          "(tools/torch2-check runs it against torch 2.6)")
    sys.exit(77)

import braid_torch  # noqa: E402,F401  (registers the "braid" backend, also in each spawned rank)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# The feature sets torch's decorators consult (gloo, nccl and ucc by name): braid does DDP and
# subgroups on CPU; the GPU and CUDA ones stay out.
for feature in ("ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add("braid")

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestBraidWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


CHOSEN = """
test_get_rank test_get_backend test_destroy_group test_get_rank_size_group test_get_rank_size_full_group
test_new_subgroups test_new_subgroups_by_enumeration test_average_parameters test_periodic_model_averager
test_coalescing_manager test_batch_isend_irecv_gloo test_batch_isend_irecv_gloo_tags test_batch_isend_irecv_op_err
test_send_recv test_send_recv_any_source test_send_recv_with_tag test_isend test_irecv
test_broadcast test_broadcast_group test_broadcast_full_group
test_reduce_sum test_reduce_product test_reduce_min test_reduce_max test_reduce_group_sum test_reduce_full_group_max
test_reduce_sum_twice
test_all_reduce_sum test_all_reduce_sum_async test_all_reduce_sum_complex test_all_reduce_complex_unsupported_ops
test_all_reduce_product test_all_reduce_min test_all_reduce_max test_all_reduce_group_sum test_all_reduce_full_group_max
test_sparse_all_reduce_sum test_all_reduce_coalesced_sum test_all_reduce_coalesced_max
test_scatter_checks test_scatter test_scatter_complex test_scatter_group
test_gather_checks test_gather test_gather_group
test_all_gather test_all_gather_complex test_all_gather_group test_all_gather_coalesced_simple
test_all_gather_coalesced_with_empty
test_all_to_all_single_equal_split test_all_to_all_single_unequal_split test_all_to_all test_all_to_all_complex
test_all_to_all_group
test_barrier test_barrier_group test_barrier_full_group
test_DistributedDataParallelCPU test_DistributedDataParallel_requires_grad test_ddp_zero_output_features
test_accumulate_gradients_no_sync test_get_future test_ddp_hook_parity_allreduce test_ddp_hook_parity_powerSGD
test_static_graph_api_cpu test_DistributedSampler_padding test_ddp_sync_module_states test_ddp_uneven_inputs
test_ddp_join_model_equivalence test_ddp_logging_data_cpu
test_all_gather_object_default_pg test_all_gather_object_subgroup test_gather_object test_broadcast_object_list
test_scatter_object_list test_monitored_barrier_gloo
""".split()

# Those torch runs only from 8 ranks (skip_if_small_worldsize: "small world size").
AT_EIGHT = """
test_broadcast_group test_reduce_group_sum test_all_reduce_group_sum test_scatter_group test_gather_group
test_all_gather_group test_barrier_group
""".split()

# Tests that fail for any backend registered from outside torch, with the reason. Reported as
# such (never as passes); one that passes is reported too.
EXPECTED_FAILURES = {
    "test_ddp_logging_data_cpu": "DDP's logger takes the name from torch's ProcessGroup, which says 'custom' for "
                                 "every backend registered through Backend.register_backend (ProcessGroup.hpp, "
                                 "BackendType::CUSTOM), while the test compares it with dist.get_backend(): 'braid'",
}


def main():
    names = sys.argv[1:] or CHOSEN
    runner = unittest.TextTestRunner(verbosity=0, stream=open(os.devnull, "w"))
    passed, skipped, failed, expected = [], [], [], []
    for name in names:
        t0 = time.monotonic()
        r = runner.run(TestBraidWithSpawn(name))
        took = time.monotonic() - t0
        broke = r.failures or r.errors
        if broke and name in EXPECTED_FAILURES:
            expected.append(name)
            print(f"xfail {name}: {EXPECTED_FAILURES[name]}")
        elif broke:
            failed.append(name)
            print(f"FAIL {name} ({took:.1f} s)")
            for _, trace in r.failures + r.errors:
                lines = [l for l in trace.strip().splitlines() if "Error" in l or "assert" in l.lower()]
                print("     " + (lines[-1] if lines else trace.strip().splitlines()[-1])[:300])
        elif r.skipped:
            skipped.append(name)
            print(f"skip {name}: {r.skipped[0][1][:200]}")
        else:
            passed.append(name)
            print(f"ok   {name} ({took:.1f} s)" + (" (listed as an expected failure)" if name in EXPECTED_FAILURES else ""))
        sys.stdout.flush()
    print(f"torch {torch.__version__}, {os.environ['WORLD_SIZE']} ranks: {len(passed)} passed, {len(skipped)} skipped "
          f"(torch's reasons above), {len(expected)} expected failures, {len(failed)} failed of {len(names)}")
    status = 1 if failed else 0
    if not sys.argv[1:]:
        sys.stdout.flush()
        status |= subprocess.run([sys.executable, os.path.abspath(__file__), "--world-size", "8"] + AT_EIGHT).returncode
    sys.exit(status)


if __name__ == "__main__":
    main()
