// The shared-memory data path: one single-producer single-consumer byte ring per direction. Head
// and tail are monotonically increasing byte counts on their own cache lines; each side keeps a
// private copy of the other's counter; the producer re-reads the consumer's tail only when its
// copy says the ring is full.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>

#include "transport/doorbell.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"

namespace braid {

struct RingCtl {
  alignas(64) std::atomic<std::uint64_t> head{0};  // bytes ever written
  alignas(64) std::atomic<std::uint64_t> tail{0};  // bytes ever consumed
};
static_assert(sizeof(RingCtl) == 128);

struct RingView {
  RingCtl* ctl;
  std::byte* data;
};

class ShmChannel : public Channel {
 public:
  ShmChannel(RingView out, RingView in, std::size_t cap, Doorbell* peerBell)
      : out_(out), in_(in), cap_(cap), mask_(cap - 1), peerBell_(peerBell) {}
  Result<std::size_t> trySend(const void* data, std::size_t n) override;
  Result<std::span<const std::byte>> peek() override;
  void consume(std::size_t n) override;
  Result<std::size_t> tryRecv(void* dst, std::size_t n) override;
  Result<std::size_t> tryRecvLarge(void* dst, std::size_t n) override;

 private:
  std::size_t copyOut(void* dst, std::size_t n, bool streaming);  // tryRecv, tryRecvLarge
  RingView out_, in_;
  std::size_t cap_, mask_;
  Doorbell* peerBell_;
  std::uint64_t outHead_ = 0, outTailSeen_ = 0;  // producer side of out_
  std::uint64_t inTail_ = 0, inHeadSeen_ = 0;    // consumer side of in_ (head re-read on every peek)
};

class ShmConnection : public Connection {
 public:
  ShmConnection(int peer, std::shared_ptr<ShmSegment> pair, std::shared_ptr<ShmSegment> bells,
                std::vector<std::unique_ptr<ShmChannel>> channels)
      : peer_(peer), pair_(std::move(pair)), bells_(std::move(bells)), channels_(std::move(channels)) {}
  int peer() const override { return peer_; }
  std::string_view transport() const override { return "shm"; }
  int numChannels() const override { return static_cast<int>(channels_.size()); }
  Channel& channel(int i) override { return *channels_[static_cast<std::size_t>(i)]; }

 private:
  int peer_;
  std::shared_ptr<ShmSegment> pair_, bells_;  // keep the mappings alive as long as the channels
  std::vector<std::unique_ptr<ShmChannel>> channels_;
};

}  // namespace braid
