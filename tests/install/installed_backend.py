"""The torch suite's collectives check (tests/torch/test_backend.py: every collective on 1 to 4
ranks, exact) run against an installed braid_torch: the install suite runs it with the venv's
interpreter, outside the source and build trees."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))

import braid_torch  # noqa: E402
import test_backend  # noqa: E402

if __name__ == "__main__":
    test_backend.check_collectives()
    print(f"check_collectives passed with braid_torch from {os.path.dirname(braid_torch.__file__)}")
