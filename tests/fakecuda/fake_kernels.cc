// The kernels of Braid (kernels/reduce_cuda.h) and of the gpu tests (tests/gpu/gpu_util.h) for the
// emulated CUDA of tests/fakecuda: each "launch" is a host function on the stream that does the
// same work with the CPU engine (kernels/reduce.h).
#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "kernels/reduce.h"
#include "kernels/reduce_cuda.h"
#include "tests/gpu/gpu_util.h"

namespace braid {
namespace {

// Runs `work` on `stream` after everything queued before it.
Status launch(void* stream, std::function<void()> work) {
  auto* held = new std::function<void()>(std::move(work));
  cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), [](void* p) {
    auto* f = static_cast<std::function<void()>*>(p);
    (*f)();
    delete f;
  }, held);
  if (e == cudaSuccess) return Status::Ok();
  delete held;
  return Status::CudaError("emulated kernel launch failed");
}

}  // namespace

namespace kernels::gpu {

Status reduce(void* dst, const void* a, const void* b, std::size_t count, DataType t, ReduceOp op, void* stream) {
  if (!isValid(t) || !isValid(op)) return Status::InvalidArgument("bad type or op");
  if (count == 0) return Status::Ok();
  return launch(stream, [=] { kernels::reduce(dst, a, b, count, t, op); });
}

Status reduceMany(void* const* dsts, int ndst, const void* const* srcs, int nsrc, std::size_t count, DataType t,
                  ReduceOp op, int divisor, void* stream) {
  if (!isValid(t) || !isValid(op) || nsrc < 1 || ndst < 1 || ndst > kMaxFoldSources || (ndst > 1 && nsrc > kMaxFoldSources))
    return Status::InvalidArgument("bad type, op, source or destination count");
  if (count == 0) return Status::Ok();
  std::vector<const void*> sources(srcs, srcs + nsrc);
  std::vector<void*> outputs(dsts, dsts + ndst);
  return launch(stream, [=] {
    // Launch by launch as the GPU version chains them: groups of kMaxFoldSources sources, each later
    // group folding the first destination with its sources, so that a destination aliasing a source
    // beyond the first group shows as wrong results here too. Within a launch every element is read
    // from all sources before any destination is written: a temporary.
    const std::size_t bytes = count * dataTypeSize(t);
    std::vector<std::byte> acc(bytes);
    std::size_t done = 0;
    while (done < sources.size()) {
      std::vector<const void*> group;
      if (done > 0) group.push_back(outputs[0]);
      while (group.size() < static_cast<std::size_t>(kMaxFoldSources) && done < sources.size()) group.push_back(sources[done++]);
      std::memcpy(acc.data(), group[0], bytes);
      for (std::size_t j = 1; j < group.size(); ++j) kernels::reduce(acc.data(), acc.data(), group[j], count, t, op);
      if (divisor > 1 && done == sources.size()) kernels::divide(acc.data(), count, t, divisor);
      for (void* d : outputs) std::memcpy(d, acc.data(), bytes);
    }
  });
}

Status divide(void* x, std::size_t count, DataType t, int divisor, void* stream) {
  if (!isValid(t) || divisor < 1) return Status::InvalidArgument("bad type or divisor");
  if (count == 0) return Status::Ok();
  return launch(stream, [=] { kernels::divide(x, count, t, divisor); });
}

}  // namespace kernels::gpu

namespace test {

void launchDelayedCopy(void* dst, const void* src, std::size_t bytes, unsigned delayUs, cudaStream_t stream) {
  (void)launch(stream, [=] {
    std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    std::memcpy(dst, src, bytes);
  });
}

void launchSnapshot(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  (void)launch(stream, [=] { std::memcpy(dst, src, bytes); });
}

}  // namespace test
}  // namespace braid
