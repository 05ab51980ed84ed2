// One training step of the gradient layer. The rule that shapes everything here: a rank may never
// queue a collective that another rank does not queue at the same position, or the other ranks
// wait until BRAID_TIMEOUT. So nothing that only one rank knows (a parameter it did not mark, a NaN
// it saw) may change what it sends. Every rank always sends every bucket and, when there is
// anything to agree on, the flags; the decision is taken afterwards from the reduced flags, which
// are the same on every rank.
#include <algorithm>
#include <cstring>
#include <string>

#include "ddp/device.h"
#include "ddp/grad_sync_state.h"
#include "ddp/numeric.h"

namespace braid::ddp::detail {

std::byte* GradSyncState::slotData(std::size_t param) const {
  const Slot& s = slots[param];
  const Bucket& b = buckets[s.bucket];
  return b.storage.data() + s.offset * dataTypeSize(b.info.dtype);
}

std::size_t GradSyncState::paramBytes(std::size_t param) const {
  return params[param].count * dataTypeSize(params[param].dtype);
}

void GradSyncState::copy(void* dst, const void* src, std::size_t bytes, const char* what) {
  if (!onDevice) {
    std::memcpy(dst, src, bytes);
    return;
  }
  keep(device::copy(dst, src, bytes, options.stream, what));
}

void GradSyncState::zero(void* dst, std::size_t bytes, const char* what) {
  if (!onDevice) {
    std::memset(dst, 0, bytes);
    return;
  }
  keep(device::zero(dst, bytes, options.stream, what));
}

void GradSyncState::resetFiniteFlags() {
  copy(deviceFlag(params.size() + 1), nobody.data(), params.size() * sizeof(std::int32_t),
       "cudaMemcpyAsync (resetting the finite checks' flags)");
}

Status GradSyncState::markReady(std::size_t index) {
  if (index >= params.size()) {
    return Status::InvalidArgument("GradSync::markReady: index " + std::to_string(index) + " is outside 0.." +
                                   std::to_string(params.size()) + " (registered parameters)");
  }
  if (!stepActive && noSyncDepth > 0) {
    usedInWindow[index] = 1;
    return Status::Ok();
  }
  if (marked[index]) {
    return Status::InvalidUsage("GradSync::markReady: parameter '" + params[index].name + "' (#" +
                                std::to_string(index) + ") was marked ready twice in one step; finish() ends a step");
  }
  stepActive = true;
  marked[index] = 1;
  if (!options.gradientsAsBucketViews)
    copy(slotData(index), params[index].grad, paramBytes(index), "cudaMemcpyAsync (a gradient into its bucket)");
  Bucket& b = buckets[slots[index].bucket];
  if (--b.pending == 0) launchReady();
  // (a failed copy still counts as marked: every rank must go on to queue the same all-reduces)
  return copyFailure.withContext("GradSync::markReady");
}

void GradSyncState::launchReady() {
  // A full bucket behind one that is not full yet waits: starting it first would put this rank's
  // all-reduces in a different order from a rank whose gradients arrived in another order.
  while (nextLaunch < buckets.size() && buckets[nextLaunch].pending == 0) launch(buckets[nextLaunch++]);
}

void GradSyncState::launch(Bucket& b) {
  if (options.checkFinite) {
    for (std::size_t p : b.info.params) {
      if (!onDevice) {
        if (!allFinite(slotData(p), params[p].count, params[p].dtype)) nonFinite[p] = 1;
        continue;
      }
      keep(device::flagNonFinite(slotData(p), params[p].count, params[p].dtype, deviceFlag(params.size() + 1 + p),
                                 static_cast<std::int32_t>(comm.rank()), options.stream));
    }
  }
  if (b.wire.data()) {
    narrowBucket(b);
    b.work = comm.allReduce(b.wire.data(), b.wire.data(), b.info.count, b.wireType, ReduceOp::kSum, stream());
  } else {
    b.work = comm.allReduce(b.storage.data(), b.storage.data(), b.info.count, b.info.dtype,
                            options.average ? ReduceOp::kAvg : ReduceOp::kSum, stream());
  }
  b.launched = true;
}

void GradSyncState::narrowBucket(Bucket& b) {
  // Divide before narrowing: a sum of averages fits where a sum of values may overflow fp16.
  const int divisor = options.average ? comm.size() : 1;
  if (!onDevice) {
    narrow(b.storage.data(), b.info.dtype, b.wire.data(), b.wireType, b.info.count, divisor);
    return;
  }
  keep(device::convert(b.wire.data(), b.wireType, b.storage.data(), b.info.dtype, b.info.count, divisor, options.stream));
}

void GradSyncState::widenBucket(Bucket& b) {
  if (!onDevice) {
    widen(b.wire.data(), b.wireType, b.storage.data(), b.info.dtype, b.info.count);
    return;
  }
  keep(device::convert(b.storage.data(), b.info.dtype, b.wire.data(), b.wireType, b.info.count, 1, options.stream));
}

void GradSyncState::fillUnmarked(std::size_t p) {
  // A parameter used only in the noSync micro-batches of this window has its accumulated gradient
  // in its buffer; one used nowhere counts as zero here. Which of the two is an error is decided
  // later, from the flags, identically on every rank.
  Bucket& b = buckets[slots[p].bucket];
  if (usedInWindow[p]) {
    if (!options.gradientsAsBucketViews)
      copy(slotData(p), params[p].grad, paramBytes(p), "cudaMemcpyAsync (a gradient into its bucket)");
  } else {
    zero(slotData(p), paramBytes(p), "cudaMemsetAsync (an unused parameter's gradient)");
  }
  --b.pending;
}

Status GradSyncState::finish() {
  if (!stepActive && noSyncDepth > 0) return Status::Ok();  // accumulating: nothing to send
  stepActive = true;
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (!marked[p]) fillUnmarked(p);
  }
  launchReady();

  const std::size_t n = params.size();
  const bool agree = agrees();
  Work flagsWork;
  if (agree) {
    // MIN over ranks of "my rank if I have the problem": the lowest rank with it, or kNobody.
    const auto me = static_cast<std::int32_t>(comm.rank());
    flags.assign(numFlags(), kNobody);
    for (std::size_t p = 0; p < n; ++p) {
      if (!marked[p]) flags[p] = me;
      if (nonFinite[p]) flags[n + 1 + p] = me;
    }
    if (!copyFailure.ok()) flags[n] = me;
    if (onDevice) {
      // What the host knows goes up to the device flags, whose rest the finite checks wrote on the stream.
      copy(deviceFlag(0), flags.data(), (n + 1) * sizeof(std::int32_t), "cudaMemcpyAsync (the step's flags)");
      flagsWork = comm.allReduce(deviceFlag(0), deviceFlag(0), numFlags(), DataType::kInt32, ReduceOp::kMin, options.stream);
    } else {
      flagsWork = comm.allReduce(flags.data(), flags.data(), flags.size(), DataType::kInt32, ReduceOp::kMin);
    }
  }
  Status s = waitAll();
  if (agree) {
    Status f = flagsWork.wait();
    if (s.ok()) s = f;
    if (s.ok() && onDevice) s = device::fetch(flags.data(), deviceFlag(0), numFlags() * sizeof(std::int32_t), "cudaMemcpy (the reduced flags)");
  }
  if (s.ok()) s = copyFailure;  // (before the verdict: this rank's own error says more)
  if (s.ok() && agree) s = verdict();
  if (!s.ok()) {
    resetStep();
    return s.withContext("GradSync::finish");
  }

  for (Bucket& b : buckets) {
    if (b.wire.data()) widenBucket(b);
    if (options.gradientsAsBucketViews) continue;
    for (std::size_t p : b.info.params)
      copy(params[p].grad, slotData(p), paramBytes(p), "cudaMemcpyAsync (an average back into its gradient)");
  }
  s = copyFailure.withContext("GradSync::finish");
  resetStep();
  return s;
}

Status GradSyncState::waitAll() {
  Status first;
  for (Bucket& b : buckets) {
    if (!b.launched) continue;
    Status s = b.work.wait();
    b.launched = false;
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

Status GradSyncState::verdict() const {
  const std::size_t n = params.size();
  auto report = [&](std::size_t from, const char* what, const std::string& advice, bool usage) -> Status {
    std::size_t first = n, count = 0;
    for (std::size_t p = 0; p < n; ++p) {
      if (flags[from + p] == kNobody) continue;
      if (first == n) first = p;
      ++count;
    }
    if (first == n) return Status::Ok();
    std::string msg = "parameter '" + params[first].name + "' (#" + std::to_string(first) + ") " + what +
                      " on rank " + std::to_string(flags[from + first]);
    if (count > 1) msg += " (and " + std::to_string(count - 1) + " more parameters)";
    msg += "; " + advice;
    return usage ? Status::InvalidUsage(msg) : Status::InvalidArgument(msg);
  };
  if (flags[n] != kNobody) {  // (another rank's: finish() returns this rank's own before the verdict)
    return Status::RemoteError("rank " + std::to_string(flags[n]) +
                               " could not queue its gradient copies on its stream (its own error says why). The step "
                               "was dropped");
  }
  if (!options.allowUnusedParameters) {
    Status s = report(0, "was not marked ready before finish()",
                      "every parameter must be marked ready in every synchronized step. If some parameters take "
                      "no part in the loss, set GradSyncOptions::allowUnusedParameters = true (a parameter not "
                      "marked then counts as a zero gradient on that rank). The step was dropped",
                      true);
    if (!s.ok()) return s;
  }
  if (options.checkFinite) {
    return report(n + 1, "has a gradient with NaN or Inf",
                  "found by GradSyncOptions::checkFinite in that rank's own gradient, before reduction. The step was "
                  "dropped", false);
  }
  return Status::Ok();
}

void GradSyncState::resetStep() {
  for (Bucket& b : buckets) {
    b.pending = b.info.params.size();
    b.launched = false;
    b.work = Work();
  }
  std::fill(marked.begin(), marked.end(), 0);
  std::fill(usedInWindow.begin(), usedInWindow.end(), 0);
  std::fill(nonFinite.begin(), nonFinite.end(), 0);
  nextLaunch = 0;
  stepActive = false;
  copyFailure = Status::Ok();
  if (deviceFlags.data()) resetFiniteFlags();  // (a failure here ends the next step)
}

}  // namespace braid::ddp::detail
