// The tcp data path: one nonblocking socket per channel. Sends go straight from the caller's
// memory to the kernel (no staging copy); receives that reduce read from a staging ring so the
// reduction happens in one pass out of it, while plain receives go straight into the destination
// once the ring is empty.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "base/socket.h"
#include "transport/transport.h"

namespace braid {

class TcpChannel : public Channel {
 public:
  TcpChannel(net::Fd fd, int peer, std::size_t cap);
  Result<std::size_t> trySend(const void* data, std::size_t n) override;
  Result<std::size_t> trySend2(const void* a, std::size_t na, const void* b, std::size_t nb) override;
  Result<std::span<const std::byte>> peek() override;
  void consume(std::size_t n) override;
  Result<std::size_t> tryRecv(void* dst, std::size_t n) override;
  int fd() const { return fd_.get(); }

 private:
  Status closedError(int err) const;
  // The ring at its full size, the staged bytes kept at their stream offsets.
  void grow();
  net::Fd fd_;
  int peer_;
  // Staging for peek(); positions are absolute stream offsets. It starts at 8 KiB (headers and
  // small messages: every peer's channel has one, and most peers of a large communicator exchange
  // little) and takes its full size, `fullCap_` (BRAID_BUFFSIZE), once 64 KiB have come through.
  std::vector<std::byte> ring_;
  std::size_t mask_;
  std::size_t fullCap_;
  std::uint64_t head_ = 0, tail_ = 0;
  bool eof_ = false;  // the peer closed: what is staged can still be read, then it is an error
};

class TcpConnection : public Connection {
 public:
  TcpConnection(int peer, std::vector<std::unique_ptr<TcpChannel>> channels)
      : peer_(peer), channels_(std::move(channels)) {}
  int peer() const override { return peer_; }
  std::string_view transport() const override { return "tcp"; }
  int numChannels() const override { return static_cast<int>(channels_.size()); }
  Channel& channel(int i) override { return *channels_[static_cast<std::size_t>(i)]; }
  TcpChannel& tcpChannel(int i) { return *channels_[static_cast<std::size_t>(i)]; }

 private:
  int peer_;
  std::vector<std::unique_ptr<TcpChannel>> channels_;
};

}  // namespace braid
