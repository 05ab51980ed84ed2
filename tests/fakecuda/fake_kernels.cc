// The gpu tests' own kernels (tests/gpu/gpu_util.h) for the emulated CUDA of tests/fakecuda: each
// "launch" is a host function on the stream that does the same work. Braid's kernels run their own
// code there (kernels/reduce_cuda.cu compiled for the CPU: simt.h, reduce_cuda_simt.cc).
#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "tests/gpu/gpu_util.h"

extern "C" void fakecudaLoadKernel(const void* kernel, const char* what);

namespace braid::test {
namespace {

// Runs `work` on `stream` after everything queued before it, as the kernel named `name` (loaded at
// its first launch, as CUDA's lazy loading does: fakecudaLoadKernel).
void launch(const char* name, cudaStream_t stream, std::function<void()> work) {
  fakecudaLoadKernel(name, name);
  auto* held = new std::function<void()>(std::move(work));
  if (cudaLaunchHostFunc(stream, [](void* p) {
        auto* f = static_cast<std::function<void()>*>(p);
        (*f)();
        delete f;
      }, held) != cudaSuccess)
    delete held;
}

}  // namespace

void launchDelayedCopy(void* dst, const void* src, std::size_t bytes, unsigned delayUs, cudaStream_t stream) {
  launch("the delayed copy kernel (test)", stream, [=] {
    std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    std::memcpy(dst, src, bytes);
  });
}

void launchSnapshot(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  launch("the snapshot kernel (test)", stream, [=] { std::memcpy(dst, src, bytes); });
}

}  // namespace braid::test
