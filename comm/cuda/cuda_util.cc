#include "comm/cuda/cuda_util.h"

#include <chrono>
#include <thread>

namespace braid::cuda {

std::string failedText(const char* call, cudaError_t e) {
  return std::string(call) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
}

Status failed(const char* call, cudaError_t e) { return Status::CudaError(failedText(call, e)); }

cudaError_t polled(cudaError_t e) {
  if (e == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
  return e;
}

namespace {

long long nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Polls `query` (cudaStreamQuery, cudaEventQuery) until it says done.
template <class Query>
Status pollUntilDone(Query query, double seconds, const char* call, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  PollPause pause;
  for (;;) {
    cudaError_t e = query();
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return Status::CudaError(std::string(what) + ": " + failedText(call, e));
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Timeout(std::string(what) + " did not finish within BRAID_TIMEOUT (" +
                             std::to_string(static_cast<long>(seconds)) + " s)");
    pause();
  }
}

}  // namespace

PollPause::PollPause() : start_ns_(nowNs()) {}

void PollPause::operator()() {
  const long long waited = nowNs() - start_ns_;
  if (waited < 200'000) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(waited < 10'000'000 ? 20 : 500));
}

Status waitForStream(cudaStream_t stream, double seconds, const char* what) {
  return pollUntilDone([&] { return polled(cudaStreamQuery(stream)); }, seconds, "cudaStreamQuery", what);
}

Status waitForEvent(cudaEvent_t event, double seconds, const char* what) {
  return pollUntilDone([&] { return polled(cudaEventQuery(event)); }, seconds, "cudaEventQuery", what);
}

DeviceScope::DeviceScope(int device) {
  if (device < 0) return;  // none chosen: stay where the thread is
  if ((error_ = cudaGetDevice(&previous_)) != cudaSuccess) {
    failedCall_ = "cudaGetDevice";
    return;
  }
  if (previous_ == device) return;
  if ((error_ = cudaSetDevice(device)) != cudaSuccess) {
    failedCall_ = "cudaSetDevice";
    return;
  }
  switched_ = true;
}

DeviceScope::~DeviceScope() {
  if (switched_) cudaSetDevice(previous_);
}

}  // namespace braid::cuda
