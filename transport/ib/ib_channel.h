// The ib data path: one RC queue pair per channel. Each side owns an inbox ring that the peer
// writes into with RDMA WRITE WITH IMMEDIATE (the immediate is the length; the receiver learns
// what arrived from its completions, in order), and a small control block where the peer writes
// its credits: how far it has read this side's writes, and how many receives it has posted (a
// write with immediate consumes one). Credits go back as an inline RDMA write into the control
// block, with an immediate (so that a sleeping peer wakes) when the peer has a receive to spare.
// The sender stages its bytes in an outbox that mirrors the peer's inbox, or sends them inline
// when they are few. Completions are polled by the progress path; a waiter sleeps on the
// completion channel (IbDevice::channel), armed when a poll finds nothing.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/base/config.h"
#include "transport/ib/ib_port.h"
#include "transport/transport.h"

namespace braid {

// One opened port with the objects every channel on it shares.
struct IbDevice {
  std::shared_ptr<const Verbs> verbs;
  IbPort port;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;  // nonblocking; every CQ's events
  ~IbDevice();
  // Takes and acknowledges every event queued on the channel.
  void drainEvents();
};

// What the peer's channel needs to reach this one.
struct IbEndpoint {
  std::uint32_t qpn = 0, psn = 0;
  std::uint64_t inbox = 0, ctl = 0;
  std::uint32_t inboxKey = 0, ctlKey = 0;
};

// The peer's port, from its published address.
struct IbRemotePort {
  std::uint16_t lid = 0;
  ibv_gid gid{};
  int mtu = IBV_MTU_1024;  // enum ibv_mtu
  bool ethernet = false;
};

class IbChannel final : public Channel {
 public:
  static Result<std::unique_ptr<IbChannel>> create(std::shared_ptr<IbDevice> dev, int peer, std::size_t cap);
  ~IbChannel() override;
  IbEndpoint endpoint() const;
  // INIT -> RTR -> RTS toward the peer's channel.
  Status connect(const IbEndpoint& remote, const IbRemotePort& port, const Config& config);

  Result<std::size_t> trySend(const void* data, std::size_t n) override;
  Result<std::span<const std::byte>> peek() override;
  void consume(std::size_t n) override;
  Result<std::size_t> tryRecv(void* dst, std::size_t n) override;
  // Its CQ's event was taken (IbDevice::drainEvents): the CQ is no longer armed.
  void disarm() { armed_ = false; }

 private:
  struct Credit;  // the control block's layout
  IbChannel(std::shared_ptr<IbDevice> dev, int peer, std::size_t cap);
  Status setup();
  void poll();
  Status post(ibv_send_wr& wr);
  void sendCredit();
  void maybeCredit();  // when enough was read or reposted since the last credit
  Status fail(const ibv_wc& wc);
  bool readCredit();

  std::shared_ptr<IbDevice> dev_;
  int peer_;
  std::size_t cap_;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::byte* inbox_ = nullptr;
  std::byte* outbox_ = nullptr;
  Credit* ctl_ = nullptr;      // the peer writes here
  ibv_mr* inboxMr_ = nullptr;
  ibv_mr* outboxMr_ = nullptr;
  ibv_mr* ctlMr_ = nullptr;
  IbEndpoint remote_{};
  std::uint32_t maxInline_ = 0;
  bool armed_ = false;
  Status error_;

  // Sending: positions in the byte stream (the peer's inbox holds sent_ - peerHead_ of them).
  std::uint64_t sent_ = 0, acked_ = 0, peerHead_ = 0;
  std::uint64_t immSent_ = 0, peerPosted_ = 0;  // receives of the peer this side used / it posted
  int sqOutstanding_ = 0;
  // Receiving.
  std::uint64_t head_ = 0, tail_ = 0;
  std::uint64_t posted_ = 0, processed_ = 0;  // receives posted / completed
  std::uint64_t creditedHead_ = 0, creditedPosted_ = 0;
};

class IbConnection final : public Connection {
 public:
  IbConnection(int peer, std::vector<std::unique_ptr<IbChannel>> channels)
      : peer_(peer), channels_(std::move(channels)) {}
  int peer() const override { return peer_; }
  std::string_view transport() const override { return "ib"; }
  int numChannels() const override { return static_cast<int>(channels_.size()); }
  Channel& channel(int i) override { return *channels_[static_cast<std::size_t>(i)]; }

 private:
  int peer_;
  std::vector<std::unique_ptr<IbChannel>> channels_;
};

}  // namespace braid
