// What a GradSync holds, and the per-step state machine behind markReady() and finish().
//
// A step moves through: idle -> (first markReady) active -> finish() -> idle. While active, each
// markReady copies a gradient into its bucket and counts the bucket down; buckets start in index
// order only, because the communicator runs calls in the order they are queued and every rank must
// queue the same all-reduces in the same order. finish() fills what was not marked, starts the rest,
// and, unless there is nothing to agree on, queues one more small all-reduce of per-parameter flags
// (which rank missed a parameter, which rank saw NaN) so that every rank reaches the same verdict.
#pragma once
#include <cstdint>
#include <vector>

#include "braid/braid.hpp"
#include "braid/ddp.hpp"
#include "ddp/buckets.h"

namespace braid::ddp::detail {

struct GradSyncState {
  explicit GradSyncState(Communicator c) : comm(std::move(c)) {}
  ~GradSyncState();
  GradSyncState(const GradSyncState&) = delete;
  GradSyncState& operator=(const GradSyncState&) = delete;

  Communicator comm;
  std::vector<Parameter> params;
  GradSyncOptions options;
  std::vector<Bucket> buckets;
  std::vector<BucketInfo> infos;  // copies of buckets[i].info, for GradSync::buckets()
  std::vector<Slot> slots;        // by parameter

  // The current step (or accumulation window), by parameter.
  std::vector<std::uint8_t> marked;        // markReady in this synchronized step
  std::vector<std::uint8_t> usedInWindow;  // markReady in a noSync step since the last finish
  std::vector<std::uint8_t> nonFinite;     // NaN/Inf seen when its bucket started
  std::size_t nextLaunch = 0;              // buckets [0, nextLaunch) have started
  bool stepActive = false;
  int noSyncDepth = 0;
  // Device parameters: bucket memory on their GPU, and every copy, zeroing and all-reduce queued on
  // options.stream; a copy that could not be queued is kept here and ends the step with that error.
  bool onDevice = false;
  Status copyFailure;
  // The flags finish() all-reduces (MIN) so that every rank reaches the same verdict, each the
  // lowest rank with that problem or kNobody: [0, n) parameter p not marked ready, [n] copies that
  // could not be queued, [n + 1, 2n + 1) parameter p with NaN or Inf.
  // Device parameters: the all-reduce runs on device memory. Its first n + 1 come from `flags`
  // (host memory the stream copies from, and where the result is read back), the rest are written
  // by the finite checks on the stream and reset from `nobody` after each step. (Declared in this
  // order so that the host vectors outlive the device memory, whose cudaFree waits for the
  // device's queued copies.)
  std::vector<std::int32_t> flags, nobody;
  BucketMemory deviceFlags;

  std::byte* slotData(std::size_t param) const;
  std::size_t paramBytes(std::size_t param) const;
  // memcpy / memset, or queued on the stream for device parameters (a failure goes to copyFailure).
  void copy(void* dst, const void* src, std::size_t bytes, const char* what);
  void zero(void* dst, std::size_t bytes, const char* what);
  // Keeps `s` in copyFailure unless a failure is kept already.
  void keep(const Status& s) {
    if (copyFailure.ok()) copyFailure = s;
  }
  // Device flags: the finite checks' part back to kNobody, on the stream.
  void resetFiniteFlags();
  // What the collectives are ordered with: the stream for device parameters, none for host ones.
  void* stream() const { return onDevice ? options.stream : nullptr; }
  // Whether finish() all-reduces the flags: unused parameters or NaN to report, or device copies,
  // which can fail.
  bool agrees() const {
    return !params.empty() && (onDevice || !options.allowUnusedParameters || options.checkFinite);
  }
  std::size_t numFlags() const { return 2 * params.size() + 1; }
  std::int32_t* deviceFlag(std::size_t i) const { return reinterpret_cast<std::int32_t*>(deviceFlags.data()) + i; }

  // Lays out and allocates buckets and sizes the per-step vectors (no communication).
  Status prepare();
  // The rank of a problem in the flags, or nobody.
  static constexpr std::int32_t kNobody = 0x7fffffff;
  // Collective: rank 0's parameter values to every rank, through the bucket memory.
  Status broadcastParameters();

  Status markReady(std::size_t index);
  Status finish();

 private:
  void launchReady();
  void launch(Bucket& b);
  // Narrows bucket b into its wire memory, or widens it back (host loops, or kernels on the stream).
  void narrowBucket(Bucket& b);
  void widenBucket(Bucket& b);
  void fillUnmarked(std::size_t param);
  Status verdict() const;  // from the reduced flags
  Status waitAll();
  void resetStep();
};

}  // namespace braid::ddp::detail
