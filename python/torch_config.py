"""What python/meson.build needs to know about the torch this interpreter imports, one key=value a line.

  version   torch.__version__
  major     its major version (1: collectives on c10d::ProcessGroup; 2: on c10d::Backend)
  include   the directory holding torch/csrc/distributed/c10d/ProcessGroup.hpp: one of torch's own
            include paths (pip wheels), or /usr/include (Debian's libtorch-dev), or nothing
  pybind11  1 when that directory also holds pybind11's headers (pip wheels ship the pybind11 torch
            was built with; Debian's torch uses pybind11-dev's)
  libdir    the directory of libtorch_cpu.so (torch's own lib/, else empty: the system's)
  cxx11abi  1 when torch was built with the C++11 std::string ABI (Braid's C++ API needs it)
  cuda      1 when this torch was built with CUDA
Exits non-zero, with the reason on stderr, when torch cannot be imported.
"""
import os
import sys

try:
    import torch
    import torch.utils.cpp_extension as ext
except Exception as e:  # noqa: BLE001 - any failure means "no torch here", with its reason
    sys.exit(f"cannot import torch: {e}")

HEADER = os.path.join("torch", "csrc", "distributed", "c10d", "ProcessGroup.hpp")
include = next((d for d in ext.include_paths() + ["/usr/include"] if os.path.exists(os.path.join(d, HEADER))), "")
libdir = next((d for d in ext.library_paths() if os.path.exists(os.path.join(d, "libtorch_cpu.so"))), "")
print(f"version={torch.__version__}")
print(f"major={torch.__version__.split('.')[0]}")
print(f"include={include}")
print(f"pybind11={int(bool(include) and include != '/usr/include' and os.path.exists(os.path.join(include, 'pybind11', 'pybind11.h')))}")
print(f"libdir={libdir}")
print(f"cxx11abi={int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))}")
print(f"cuda={int(torch.version.cuda is not None)}")
