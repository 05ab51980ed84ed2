#include "transport/shm/shm_channel.h"

#include <algorithm>
#include <cstring>

#include "kernels/copy.h"

namespace braid {

Result<std::size_t> ShmChannel::trySend(const void* data, std::size_t n) {
  std::size_t room = cap_ - static_cast<std::size_t>(outHead_ - outTailSeen_);
  if (room < n) {
    outTailSeen_ = out_.ctl->tail.load(std::memory_order_acquire);
    room = cap_ - static_cast<std::size_t>(outHead_ - outTailSeen_);
  }
  std::size_t k = std::min(n, room);
  if (k == 0) return std::size_t{0};
  std::size_t pos = static_cast<std::size_t>(outHead_) & mask_;
  std::size_t first = std::min(k, cap_ - pos);
  kernels::plainCopy(out_.data + pos, data, first);
  if (k > first) kernels::plainCopy(out_.data, static_cast<const std::byte*>(data) + first, k - first);
  outHead_ += k;
  out_.ctl->head.store(outHead_, std::memory_order_release);
  peerBell_->ring();
  return k;
}

Result<std::span<const std::byte>> ShmChannel::peek() {
  // Always re-read head: a caller that could not use what it saw (part of an element) needs the
  // bytes that arrived since, not the stale view.
  if (inHeadSeen_ - inTail_ < 64) inHeadSeen_ = in_.ctl->head.load(std::memory_order_acquire);
  std::size_t avail = static_cast<std::size_t>(inHeadSeen_ - inTail_);
  std::size_t pos = static_cast<std::size_t>(inTail_) & mask_;
  return std::span<const std::byte>(in_.data + pos, std::min(avail, cap_ - pos));
}

void ShmChannel::consume(std::size_t n) {
  inTail_ += n;
  in_.ctl->tail.store(inTail_, std::memory_order_release);
  peerBell_->ring();
}

Result<std::size_t> ShmChannel::tryRecv(void* dst, std::size_t n) { return copyOut(dst, n, false); }

Result<std::size_t> ShmChannel::tryRecvLarge(void* dst, std::size_t n) { return copyOut(dst, n, true); }

std::size_t ShmChannel::copyOut(void* dst, std::size_t n, bool streaming) {
  std::size_t got = 0;
  while (got < n) {
    auto view = peek();
    std::size_t k = std::min(view->size(), n - got);
    if (k == 0) break;
    kernels::copy(static_cast<std::byte*>(dst) + got, view->data(), k, streaming);
    consume(k);
    got += k;
  }
  return got;
}

}  // namespace braid
