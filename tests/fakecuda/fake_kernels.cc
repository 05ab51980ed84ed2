// The gpu tests' own kernels (tests/gpu/gpu_util.h) for the emulated CUDA of tests/fakecuda: each
// "launch" is a host function on the stream that does the same work. Braid's kernels run their own
// code there (kernels/reduce_cuda.cu compiled for the CPU: simt.h, reduce_cuda_simt.cc).
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/fakecuda/simt.h"
#include "tests/gpu/gpu_util.h"

namespace braid::test {

void launchDelayedCopy(void* dst, const void* src, std::size_t bytes, unsigned delayUs, cudaStream_t stream) {
  static const char kName[] = "the delayed copy kernel (test)";
  simt::onStream(kName, kName, stream, [=] {
    std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    std::memcpy(dst, src, bytes);
  });
}

void launchSnapshot(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  static const char kName[] = "the snapshot kernel (test)";
  simt::onStream(kName, kName, stream, [=] { std::memcpy(dst, src, bytes); });
}

}  // namespace braid::test
