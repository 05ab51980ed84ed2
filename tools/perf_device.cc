#include "tools/perf_device.h"

#include "braid_build_config.h"
#include "base/config.h"
#if BRAID_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace braid::tools::device {
namespace {
std::string gError;
}  // namespace

std::string error() { return gError; }

#if BRAID_HAVE_CUDA
namespace {
bool ok(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return true;
  gError = std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  return false;
}
cudaStream_t gStream = nullptr;
}  // namespace

std::string select() {
  int count = 0;
  if (!ok(cudaGetDeviceCount(&count), "cudaGetDeviceCount")) return gError;
  if (count < 1) return "no CUDA device";
  auto le = readLaunchEnv();
  int dev = le.ok() && le->localRank >= 0 ? le->localRank % count : 0;
  if (!ok(cudaSetDevice(dev), "cudaSetDevice") || !ok(cudaFree(nullptr), "creating the CUDA context")) return gError;
  if (!ok(cudaStreamCreateWithFlags(&gStream, cudaStreamNonBlocking), "cudaStreamCreate")) return gError;
  return "";
}
void* alloc(std::size_t bytes) {
  void* p = nullptr;
  if (!ok(cudaMalloc(&p, bytes), "cudaMalloc") || !ok(cudaMemset(p, 0, bytes), "cudaMemset")) return nullptr;
  return p;
}
void release(void* p) { cudaFree(p); }
bool upload(void* dst, const void* src, std::size_t bytes) {
  return !bytes || ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
}
bool download(void* dst, const void* src, std::size_t bytes) {
  return !bytes || ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
}
void* stream() { return gStream; }
bool sync(void* s) { return ok(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize"); }
void* capture(void* s, const std::function<bool()>& body) {
  auto st = static_cast<cudaStream_t>(s);
  if (!ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture")) return nullptr;
  const bool made = body();
  cudaGraph_t graph = nullptr;
  if (!ok(cudaStreamEndCapture(st, &graph), "cudaStreamEndCapture") || !made) {
    if (!made && gError.empty()) gError = "a call failed during the capture";
    if (graph) cudaGraphDestroy(graph);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const bool instantiated = ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return instantiated ? exec : nullptr;
}
bool launch(void* g, void* s) {
  return ok(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g), static_cast<cudaStream_t>(s)), "cudaGraphLaunch");
}
void releaseGraph(void* g) {
  if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
}
std::string describe() {
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "";
  return std::string(p.name) + " (device " + std::to_string(dev) + ")";
}
#else
namespace {
const char* kNoCuda = "this build of Braid has no CUDA support (configure with -Dcuda=enabled)";
}
std::string select() { return gError = kNoCuda; }
void* alloc(std::size_t) { gError = kNoCuda; return nullptr; }
void release(void*) {}
bool upload(void*, const void*, std::size_t) { gError = kNoCuda; return false; }
bool download(void*, const void*, std::size_t) { gError = kNoCuda; return false; }
void* stream() { return nullptr; }
bool sync(void*) { gError = kNoCuda; return false; }
void* capture(void*, const std::function<bool()>&) { gError = kNoCuda; return nullptr; }
bool launch(void*, void*) { gError = kNoCuda; return false; }
void releaseGraph(void*) {}
std::string describe() { return ""; }
#endif

}  // namespace braid::tools::device
