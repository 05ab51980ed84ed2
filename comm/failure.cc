// Failure handling: the first failure is the root cause and reaches every rank through the store;
// a timeout names the silent ranks (or says the data was still moving); destroy's farewell and the
// check for messages that no call read find mismatches that no plan saw.
// docs/architecture/bootstrap.md, "Failure handling".
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/log.h"
#include "base/process.h"
#include "comm/communicator.h"
#include "comm/failure.h"

namespace braid {

void Comm::fail(const Status& s, bool tellOthers, bool peerGone) {
  if (s.ok()) return;  // not a failure (and never let one be recorded as "ok")
  {
    std::lock_guard<std::mutex> g(failMu_);
    if (!failure_.ok()) return;  // the first failure is the root cause
    failure_ = s;
    failureIsPeerGone_ = peerGone;
    failed_.store(true);
  }
  if (waiter_) waiter_->wake();
  if (!tellOthers || !store_) return;
  // The others see this text as their own failure: it must say which rank it happened on.
  const std::string who = "rank " + std::to_string(rank_), &m = s.message();
  const bool named = m.rfind(who + " ", 0) == 0 || m.rfind(who + ":", 0) == 0;
  store_->report({Notice::kError, rank_, s.code(), named ? m : who + ": " + m});
}

std::string Comm::statusRecord() const {
  const std::string host = rank_ < static_cast<int>(hostNames_.size()) ? hostNames_[static_cast<std::size_t>(rank_)] : "";
  return live_.record(rank_, nranks_, host, static_cast<long>(getpid()), trace_.now(), trace_.nsPerTick());
}

void Comm::onNotice(const Notice& n) {
  if (n.kind == Notice::kStatusQuery) {  // braid status asks (through the store): answer from here, the watcher
    store_->report({Notice::kStatusAnswer, rank_, Code::kRemoteError, n.message + "\n" + statusRecord()});
    return;
  }
  if (n.kind == Notice::kStatusAnswer) return;
  if (n.kind == Notice::kTimedOut) {
    std::lock_guard<std::mutex> g(timeoutMu_);
    timedOut_[n.rank] = n.message;
    timeoutCv_.notify_all();
    return;
  }
  if (n.kind == Notice::kPeerGone) {
    fail(Status::RemoteError(peerName(n.rank) + " exited or closed its connection"), false, true);
  } else if (n.kind == Notice::kStoreLost) {
    // The store's host process is gone (if it was a rank of this host, it is named). Like a peer
    // that left, this fails a call in flight but not a destroy whose calls all went through: the
    // store's host may end before the last ranks have left (a launcher stops it once another rank
    // exited non-zero).
    fail(Status(n.code, deadLocalRanks() + n.message), false, true);
  } else {
    fail(Status(n.code, n.message), false);
  }
}

// "rank 0 (shm) exited; " for the ranks of this host whose process is gone (or a zombie), else "".
// A process closes its sockets just before it becomes a zombie, so this looks again for up to 100 ms.
std::string Comm::deadLocalRanks() const {
  auto gone = [](int pid) { return pid > 0 && procState(pid) != ProcState::kRuns; };
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::string dead;
    for (int r = 0; r < nranks_; ++r)
      if (r != rank_ && localPeer_[static_cast<std::size_t>(r)] && gone(pids_[static_cast<std::size_t>(r)]))
        dead += "rank " + std::to_string(r) + " (" + transportOf(r) + ") exited; ";
    if (!dead.empty()) return dead;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "";
}

namespace {
// "300 s", "0.1 s"
std::string secondsText(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g s", s);
  return b;
}
}  // namespace

std::string rankList(const std::vector<int>& ranks, const std::function<std::string(int)>& remoteHostOf) {
  std::string out;
  std::string next = ranks.empty() ? "" : remoteHostOf(ranks[0]);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i ? ", rank " : "rank ") + std::to_string(ranks[i]);
    const std::string h = next;
    next = i + 1 < ranks.size() ? remoteHostOf(ranks[i + 1]) : "";
    if (!h.empty() && (i + 1 == ranks.size() || next != h)) out += " (host " + h + ")";
  }
  return out;
}

Status timeoutVerdict(const TimeoutView& me, const std::string& what, const std::string& detail, bool moving,
                      const std::map<int, std::string>& timedOut) {
  std::vector<int> silent;
  int other = -1;
  std::string otherWhat;
  for (int r = 0; r < me.nranks; ++r) {
    if (r == me.rank) continue;
    auto it = timedOut.find(r);
    if (it == timedOut.end()) { silent.push_back(r); continue; }
    std::string theirs = it->second.substr(0, it->second.find('\n'));
    if (other < 0 && theirs != what) { other = r; otherWhat = theirs; }
  }
  // Everyone waits, nobody is silent, and not all in the same call: the ranks called different
  // collectives. (With a silent rank, others may legitimately be one call apart: name the silent one.)
  if (other >= 0 && silent.empty()) {  // "desc #seq" -> "desc as #seq", as the header check words it
    auto as = [](const std::string& w) { std::size_t h = w.rfind(" #"); return h == std::string::npos ? w : w.substr(0, h) + " as" + w.substr(h); };
    return Status::InvalidUsage(what + " timed out after " + secondsText(me.timeoutSec) + ": " + mismatchText(me.rank, as(what), other, as(otherWhat)));
  }
  if (moving)
    return Status::Timeout(what + " did not finish within " + secondsText(me.timeoutSec) +
                           ", the time BRAID_TIMEOUT gives a whole call, though its data was still moving (" + detail +
                           "): no rank is silent; the call is slower than the limit allows: raise BRAID_TIMEOUT, or "
                           "look for a slow link (braid doctor)");
  std::string msg = what + " timed out after " + secondsText(me.timeoutSec) + ": ";
  if (!silent.empty() && silent.size() < static_cast<std::size_t>(me.nranks - 1))
    msg += rankList(silent, me.remoteHostOf) + (silent.size() == 1 ? " is" : " are") +
           " silent (stopped, hung, or busy outside Braid) while the other ranks wait; ";
  msg += detail + ". BRAID_TIMEOUT bounds this wait: raise it if the silent rank is only slow, lower it to notice a " +
         "lost rank or host sooner";
  return Status::Timeout(msg);
}

// Every rank that gives up waiting says so through the store. A rank that is stopped, hung, or busy
// outside Braid says nothing: after a short grace, the ranks missing from the chorus are named.
Status Comm::explainTimeout(const std::string& what, const std::string& detail, bool moving) {
  // The notice carries the call ("allgather(count=4, float32) #3") on its first line, so that ranks
  // stuck in different calls (a mismatch in which nobody reads the other's header) are named.
  if (store_) store_->report({Notice::kTimedOut, rank_, Code::kTimeout, what + "\n" + detail});
  std::unique_lock<std::mutex> g(timeoutMu_);
  const double grace = std::min(2.0, std::max(0.2, config_.timeoutSec / 10));
  timeoutCv_.wait_for(g, std::chrono::duration<double>(grace), [&] { return static_cast<int>(timedOut_.size()) >= nranks_ - 1; });
  return timeoutVerdict({rank_, nranks_, config_.timeoutSec, [this](int r) { return remoteHostOf(r); }}, what, detail, moving, timedOut_);
}

// A message that is still unread although its call is over here (its sequence number is one this
// rank has finished) belongs to a call the sender made differently: no plan of this rank read that
// channel, so the header check never saw it (e.g. two ranks that disagree on a reduce's root and
// both only send). Every correct plan reads every message sent to it within its call.
namespace {
// A peer's collective message for a call this rank has already finished (its sequence number is at
// most `finished`): the call never read it. Send/recv messages have sequence numbers of their own.
bool ofFinishedCall(const Fingerprint& theirs, std::uint64_t finished) {
  return theirs.kind != CollKind::kSendRecv && theirs.seq > 0 && theirs.seq <= finished;
}
}  // namespace

Status Comm::checkLeftovers(std::uint64_t finished) {
  return forEachWaitingHeader([&](int p, const WireHeader& h) {
    if (isFarewell(h)) return Status::Ok();  // the peer is in destroy: farewell() reads it
    Fingerprint theirs = fingerprintOf(h);
    return ofFinishedCall(theirs, finished) ? unreadMessageError(p, theirs) : Status::Ok();
  });
}

Status Comm::forEachWaitingHeader(const std::function<Status(int, const WireHeader&)>& f) {
  for (int p = 0; p < nranks_; ++p) {
    Connection* c = p == rank_ ? nullptr : conns_[static_cast<std::size_t>(p)].get();
    for (int ch = 0; c && ch < c->numChannels(); ++ch) {
      auto view = c->channel(ch).peek();
      if (!view.ok() || view->size() < sizeof(WireHeader)) continue;
      WireHeader h;
      std::memcpy(&h, view->data(), sizeof(h));
      if (h.magic != kWireMagic || h.commTag != commTag_) continue;
      Status s = f(p, h);
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

// Peer p's message of call theirs.seq, which this rank finished without reading it.
Status Comm::unreadMessageError(int p, const Fingerprint& theirs) const {
  const Fingerprint& mine = history_[theirs.seq % kHistory];
  const std::string when = " (rank " + std::to_string(p) + "'s message for it was never read by rank " +
                           std::to_string(rank_) + ")";
  if (mine.seq != theirs.seq)  // too long ago to name this rank's own call
    return Status::InvalidUsage("rank " + std::to_string(p) + " called " + callAs(theirs) + ", but rank " +
                                std::to_string(rank_) + "'s call #" + std::to_string(theirs.seq) +
                                " never read it: every rank must issue the same collectives in the same order");
  return Status::InvalidUsage(mismatchText(rank_, callAs(mine), p, callAs(theirs)) + when);
}

// Destroy's farewell: every rank sends each peer, on channel 0 after all its messages, a header
// carrying its last collective (kFarewellStep, no payload), then reads each peer's channel 0 up to
// that peer's farewell. So a rank whose calls all went through learns of a mismatch that another
// rank found (that rank reports it to the store instead of saying farewell), a peer that made a
// different number of calls or a different last call is named with both calls, and a message
// still waiting before a farewell is a call this rank never read. A peer that left without destroy
// (its connection closed, or the store announced it gone) counts as said farewell: nothing is
// wrong with this rank's calls. Bounded by BRAID_TIMEOUT; a peer that stays silent that long is
// only logged.
Status Comm::farewell() {
  if (nranks_ < 2) return Status::Ok();
  const Fingerprint mine = collSeq_ ? history_[collSeq_ % kHistory] : Fingerprint{};
  const WireHeader bye = makeHeader(mine, commTag_, rank_, 0, kFarewellStep);
  const std::string myLast = lastCallAs(mine);
  const Deadline deadline = Deadline::after(config_.timeoutSec);
  std::vector<std::size_t> sent(static_cast<std::size_t>(nranks_), 0);
  std::vector<bool> done(static_cast<std::size_t>(nranks_), false);
  done[static_cast<std::size_t>(rank_)] = true;
  // Only connected peers take part: a peer never reached had no message from this rank to miss.
  int left = 0;
  for (int p = 0; p < nranks_; ++p) {
    const auto pi = static_cast<std::size_t>(p);
    if (conns_[pi]) ++left;
    else done[pi] = true, sent[pi] = sizeof(bye);
  }
  auto unsent = [&] {
    for (int p = 0; p < nranks_; ++p)
      if (p != rank_ && sent[static_cast<std::size_t>(p)] < sizeof(bye)) return true;
    return false;
  };
  waiter_->progressed();
  while (left > 0 || unsent()) {  // a peer may still wait for this rank's farewell
    bool moved = false;
    for (int p = 0; p < nranks_; ++p) {
      const auto pi = static_cast<std::size_t>(p);
      if (p == rank_ || !conns_[pi]) continue;
      Channel& ch = conns_[pi]->channel(0);
      if (sent[pi] < sizeof(bye)) {
        auto k = ch.trySend(reinterpret_cast<const std::byte*>(&bye) + sent[pi], sizeof(bye) - sent[pi]);
        if (k.ok()) sent[pi] += *k, moved |= *k > 0;
        else sent[pi] = sizeof(bye);  // the peer is gone: nothing to tell it
      }
      if (done[pi]) continue;
      auto view = ch.peek();
      if (!view.ok()) {
        // Closed without a farewell: the peer left, or it failed (a mismatch it found in its own
        // destroy) and is reporting that now. Give the store's notice a moment, as the engine does.
        waitForNotice(*this);
        if (failedFast()) break;
        done[pi] = true, --left, moved = true;
        continue;
      }
      if (view->size() < sizeof(WireHeader)) continue;
      WireHeader h;
      std::memcpy(&h, view->data(), sizeof(h));
      if (h.magic != kWireMagic || h.commTag != commTag_)
        return Status::Internal("corrupt or foreign message from rank " + std::to_string(p) + " at destroy");
      const Fingerprint theirs = fingerprintOf(h);
      if (!isFarewell(h)) {  // a message before the farewell
        if (ofFinishedCall(theirs, collSeq_)) return unreadMessageError(p, theirs);
        return Status::InvalidUsage(mismatchText(rank_, myLast, p, callAs(theirs)) + " (rank " +
                                    std::to_string(rank_) + " has called destroy)");
      }
      if (theirs.seq != collSeq_ || (collSeq_ && !theirs.sameCall(mine)))
        return Status::InvalidUsage(mismatchText(rank_, myLast, p, lastCallAs(theirs)) + " (the last calls before destroy)");
      ch.consume(sizeof(WireHeader));
      done[pi] = true, --left, moved = true;
    }
    if (failedFast()) {
      std::lock_guard<std::mutex> g(failMu_);
      return failureIsPeerGone_ ? Status::Ok() : failure_;
    }
    if (moved) {
      waiter_->progressed();
      continue;
    }
    waiter_->idle();
    if (deadline.expired()) {
      BRAID_LOG(kWarn, kInit, "destroy on rank %d: %d rank(s) did not call destroy within BRAID_TIMEOUT", rank_, left);
      return Status::Ok();
    }
  }
  return Status::Ok();
}

}  // namespace braid
