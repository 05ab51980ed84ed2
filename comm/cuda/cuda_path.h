// Where a call goes once the API has it: host buffers run as they always did (blocking on the
// calling thread, or on the communicator's worker for braid::Work); CUDA device buffers are staged
// through pinned host memory by the communicator's CUDA proxy (comm/cuda/cuda_proxy.h), ordered with the
// caller's stream. Compiled in every build: without CUDA, device buffers and streams are refused.
#pragma once
#include <memory>

#include "braid/status.hpp"
#include "comm/algorithms/algorithms.h"

namespace braid {

class Comm;
struct WorkState;

namespace cuda {

enum class Memory { kNone, kHost, kDevice };

// What `p` points to, asked of the CUDA driver only if the process has already loaded it (a
// program that never touched CUDA has no device pointers, and Braid does not start CUDA for it).
// Pinned host memory (cudaHostAlloc) counts as host; managed memory counts as device.
Memory memoryOf(const void* p);

// The memory type of the buffers `a` uses on this rank (kNone: it uses none). Mixed host and device
// buffers are an invalid argument, as are device buffers in a build without CUDA.
Result<Memory> classify(const Comm& comm, const CollArgs& a);

// The device the calling thread has made current with a CUDA context, or -1 when it has none
// (nothing chosen yet: the communicator then decides at its first device call, see docs/architecture/cuda.md).
int chosenDevice();

// The C API: host buffers run to completion as before (a non-NULL stream is first waited for);
// device buffers are queued on `stream` and the call returns at once.
Status run(Comm& comm, const CollArgs& a, void* stream);
// A call made between braidGroupStart and braidGroupEnd: checked now (bad arguments are refused at
// once, and leave the group as it was), run at the group's end (Comm::runGroup). Host buffers only.
Status admitToGroup(Comm& comm, const CollArgs& a, void* stream);
// The C++ API: the same, returning the shared state of a braid::Work.
std::shared_ptr<WorkState> submit(Comm& comm, const CollArgs& a, void* stream);

}  // namespace cuda
}  // namespace braid
