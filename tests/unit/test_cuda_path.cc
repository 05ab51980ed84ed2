// The host side of the CUDA dispatch (comm/cuda/cuda_path.h), which every build runs: in a process that
// has not loaded the CUDA driver, every pointer is host memory, no device counts as chosen, and the
// answer stays cheap when asked again (the missing driver is cached by the loader's load counter).
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "braid/braid.h"
#include "base/config.h"
#include "comm/cuda/cuda_path.h"

namespace braid {
namespace {

TEST(CudaPath, WithoutTheDriverEverythingIsHostMemory) {
  std::vector<float> v(16);
  EXPECT_EQ(cuda::memoryOf(nullptr), cuda::Memory::kNone);
  EXPECT_EQ(cuda::memoryOf(v.data()), cuda::Memory::kHost);
  EXPECT_EQ(cuda::memoryOf(&v), cuda::Memory::kHost);
  EXPECT_EQ(cuda::chosenDevice(), -1);
}

TEST(CudaPath, AskingAgainIsCheap) {
  std::vector<float> v(16);
  (void)cuda::memoryOf(v.data());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(cuda::memoryOf(v.data() + i % 16), cuda::Memory::kHost);
  const double perCallUs = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 10000;
  EXPECT_LT(perCallUs, 5.0) << "a host pointer's memory type costs " << perCallUs << " us (dlopen on every call?)";
}

TEST(CudaPath, TheWaitMechanismIsAValidatedKnob) {
  setenv("BRAID_CUDA_WAIT", "sometimes", 1);
  EXPECT_EQ(Config::fromEnvironment().status().code(), Code::kInvalidArgument);
  setenv("BRAID_CUDA_WAIT", "hostfn", 1);
  auto c = Config::fromEnvironment();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cudaWait, "hostfn");
  unsetenv("BRAID_CUDA_WAIT");
  EXPECT_EQ(Config::fromEnvironment()->cudaWait, "auto");
}

}  // namespace
}  // namespace braid
