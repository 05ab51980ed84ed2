#include "transport/tcp/tcp_channel.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace braid {
namespace {
constexpr std::size_t kStageBelow = 4096;
constexpr std::size_t kSmallRing = 8192;
constexpr std::uint64_t kGrowAfter = 64 << 10;  // bytes received on the channel before the ring takes its full size
}  // namespace

// (std::vector zeroes the ring: its pages are touched once here, not on the hot path.)
TcpChannel::TcpChannel(net::Fd fd, int peer, std::size_t cap)
    : fd_(std::move(fd)), peer_(peer), ring_(std::min(cap, kSmallRing)), mask_(ring_.size() - 1), fullCap_(cap) {
  net::setNonBlocking(fd_.get(), true);
}

void TcpChannel::grow() {
  std::vector<std::byte> bigger(fullCap_);
  const std::size_t newMask = fullCap_ - 1;
  for (std::uint64_t o = tail_; o < head_;) {
    const std::size_t from = static_cast<std::size_t>(o) & mask_, to = static_cast<std::size_t>(o) & newMask;
    const std::size_t k = std::min({static_cast<std::size_t>(head_ - o), ring_.size() - from, fullCap_ - to});
    std::memcpy(bigger.data() + to, ring_.data() + from, k);
    o += k;
  }
  ring_.swap(bigger);
  mask_ = newMask;
}

Status TcpChannel::closedError(int err) const {
  return Status::RemoteError("rank " + std::to_string(peer_) + " (tcp) exited or closed its connection" +
                             (err ? " (" + net::errnoText(err) + ")" : ""));
}

Result<std::size_t> TcpChannel::trySend(const void* data, std::size_t n) {
  if (n == 0) return std::size_t{0};
  ssize_t k = ::send(fd_.get(), data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k >= 0) return static_cast<std::size_t>(k);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::size_t{0};
  return closedError(errno);
}

Result<std::size_t> TcpChannel::trySend2(const void* a, std::size_t na, const void* b, std::size_t nb) {
  iovec iov[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = 2;
  ssize_t k = ::sendmsg(fd_.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k >= 0) return static_cast<std::size_t>(k);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::size_t{0};
  return closedError(errno);
}

Result<std::span<const std::byte>> TcpChannel::peek() {
  if (ring_.size() < fullCap_ && head_ >= kGrowAfter) grow();  // this channel carries bulk data
  std::size_t cap = ring_.size();
  std::size_t used = static_cast<std::size_t>(head_ - tail_);
  if (used < cap && !eof_) {
    // Fill the contiguous free space after head (stop at the ring's end: alignment of elements
    // across the wrap is kept because every message starts at a multiple of 8 in the stream).
    std::size_t pos = static_cast<std::size_t>(head_) & mask_;
    std::size_t room = std::min(cap - used, cap - pos);
    ssize_t k = ::recv(fd_.get(), ring_.data() + pos, room, MSG_DONTWAIT);
    if (k > 0) head_ += static_cast<std::size_t>(k);
    else if (k == 0) eof_ = true;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return closedError(errno);
  }
  // A peer that sent its last bytes and closed is only an error once those bytes are read.
  if (eof_ && head_ == tail_) return closedError(0);
  std::size_t pos = static_cast<std::size_t>(tail_) & mask_;
  return std::span<const std::byte>(ring_.data() + pos, std::min(static_cast<std::size_t>(head_ - tail_), cap - pos));
}

void TcpChannel::consume(std::size_t n) { tail_ += n; }

Result<std::size_t> TcpChannel::tryRecv(void* dst, std::size_t n) {
  auto* out = static_cast<std::byte*>(dst);
  std::size_t got = 0;
  // A small read (a message header, a small payload) goes through the ring: one recv() then takes
  // whatever has arrived, usually the header and its payload together, instead of one call each.
  if (head_ == tail_ && n < kStageBelow) {
    auto staged = peek();
    if (!staged.ok()) return staged.status();
  }
  while (got < n && head_ != tail_) {  // staged bytes first, in stream order
    std::size_t pos = static_cast<std::size_t>(tail_) & mask_;
    std::size_t k = std::min({n - got, static_cast<std::size_t>(head_ - tail_), ring_.size() - pos});
    std::memcpy(out + got, ring_.data() + pos, k);
    tail_ += k;
    got += k;
  }
  if (got < n && !eof_) {
    ssize_t k = ::recv(fd_.get(), out + got, n - got, MSG_DONTWAIT);
    if (k > 0) {
      got += static_cast<std::size_t>(k);
      head_ += static_cast<std::size_t>(k);  // the ring was empty: keep its positions on the stream
      tail_ = head_;
    } else if (k == 0) {
      eof_ = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return closedError(errno);
    }
  }
  if (n > 0 && got == 0 && eof_) return closedError(0);
  return got;
}

}  // namespace braid
