#include "comm/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <span>
#include <thread>

#include "comm/waiter.h"
#include "kernels/copy.h"
#include "kernels/reduce.h"
#include "topology/topology.h"
#include "transport/transport.h"

namespace braid {
namespace {
constexpr std::size_t kHeaderBytes = sizeof(WireHeader);
constexpr std::size_t kInlineBytes = 4096;  // messages up to this size leave in one write
std::size_t padOf(std::size_t bytes) { return (8 - bytes % 8) % 8; }
const std::byte kZeros[8] = {};
}  // namespace

std::size_t largeCopyBytes() {
  static const std::size_t bytes = [] {
    return std::max<std::size_t>(std::size_t{1} << 20, topology::tuningL3Bytes() / 32);
  }();
  return bytes;
}

void copyLocal(void* dst, const void* src, std::size_t bytes) { kernels::copy(dst, src, bytes, bytes >= largeCopyBytes()); }

void Plan::reset(const Fingerprint& f, std::uint64_t commTag, int rank, int nranks, std::size_t chunk) {
  fp_ = f;
  commTag_ = commTag;
  rank_ = rank;
  nranks_ = nranks;
  chunk_ = std::max<std::size_t>(chunk, 64);
  streamCopies_ = false;
  skipEmpty_ = false;
  fence_ = 0;
  firstOpen_ = 0;
  ops_.clear();
  opFps_.clear();
  copies_.clear();
  for (std::size_t i = 0; i < numQueues_; ++i) queues_[i].ops.clear();
  numQueues_ = 0;
}

std::vector<Plan::Queue>::iterator Plan::findQueue(int peer, int channel, bool sending) {
  auto used = queues_.begin() + static_cast<std::ptrdiff_t>(numQueues_);
  auto it = std::find_if(queues_.begin(), used, [&](const Queue& q) {
    return q.peer == peer && q.channel == channel && q.sending == sending;
  });
  if (it != used) return it;
  if (numQueues_ == queues_.size()) {
    queues_.push_back({});
    used = queues_.begin() + static_cast<std::ptrdiff_t>(numQueues_);
  }
  // Keep receives ahead of sends: a new receive queue goes before the first send queue.
  auto pos = sending ? used : std::find_if(queues_.begin(), used, [](const Queue& q) { return q.sending; });
  // Rotate the spare queue (its vector keeps its memory) from the end of the used range into place.
  std::rotate(pos, used, used + 1);
  ++numQueues_;
  pos->peer = peer;
  pos->channel = channel;
  pos->sending = sending;
  pos->ops.clear();
  pos->head = 0;
  return pos;
}

void Plan::setFingerprint(int index, const Fingerprint& f) {
  Op& op = ops_[static_cast<std::size_t>(index)];
  op.fp = static_cast<int>(opFps_.size());
  op.step = 0;  // the first (only) message of its own call, as it would be alone
  opFps_.push_back(f);
}

void Plan::localCopy(void* dst, const void* src, std::size_t bytes) {
  if (bytes && dst != src)
    copies_.push_back({static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes, 0, streams(bytes)});
}

bool Plan::copyPiece() {
  constexpr std::size_t kPiece = 64u << 10;  // a few microseconds: arriving messages wait no longer
  for (LocalCopy& c : copies_) {
    if (c.done == c.bytes) continue;
    const std::size_t n = std::min(kPiece, c.bytes - c.done);
    kernels::copy(c.dst + c.done, c.src + c.done, n, c.large);
    c.done += n;
    return true;
  }
  return false;
}

int Plan::add(Op op) {
  if (skipEmpty_ && op.bytes == 0) return -1;
  int idx = static_cast<int>(ops_.size());
  op.after = fence_;
  auto it = findQueue(op.peer, op.channel, op.kind == Op::kSend);
  // The step number counts messages within one queue, so both ends agree on it.
  op.step = static_cast<std::uint32_t>(it->ops.size());
  it->ops.push_back(idx);
  ops_.push_back(op);
  return idx;
}

int Plan::send(int peer, int channel, const void* src, std::size_t bytes, int dep) {
  Op op{};
  op.kind = Op::kSend;
  op.peer = peer;
  op.channel = channel;
  op.src = static_cast<const std::byte*>(src);
  op.bytes = bytes;
  op.dep = dep;
  return add(op);
}

int Plan::recvCopy(int peer, int channel, void* dst, std::size_t bytes, int dep) {
  Op op{};
  op.kind = Op::kRecvCopy;
  op.peer = peer;
  op.channel = channel;
  op.dst = static_cast<std::byte*>(dst);
  op.bytes = bytes;
  op.dep = dep;
  return add(op);
}

int Plan::recvReduce(int peer, int channel, void* dst, const void* local, std::size_t bytes, int dep, bool finalDivide) {
  Op op{};
  op.kind = Op::kRecvReduce;
  op.peer = peer;
  op.channel = channel;
  op.dst = static_cast<std::byte*>(dst);
  op.src = static_cast<const std::byte*>(local);
  op.bytes = bytes;
  op.dep = dep;
  op.finalDivide = finalDivide;
  return add(op);
}

// Drives the queues of one plan; lives only for one Engine::run.
struct PlanRunner {
  // Advances every queue of `queues` as far as it goes now; true once all are finished (and the
  // plan's local copies made). `moved`: data moved.
  Result<bool> pass(std::span<Plan::Queue> queues, bool& moved);

  Plan& plan;
  EngineHost& host;
  std::vector<Op>& ops;
  const Fingerprint& fp;
  std::size_t esize;

  void counted(const Op& op, std::size_t n) {
    if (plan.live_) plan.live_->add(op.peer, n);
  }

  std::string where(const Op& op) {
    Connection* c = host.connection(op.peer);
    const std::string h = host.remoteHostOf(op.peer);
    return "rank " + std::to_string(op.peer) + " (" + std::string(c ? c->transport() : "?") + ", channel " +
           std::to_string(op.channel) + (h.empty() ? "" : ", host " + h) + ")";
  }

  // Bytes of this op's payload whose inputs are ready.
  std::size_t limit(const Op& op) const {
    if (op.dep < 0) return op.bytes;
    return std::min(op.bytes, ops[static_cast<std::size_t>(op.dep)].done);
  }
  bool depStarted(const Op& op) const { return op.dep < 0 || ops[static_cast<std::size_t>(op.dep)].started; }
  // The ops before its fence (Plan::fence) are complete, and it may start.
  bool fenceOpen(const Op& op) {
    if (op.after == 0) return true;
    std::size_t& f = plan.firstOpen_;
    while (f < ops.size() && ops[f].complete) ++f;
    return static_cast<std::size_t>(op.after) <= f;
  }

  // A small message whose payload is all ready goes out as one write (header, payload, padding):
  // one ring update on shm, one segment and one system call on tcp. A partial write is finished
  // by the general path below.
  Result<bool> sendWhole(Op& op, Channel& ch) {
    std::byte buf[kHeaderBytes + kInlineBytes + 8];
    const std::size_t pad = padOf(op.bytes), total = kHeaderBytes + op.bytes + pad;
    std::memcpy(buf, &op.hdr, kHeaderBytes);
    if (op.bytes) std::memcpy(buf + kHeaderBytes, op.src, op.bytes);
    std::memset(buf + kHeaderBytes + op.bytes, 0, pad);
    auto k = ch.trySend(buf, total);
    if (!k.ok()) return k.status();
    op.hdrDone = std::min(*k, kHeaderBytes);
    op.started = op.hdrDone == kHeaderBytes;
    op.done = std::min(*k - op.hdrDone, op.bytes);
    op.padDone = *k - op.hdrDone - op.done;
    op.complete = *k == total;
    counted(op, op.done);
    return *k > 0;
  }

  Result<bool> advanceSend(Op& op, Channel& ch) {
    bool moved = false;
    if (!op.started) {
      if (!depStarted(op) || !fenceOpen(op)) return false;
      if (op.hdrDone == 0) {
        op.hdr = makeHeader(plan.fingerprintOf(op), plan.commTag_, plan.rank_, op.bytes, op.step);
        if (op.bytes <= kInlineBytes && limit(op) == op.bytes) {
          auto r = sendWhole(op, ch);
          if (!r.ok() || op.complete || !*r) return r;
          moved = true;
        }
      }
      if (!op.started) {
        // The header, and with it the payload's first piece when one is ready: one write (one
        // system call and one segment on tcp).
        const std::size_t first = std::min(limit(op), plan.chunk_);
        auto k = ch.trySend2(reinterpret_cast<const std::byte*>(&op.hdr) + op.hdrDone, kHeaderBytes - op.hdrDone,
                             op.src, first);
        if (!k.ok()) return k.status();
        const std::size_t toHeader = std::min(*k, kHeaderBytes - op.hdrDone);
        op.hdrDone += toHeader;
        op.done += *k - toHeader;
        counted(op, *k - toHeader);
        moved |= *k > 0;
        if (op.hdrDone < kHeaderBytes) return moved;
        op.started = true;
      }
    }
    while (op.done < op.bytes) {
      std::size_t n = std::min(limit(op) - op.done, plan.chunk_);
      if (n == 0) return moved;
      auto k = ch.trySend(op.src + op.done, n);
      if (!k.ok()) return k.status();
      if (*k == 0) return moved;
      op.done += *k;
      counted(op, *k);
      moved = true;
    }
    return finish(op, moved, [&](std::size_t n) { return ch.trySend(kZeros, n); });
  }

  // Moves the zero padding after the payload (`move` sends or swallows up to n bytes of it), then
  // marks the message complete.
  template <typename Move>
  Result<bool> finish(Op& op, bool moved, Move move) {
    std::size_t pad = padOf(op.bytes);
    if (op.padDone < pad) {
      auto k = move(pad - op.padDone);
      if (!k.ok()) return k.status();
      op.padDone += *k;
      moved |= *k > 0;
      if (op.padDone < pad) return moved;
    }
    op.complete = true;
    return true;
  }

  Status checkHeader(const Op& op) {
    const WireHeader& h = op.hdr;
    Fingerprint theirs = fingerprintOf(h);
    const Fingerprint& fp = plan.fingerprintOf(op);
    if (h.magic != kWireMagic || h.commTag != plan.commTag_)
      return Status::Internal("corrupt or foreign message from " + where(op) + " during " + fp.describe() + " #" +
                              std::to_string(fp.seq));
    if (isFarewell(h))  // the peer made its last call and destroys
      return Status::InvalidUsage(farewellMismatch(plan.rank_, fp, op.peer, theirs));
    if (fp.kind == CollKind::kAllToAllv && theirs.kind == fp.kind && theirs.seq == fp.seq && theirs.dtype == fp.dtype &&
        theirs.count != fp.count && h.sender == op.peer) {
      // Each message of an all-to-allv carries its pair's whole count (buildAllToAll), so a pair
      // that disagrees is caught at the first header, however each end cut its block.
      return Status::InvalidUsage(fp.describe() + " #" + std::to_string(fp.seq) + ": rank " + std::to_string(op.peer) +
                                  " sends rank " + std::to_string(plan.rank_) + " " + std::to_string(theirs.count) +
                                  " elements where rank " + std::to_string(plan.rank_) + " expects " +
                                  std::to_string(fp.count) + ": rank " + std::to_string(op.peer) + "'s sendcounts[" +
                                  std::to_string(plan.rank_) + "] must equal rank " + std::to_string(plan.rank_) +
                                  "'s recvcounts[" + std::to_string(op.peer) + "]");
    }
    if (fp.kind == CollKind::kSendRecv && theirs.tag != fp.tag && h.sender == op.peer) {
      Fingerprint untagged = theirs;
      untagged.tag = fp.tag;
      if (untagged.sameCall(fp))  // the matched call differs in its tag only
        return Status::InvalidUsage("rank " + std::to_string(plan.rank_) + " called " + callAs(fp) + " but rank " +
                                    std::to_string(op.peer) + "'s matching call has tag " + std::to_string(theirs.tag) +
                                    ": messages between two ranks match in call order, and a tag must equal the "
                                    "tag of the call it matches (tags do not reorder messages)");
    }
    if (!theirs.sameCall(fp) || h.sender != op.peer)
      return Status::InvalidUsage(mismatchText(plan.rank_, callAs(fp), op.peer, callAs(theirs)));
    if (h.bytes != op.bytes || h.step != op.step)
      return Status::Internal("rank " + std::to_string(op.peer) + " sent message " + std::to_string(h.step) + " of " +
                              std::to_string(h.bytes) + " bytes where rank " + std::to_string(plan.rank_) +
                              " expected message " + std::to_string(op.step) + " of " + std::to_string(op.bytes) +
                              " bytes in " + fp.describe() + " #" + std::to_string(fp.seq) +
                              " (ranks chose different algorithms: set the same BRAID_ALGO/BRAID_NSOCKS everywhere, and pass "
                              "the same kind of memory, host or CUDA device, on every rank)");
    return Status::Ok();
  }

  // A small message that has fully arrived is taken in one step: header, payload and padding
  // leave the channel with one consume (one update of a shared-memory ring's tail). False when the
  // message is not all there yet (the general path below then takes what there is).
  Result<bool> recvWhole(Op& op, Channel& ch) {
    auto view = ch.peek();
    if (!view.ok()) return view.status();
    const std::size_t pad = padOf(op.bytes), total = kHeaderBytes + op.bytes + pad;
    if (view->size() < total) return false;
    std::memcpy(&op.hdr, view->data(), kHeaderBytes);
    op.hdrDone = kHeaderBytes;
    Status s = checkHeader(op);
    if (!s.ok()) return s;
    op.started = true;
    const std::byte* payload = view->data() + kHeaderBytes;
    if (op.kind == Op::kRecvCopy) {
      if (op.bytes) std::memcpy(op.dst, payload, op.bytes);
    } else if (op.bytes) {
      kernels::reduce(op.dst, op.src, payload, op.bytes / esize, fp.dtype, fp.op);
      if (op.finalDivide) kernels::divide(op.dst, op.bytes / esize, fp.dtype, plan.nranks_);
    }
    ch.consume(total);
    op.done = op.bytes;
    op.padDone = pad;
    op.complete = true;
    counted(op, op.bytes);
    return true;
  }

  Result<bool> advanceRecv(Op& op, Channel& ch) {
    bool moved = false;
    if (!op.started) {
      // Start only after the dependency started: "started" then chains through a whole subtree,
      // which is what makes a zero-byte tree all-reduce a barrier.
      if (!depStarted(op) || !fenceOpen(op)) return false;
      if (op.hdrDone == 0 && op.bytes <= kInlineBytes && (op.kind == Op::kRecvCopy || limit(op) == op.bytes)) {
        auto r = recvWhole(op, ch);
        if (!r.ok() || *r) return r;
      }
      if (op.kind == Op::kRecvCopy && !op.expected) {
        // Before the header: a sender that waits for the payload's destination hears it sooner.
        ch.expect(op.dst, op.bytes, kHeaderBytes - op.hdrDone);
        op.expected = true;
      }
      auto k = ch.tryRecv(reinterpret_cast<std::byte*>(&op.hdr) + op.hdrDone, kHeaderBytes - op.hdrDone);
      if (!k.ok()) return k.status();
      op.hdrDone += *k;
      moved = *k > 0;
      if (op.hdrDone < kHeaderBytes) return moved;
      Status s = checkHeader(op);
      if (!s.ok()) return s;
      op.started = true;
    }
    while (op.done < op.bytes) {
      std::size_t want = std::min(op.bytes - op.done, plan.chunk_);
      if (op.kind == Op::kRecvCopy) {
        auto k = plan.streams(op.bytes) ? ch.tryRecvLarge(op.dst + op.done, want) : ch.tryRecv(op.dst + op.done, want);
        if (!k.ok()) return k.status();
        if (*k == 0) return moved;
        op.done += *k;
        counted(op, *k);
        moved = true;
        continue;
      }
      want = std::min(want, limit(op) - op.done);
      auto view = ch.peek();
      if (!view.ok()) return view.status();
      std::size_t n = std::min(view->size(), want) / esize * esize;
      if (n == 0) return moved;
      std::size_t elems = n / esize;
      kernels::reduce(op.dst + op.done, op.src + op.done, view->data(), elems, fp.dtype, fp.op);
      if (op.finalDivide) kernels::divide(op.dst + op.done, elems, fp.dtype, plan.nranks_);
      ch.consume(n);
      op.done += n;
      counted(op, n);
      moved = true;
    }
    std::byte sink[8];
    return finish(op, moved, [&](std::size_t n) { return ch.tryRecv(sink, n); });
  }

  // Advances one queue as far as it goes; true if anything moved.
  Result<bool> advance(Plan::Queue& q) {
    Connection* conn = host.connection(q.peer);
    Channel& ch = conn->channel(q.channel);
    bool moved = false;
    while (q.head < q.ops.size()) {
      Op& op = ops[static_cast<std::size_t>(q.ops[q.head])];
      auto r = op.kind == Op::kSend ? advanceSend(op, ch) : advanceRecv(op, ch);
      if (!r.ok()) return r;
      moved |= *r;
      if (!op.complete) break;
      ++q.head;
    }
    return moved;
  }
};

void waitForNotice(EngineHost& host) {
  for (int i = 0; i < 500 && !host.failedFast(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// One pass over the plan's queues (PlanRunner::pass): each advanced as far as it goes now.
Result<bool> PlanRunner::pass(std::span<Plan::Queue> queues, bool& moved) {
  bool all = true;
  for (Plan::Queue& q : queues) {
    if (q.head == q.ops.size()) continue;
    auto r = advance(q);
    if (!r.ok()) {
      if (r.status().code() == Code::kRemoteError) waitForNotice(host);
      Status fail = host.failure();
      // The call of the message that failed (in a group, each message is a call of its own).
      const Fingerprint& mine = plan.fingerprintOf(plan.ops_[static_cast<std::size_t>(q.ops[q.head])]);
      Status why = fail.ok() ? r.status() : fail;
      // The transport's own error names the rank; across hosts, say which host that is.
      if (fail.ok() && !host.remoteHostOf(q.peer).empty())
        why = Status(why.code(), why.message() + " (rank " + std::to_string(q.peer) + " is on host " +
                                     host.remoteHostOf(q.peer) + ")");
      return why.withContext(failedOn(mine, plan.rank_));
    }
    moved |= *r;
    all &= q.head == q.ops.size();
  }
  if (all)
    while (plan.copyPiece()) {}
  return all;
}

Result<bool> Engine::pass(Plan& plan, EngineHost& host, bool* moved) {
  PlanRunner runner{plan, host, plan.ops_, plan.fp_, std::max<std::size_t>(dataTypeSize(plan.fp_.dtype), 1)};
  bool m = false;
  auto done = runner.pass(std::span(plan.queues_.data(), plan.numQueues_), m);
  if (done.ok() && !*done && !m) m = plan.copyPiece();  // nothing arrived: local work instead
  if (moved) *moved = m;
  return done;
}

// The queue a waiting plan waits on: the first unfinished receive, else the first unfinished send.
const Plan::Queue* Engine::stuckQueue(std::span<const Plan::Queue> queues) {
  const Plan::Queue* stuck = nullptr;
  for (const Plan::Queue& q : queues)
    if (q.head < q.ops.size() && (!stuck || (stuck->sending && !q.sending))) stuck = &q;
  return stuck;
}

void Engine::noteWait(const Plan& plan, std::span<const Plan::Queue> queues) {
  const Plan::Queue* q = stuckQueue(queues);
  if (!q) return;
  const Op& op = plan.ops_[static_cast<std::size_t>(q->ops[q->head])];
  LiveProgress& l = *plan.live_;
  l.waitPeer.store(op.peer, std::memory_order_relaxed);
  l.waitChannel.store(op.channel, std::memory_order_relaxed);
  l.waitStep.store(op.step, std::memory_order_relaxed);
  l.waitSending.store(q->sending, std::memory_order_relaxed);
}

Status Engine::timedOut(Plan& plan, EngineHost& host, bool moving) {
  PlanRunner runner{plan, host, plan.ops_, plan.fp_, 1};
  const auto queues = std::span(plan.queues_.data(), plan.numQueues_);
  // Name the first peer this rank is still waiting to hear from (else to send to).
  const Plan::Queue* stuck = stuckQueue(queues);
  if (!stuck)  // (an unfinished plan always has a message left)
    return Status::Internal("rank " + std::to_string(plan.rank_) + ": the deadline passed with no message left to wait for");
  const Op& op = plan.ops_[static_cast<std::size_t>(stuck->ops[stuck->head])];
  const Fingerprint& mine = plan.fingerprintOf(op);
  std::size_t done = 0, bytes = 0;  // this rank's part of the call, all peers
  for (const Op& o : plan.ops_) {
    done += o.done;
    bytes += o.bytes;
  }
  return host.explainTimeout(mine.describe() + " #" + std::to_string(mine.seq),
                             "rank " + std::to_string(plan.rank_) + " waited " + (stuck->sending ? "to send to " : "to receive from ") +
                                 runner.where(op) + " (" + std::to_string(op.done) + " of " + std::to_string(op.bytes) +
                                 " bytes moved; " + std::to_string(done) + " of " + std::to_string(bytes) +
                                 " bytes of its whole part of the call)",
                             moving);
}

Status Engine::run(Plan& plan, EngineHost& host) {
  const Fingerprint& fp = plan.fp_;
  PlanRunner runner{plan, host, plan.ops_, fp, std::max<std::size_t>(dataTypeSize(fp.dtype), 1)};
  Waiter& waiter = host.waiter();
  waiter.progressed();
  // The clock is read only once the plan has to wait: a call that completes without waiting
  // (most small ones) costs no clock read.
  std::optional<Deadline> deadline;
  Clock::time_point lastCheck{}, lastMoved{};
  bool movedSinceCheck = false;  // data moved since the last idle pass read the clock (no clock read for it)
  std::uint64_t busyPasses = 0;  // passes that moved data
  bool waitNoted = false;        // the peer it waits on is noted for observers (LiveProgress) since it last moved
  Clock::time_point waitSince{};  // the first idle pass's clock of that wait
  const auto queues = std::span(plan.queues_.data(), plan.numQueues_);
  // A wait that ends (data moved, the plan finished, or it failed) counts against the peer it waited
  // on: one clock read a wait.
  auto endWait = [&] {
    if (waitNoted && waitSince.time_since_epoch().count() != 0)
      plan.live_->stalled(plan.live_->waitPeer.load(std::memory_order_relaxed),
                          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - waitSince).count()));
    waitNoted = false;
  };
  for (;;) {
    bool moved = false;
    auto done = runner.pass(queues, moved);
    if (!done.ok() || *done || host.failedFast()) endWait();
    if (!done.ok()) return done.status();
    if (*done) return Status::Ok();
    if (host.failedFast()) return host.failure().withContext(failedOn(fp, plan.rank_));
    if (moved) {
      waiter.progressed();
      movedSinceCheck = true;
      endWait();
      // A call whose data never stops long enough to go idle is held to the limit too: every 4096
      // busy passes (a clock read per few milliseconds; none for a call that ends sooner).
      if (++busyPasses % 4096 == 0) {
        if (!deadline) deadline = Deadline::after(host.timeoutSec());
        // Plainly expired: this process ran and moved data all along, so a gap between these
        // checks is 4096 slow passes (a loaded host, a sanitizer), not a pause to forgive.
        lastCheck = lastMoved = Clock::now();
        if (deadline->expired()) return timedOut(plan, host, true);
      }
      continue;
    }
    if (plan.copyPiece()) continue;  // nothing arrived: do local work instead of waiting
    if (!waitNoted && plan.live_) noteWait(plan, queues), waitNoted = true, waitSince = {};  // once each time it goes idle
    waiter.idle();
    if (!deadline) deadline = Deadline::after(host.timeoutSec());
    const bool expired = deadline->expiredWhileRunning(&lastCheck);
    if (waitNoted && waitSince.time_since_epoch().count() == 0) waitSince = lastCheck;
    if (movedSinceCheck) lastMoved = lastCheck;  // data moved since the pass before: about now
    movedSinceCheck = false;
    if (expired) {
      // Still moving: data came or went in the second half of the limit (at least the last 100 ms;
      // a loaded host can pause a moving call for tens of milliseconds).
      const auto recent = std::chrono::duration<double>(std::max(0.1, host.timeoutSec() / 2));
      endWait();
      return timedOut(plan, host, lastMoved.time_since_epoch().count() != 0 && lastCheck - lastMoved < recent);
    }
  }
}

}  // namespace braid
