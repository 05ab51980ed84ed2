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
#include "comm/ddp/buckets.h"

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

  std::byte* slotData(std::size_t param) const;
  std::size_t paramBytes(std::size_t param) const;
  // memcpy / memset, or queued on the stream for device parameters (a failure goes to copyFailure).
  void copy(void* dst, const void* src, std::size_t bytes, const char* what);
  void zero(void* dst, std::size_t bytes, const char* what);
  // What the collectives are ordered with: the stream for device parameters, none for host ones.
  void* stream() const { return onDevice ? options.stream : nullptr; }

  // Lays out and allocates buckets and sizes the per-step vectors (no communication).
  Status prepare();
  // Collective: rank 0's parameter values to every rank, through the bucket memory.
  Status broadcastParameters();

  Status markReady(std::size_t index);
  Status finish();

 private:
  void launchReady();
  void launch(Bucket& b);
  void fillUnmarked(std::size_t param);
  Status verdict(const std::vector<std::int32_t>& flags) const;
  Status waitAll();
  void resetStep();
};

}  // namespace braid::ddp::detail
