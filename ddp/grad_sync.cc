// GradSync's public face: creation (validate, lay out, agree, broadcast) and thin forwards to the
// step machine in step.cc. Creation lays out the buckets before the agreement on purpose: an
// allocation that fails on one rank then becomes that rank's verdict in the agreement, and every
// rank returns an error instead of the others waiting in the broadcast.
#include <cstring>
#include <string>

#include "braid/ddp.hpp"
#include "ddp/grad_sync_state.h"
#include "ddp/registration.h"

namespace braid::ddp {

namespace detail {

GradSyncState::~GradSyncState() {
  // The worker thread may still be writing into bucket memory; it must outlive those calls.
  for (Bucket& b : buckets) {
    if (b.launched) (void)b.work.wait();
  }
}

Status GradSyncState::prepare() {
  onDevice = !params.empty() && params[0].memory == MemoryType::kDevice;
  if (Status s = layoutBuckets(params, options, buckets, slots); !s.ok()) return s;
  infos.clear();
  for (const Bucket& b : buckets) infos.push_back(b.info);
  marked.assign(params.size(), 0);
  usedInWindow.assign(params.size(), 0);
  nonFinite.assign(params.size(), 0);
  if (onDevice && agrees()) {
    auto memory = BucketMemory::allocate(numFlags() * sizeof(std::int32_t), params[0].data, options.stream);
    if (!memory.ok()) return memory.status();
    deviceFlags = std::move(memory).value();
    nobody.assign(params.size(), kNobody);
    resetFiniteFlags();
    Status s = copyFailure;
    copyFailure = Status::Ok();
    return s;
  }
  return Status::Ok();
}

Status GradSyncState::broadcastParameters() {
  if (comm.size() == 1) return Status::Ok();
  // Bucket memory doubles as the staging area: one broadcast per bucket instead of per parameter.
  const bool root = comm.rank() == 0;
  // (Device parameters: all of it queued on the stream, in this order.)
  if (root) {
    for (std::size_t p = 0; p < params.size(); ++p)
      copy(slotData(p), params[p].data, paramBytes(p), "cudaMemcpyAsync (a parameter into bucket memory)");
  }
  std::vector<Work> works;
  for (Bucket& b : buckets) {
    works.push_back(comm.broadcast(b.storage.data(), b.storage.data(), b.info.count, b.info.dtype, 0, stream()));
  }
  Status first = copyFailure;
  for (Work& w : works) {
    Status s = w.wait();
    if (first.ok() && !s.ok()) first = s;
  }
  if (!first.ok()) return first.withContext("GradSync::create: broadcasting parameters from rank 0");
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (!root) copy(params[p].data, slotData(p), paramBytes(p), "cudaMemcpyAsync (rank 0's value into a parameter)");
    zero(slotData(p), paramBytes(p), "cudaMemsetAsync (bucket memory)");  // with views, gradients start at zero
  }
  first = copyFailure;
  copyFailure = Status::Ok();
  if (onDevice) {
    // A copy that could not be queued (rank 0's: every rank got garbage) fails create on every rank.
    std::int32_t failed = first.ok() ? kNobody : static_cast<std::int32_t>(comm.rank());
    Status s = comm.allReduce(&failed, &failed, 1, DataType::kInt32, ReduceOp::kMin).wait();
    if (!s.ok()) return s.withContext("GradSync::create: agreeing on the parameter copies");
    if (first.ok() && failed != kNobody)
      return Status::RemoteError("GradSync::create: rank " + std::to_string(failed) +
                                 " could not queue its parameter copies on its stream (its own error says why)");
  }
  return first.withContext("GradSync::create");
}

}  // namespace detail

Result<GradSync> GradSync::create(Communicator comm, std::vector<Parameter> params, GradSyncOptions options) {
  auto state = std::make_unique<detail::GradSyncState>(std::move(comm));
  state->params = std::move(params);
  state->options = options;
  Status local = detail::validateLocally(state->params, options);
  if (local.ok()) local = state->prepare();
  if (Status s = detail::agreeOnRegistration(state->comm, state->params, options, local); !s.ok()) return s;
  if (Status s = state->broadcastParameters(); !s.ok()) return s;
  return GradSync(std::move(state));
}

GradSync::GradSync(std::unique_ptr<detail::GradSyncState> s) : state_(std::move(s)) {}
GradSync::GradSync(GradSync&&) noexcept = default;
GradSync& GradSync::operator=(GradSync&&) noexcept = default;
GradSync::~GradSync() = default;

Status GradSync::markReady(std::size_t index) {
  if (!state_) return Status::InvalidUsage("GradSync::markReady on a moved-from GradSync");
  return state_->markReady(index);
}

Status GradSync::finish() {
  if (!state_) return Status::InvalidUsage("GradSync::finish on a moved-from GradSync");
  return state_->finish();
}

NoSyncGuard GradSync::noSync() { return NoSyncGuard(state_.get()); }

void* GradSync::gradient(std::size_t index) const {
  if (!state_ || index >= state_->params.size()) return nullptr;
  if (state_->options.gradientsAsBucketViews) return state_->slotData(index);
  return state_->params[index].grad;
}

std::size_t GradSync::numParameters() const { return state_ ? state_->params.size() : 0; }
const Parameter& GradSync::parameter(std::size_t index) const { return state_->params[index]; }
const std::vector<BucketInfo>& GradSync::buckets() const { return state_->infos; }
const GradSyncOptions& GradSync::options() const { return state_->options; }

NoSyncGuard::NoSyncGuard(detail::GradSyncState* s) : state_(s) {
  if (state_) ++state_->noSyncDepth;
}
NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept : state_(other.state_) { other.state_ = nullptr; }
NoSyncGuard::~NoSyncGuard() {
  if (state_) --state_->noSyncDepth;
}

}  // namespace braid::ddp
