// WorkBraid: the c10d::Work that every call of ProcessGroupBraid returns, over one braid::Work.
#pragma once
#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

// torch >= 2.1: its coalescing (torch.distributed's _coalescing_manager, and batch_isend_irecv on
// devices) calls on the backend (ProcessGroupBraid::startCoalescing, WorkAll).
#define BRAID_TORCH_COALESCING (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "braid/braid.hpp"

namespace braid::torch_backend {

// Done when Braid's work is, with a future that completes then (DDP's comm hooks wait on it).
// `after` runs first, on success (copies results into non-contiguous or list outputs); `keep`
// holds the buffers Braid uses until then.
//
// Outputs on a device (CUDA): the call was ordered on torch's current stream there, so `after`
// runs at once, on the caller's thread, queued on that stream behind the call; the future is a
// device future whose completion is recorded on that stream, and wait() (and the future's wait)
// make the waiter's current stream wait for it, as NCCL's Works do.
class WorkBraid : public c10d::Work {
 public:
  static c10::intrusive_ptr<c10d::Work> start(int rank, c10d::OpType type, braid::Work work, std::vector<at::Tensor> outputs,
                                              std::vector<at::Tensor> keep = {}, std::function<void()> after = {});
  // A Work whose Braid call is made later (attach or fail): until then wait(), isCompleted() and
  // getFuture() first call `flush`, which makes it (the pending sends and receives: p2p.h).
  static c10::intrusive_ptr<WorkBraid> deferred(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                                                std::vector<at::Tensor> keep, std::function<void()> after,
                                                std::function<void()> flush);
  // A deferred Work's call: it completes when `work` does.
  static void attach(const c10::intrusive_ptr<WorkBraid>& self, braid::Work work);
  // A deferred Work that ends now with `error` (its call is not made).
  static void fail(const c10::intrusive_ptr<WorkBraid>& self, const braid::Status& error);
  // Before attach: `f` runs on success ahead of `after` (a receive met by a message that arrived
  // earlier copies it into the receive's buffer).
  void before(std::function<void()> f);
  // A receive from any rank: the rank its message came from, which sourceRank() returns.
  void setSource(int rank) { source_ = rank; }
  int sourceRank() const override { return source_ >= 0 ? source_ : c10d::Work::sourceRank(); }

  WorkBraid(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  void kick();
  void complete(const braid::Status& s);
  bool onDevice() const { return stream_.has_value(); }

  int source_ = -1;
  braid::Work work_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> after_;
  std::mutex flushMu_;
  std::function<void()> flush_;  // set until attach or fail
  std::optional<c10::Stream> stream_;  // device outputs: the caller's stream the call is ordered on
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

#if BRAID_TORCH_COALESCING
// One Work over several (endCoalescing's): done when each is, failed with the first error among
// them; its future holds every part's result tensors, in order. (Host tensors only: the parts are
// sends and receives.)
class WorkAll : public c10d::Work {
 public:
  static c10::intrusive_ptr<c10d::Work> over(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts);
  WorkAll(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts);

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::exception_ptr exception() const override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
#endif

}  // namespace braid::torch_backend
