// The kernels of Braid (kernels/reduce_cuda.h) and of the gpu tests (tests/gpu/gpu_util.h) for the
// emulated CUDA of tests/fakecuda: each "launch" is a host function on the stream that does the
// same work with the CPU engine (kernels/reduce.h).
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/half.h"
#include "kernels/reduce.h"
#include "kernels/reduce_cuda.h"
#include "tests/gpu/gpu_util.h"

namespace braid {
namespace {

// Lazy loading as CUDA does it by default: loading a kernel (at its first launch, or Braid's all at
// once in preload()) may wait for every stream of the process (fakecudaSynchronizeWithin). Where that
// wait cannot end because the unfinished work waits for the loading thread (a stream held until that
// thread says "done"), a real GPU hangs for good; here the process aborts after 60 s, naming what
// was being loaded.
extern "C" int fakecudaSynchronizeWithin(double seconds);
std::mutex loadedMu;
std::set<std::string> loaded;
const char* const kBraidKernels[] = {"fold", "divide", "convert", "finite check"};  // (the test's kernels are not Braid's)

void load(const std::vector<std::string>& kernels, const char* what) {
  {
    std::lock_guard<std::mutex> g(loadedMu);  // not held while waiting: launching a loaded kernel waits for nothing
    bool all = true;
    for (const std::string& k : kernels) all = all && loaded.count(k);
    if (all) return;
  }
  if (fakecudaSynchronizeWithin(60)) {
    std::lock_guard<std::mutex> g(loadedMu);
    loaded.insert(kernels.begin(), kernels.end());
    return;
  }
  std::fprintf(stderr, "fakecuda: loading %s waited 60 s for the context to synchronize: a stream is held by work that "
               "waits for this thread, which hangs on a GPU (CUDA loads kernels lazily); load kernels before holding "
               "streams (kernels::gpu::preload)\n", what);
  std::abort();
}
void lazyLoad(const char* kernel) { load({kernel}, (std::string("the ") + kernel + " kernel at its first launch").c_str()); }

// Runs `work` on `stream` after everything queued before it, as kernel `kernel`.
Status launch(const char* kernel, void* stream, std::function<void()> work) {
  lazyLoad(kernel);
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
  return launch("fold", stream, [=] { kernels::reduce(dst, a, b, count, t, op); });
}

Status reduceMany(void* const* dsts, int ndst, const void* const* srcs, int nsrc, std::size_t count, DataType t,
                  ReduceOp op, int divisor, void* stream) {
  if (!isValid(t) || !isValid(op) || nsrc < 1 || ndst < 1 || ndst > kMaxFoldSources || (ndst > 1 && nsrc > kMaxFoldSources))
    return Status::InvalidArgument("bad type, op, source or destination count");
  if (count == 0) return Status::Ok();
  std::vector<const void*> sources(srcs, srcs + nsrc);
  std::vector<void*> outputs(dsts, dsts + ndst);
  return launch("fold", stream, [=] {
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

Status preload() {
  load(std::vector<std::string>(std::begin(kBraidKernels), std::end(kBraidKernels)), "Braid's kernels (preload)");
  return Status::Ok();
}

Status divide(void* x, std::size_t count, DataType t, int divisor, void* stream) {
  if (!isValid(t) || divisor < 1) return Status::InvalidArgument("bad type or divisor");
  if (count == 0) return Status::Ok();
  return launch("divide", stream, [=] { kernels::divide(x, count, t, divisor); });
}

namespace {
// One element of a floating type as the GPU's codecs read and write it (kernels/half.h, the same functions).
double loadFloat(const std::byte* p, DataType t) {
  std::uint16_t h;
  switch (t) {
    case DataType::kFloat16: std::memcpy(&h, p, 2); return kernels::halfToFloat(h);
    case DataType::kBfloat16: std::memcpy(&h, p, 2); return kernels::bf16ToFloat(h);
    case DataType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    default: { double d; std::memcpy(&d, p, 8); return d; }
  }
}
}  // namespace

Status convert(void* dst, DataType to, const void* src, DataType from, std::size_t count, int divisor, void* stream) {
  const auto wide = [](DataType t) { return t == DataType::kFloat32 || t == DataType::kFloat64; };
  if (!isFloating(to) || !isFloating(from) || wide(to) == wide(from)) return Status::InvalidArgument("convert: not a wire pair");
  if (count == 0) return Status::Ok();
  return launch("convert", stream, [=] {
    const auto* in = static_cast<const std::byte*>(src);
    auto* out = static_cast<std::byte*>(dst);
    for (std::size_t i = 0; i < count; ++i) {
      // The source's arithmetic: float for 16-bit types and float32, double for float64.
      double v = loadFloat(in + i * dataTypeSize(from), from);
      if (divisor > 1) v = from == DataType::kFloat64 ? v / divisor : static_cast<float>(v) / static_cast<float>(divisor);
      std::byte* o = out + i * dataTypeSize(to);
      const float f = static_cast<float>(v);
      std::uint16_t h = 0;
      switch (to) {
        case DataType::kFloat16: h = kernels::floatToHalf(f); std::memcpy(o, &h, 2); break;
        case DataType::kBfloat16: h = kernels::floatToBf16(f); std::memcpy(o, &h, 2); break;
        case DataType::kFloat32: std::memcpy(o, &f, 4); break;
        default: std::memcpy(o, &v, 8); break;
      }
    }
  });
}

Status flagNonFinite(const void* x, std::size_t count, DataType t, std::int32_t* flag, std::int32_t value, void* stream) {
  if (!isFloating(t) || count == 0) return Status::Ok();
  return launch("finite check", stream, [=] {
    for (std::size_t i = 0; i < count; ++i)
      if (!std::isfinite(loadFloat(static_cast<const std::byte*>(x) + i * dataTypeSize(t), t))) *flag = value;
  });
}

}  // namespace kernels::gpu

namespace test {

void launchDelayedCopy(void* dst, const void* src, std::size_t bytes, unsigned delayUs, cudaStream_t stream) {
  (void)launch("delayed copy (test)", stream, [=] {
    std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    std::memcpy(dst, src, bytes);
  });
}

void launchSnapshot(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  (void)launch("snapshot (test)", stream, [=] { std::memcpy(dst, src, bytes); });
}

}  // namespace test
}  // namespace braid
