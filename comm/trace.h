// The flight recorder: each rank remembers its last BRAID_TRACE_BUFFER collectives (fingerprint,
// state, per-peer bytes, start and end times, and for an unfinished call the message it was stuck
// on) in a ring of entries allocated once at communicator creation. When a call fails (timeout,
// remote error, mismatch) or the communicator is aborted, the ring is written as JSON to
// BRAID_TRACE_DIR/braid-trace-rank<N>.json, once per communicator; `braid trace DIR` merges the
// ranks' files into a verdict (tools/trace.cc).
//
// Cost on the call path: begin() and end() read the clock once each (the TSC where the kernel
// itself keeps time with it, about 10 ns; else steady_clock, about 25 ns) and fill a fixed entry;
// tally() walks the plan's messages once after the engine returns, with plain adds into the
// entry's per-peer slots. No allocation, no strings, no locks. Writing the file (a cold path)
// allocates freely.
//
// Thread safety: none of its own. The communicator calls it only while it holds its execution
// mutex (one collective at a time), so the executing thread and abort() never overlap.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "braid/status.hpp"
#include "comm/fingerprint.h"

namespace braid {

class Plan;

struct TracePeerBytes {
  std::int32_t peer;
  std::uint64_t sent;
  std::uint64_t recv;
};

struct TraceEntry {
  enum State : std::uint8_t { kRunning, kDone, kFailed };
  static constexpr int kPeerSlots = 8;  // ring and tree touch at most 6 peers; the rest go to "other"

  Fingerprint fp;
  State state = kRunning;
  // steady_clock nanoseconds as entries() returns them; in the ring itself, raw clock ticks.
  std::int64_t startNs = 0;
  std::int64_t endNs = 0;    // 0 while running
  std::int32_t nPeers = 0;
  TracePeerBytes peers[kPeerSlots];
  std::uint64_t otherSent = 0, otherRecv = 0;  // peers beyond the slots
  // Where an unfinished call stood: the first message (receives first) that waited on its peer.
  bool stuck = false;
  bool stuckSending = false;
  bool stuckHeader = false;  // the message's 64-byte header had gone through
  std::int32_t stuckPeer = -1;
  std::int32_t stuckChannel = 0;
  std::uint32_t stuckStep = 0;
  std::uint64_t stuckDone = 0, stuckBytes = 0;
};

struct TraceIdentity {
  int rank = 0;
  int nranks = 1;
  long pid = 0;
  std::string host;
  std::uint64_t commTag = 0;
};

class FlightRecorder {
 public:
  // Preallocates `capacity` entries (0 disables the recorder: every call below is one branch).
  // `dir` empty: record, but never write a file.
  void init(std::size_t capacity, std::string dir, TraceIdentity id);
  bool enabled() const { return !ring_.empty(); }

  // Hot path. begin() opens the entry of a call; tally() adds the bytes a plan moved (callable
  // more than once per call: the zero-copy path runs several small plans) and, if the plan did
  // not finish, where it stood; end() closes the entry. On failure end() writes the file once.
  void begin(const Fingerprint& fp) { begin(fp, ring_.empty() ? 0 : ticks()); }
  // The same at `now` (a value of now(), read once for the recorder and the live state).
  void begin(const Fingerprint& fp, std::int64_t now) {
    if (ring_.empty()) return;
    current_ = &ring_[slot_];
    slot_ = slot_ + 1 == ring_.size() ? 0 : slot_ + 1;  // no division on the call path
    ++next_;
    current_->fp = fp;
    current_->state = TraceEntry::kRunning;
    current_->startNs = now;
    current_->endNs = 0;
    current_->nPeers = 0;
    current_->otherSent = current_->otherRecv = 0;
    current_->stuck = false;
  }
  void tally(const Plan& plan);
  // Paths without a plan (comm/algorithms/mailbox.cc, cma.cc): bytes moved to and from a peer;
  // and, for a mailbox call that failed waiting, the peer it waited for (to read its message, or
  // to free its slot when posting).
  void peerBytes(int peer, std::uint64_t sent, std::uint64_t recv);
  void mailboxStuck(int peer, bool posting);
  void end(const Status& s) { end(s, current_ ? ticks() : 0); }
  void end(const Status& s, std::int64_t now) {
    if (current_) {
      current_->state = s.ok() ? TraceEntry::kDone : TraceEntry::kFailed;
      current_->endNs = now;
      current_ = nullptr;
    }
    if (!s.ok()) failed(s);
  }

  // Cold path: writes the file now unless it was written already (abort with no call running).
  void failed(const Status& s);
  // Frees the entries (the communicator is closed: its C handle may outlive it for a long time).
  void release() {
    std::vector<TraceEntry>().swap(ring_);
    current_ = nullptr;
    slot_ = 0;
  }
  // The JSON document (for tests and failed()); `error` is the failure being reported.
  std::string toJson(const Status& error) const;
  // Path of this rank's file under dir ("" when no directory is set).
  std::string path() const;
  // Entries oldest first (for tests).
  std::vector<TraceEntry> entries() const;
  bool written() const { return written_; }

  static std::int64_t nowNs();
  // The call path's clock (the TSC where usable, else nanoseconds), for the live state too; any
  // thread may convert its values (cold: reads the clocks once more for the scale).
  std::int64_t now() const { return ticks(); }
  double nsPerTick() const;
  std::int64_t toNs(std::int64_t t) const { return ns0_ + static_cast<std::int64_t>(static_cast<double>(t - tick0_) * nsPerTick()); }

 private:
  // The call path's clock: the TSC when it is usable, else nowNs(). entries() converts ticks to
  // nowNs() time with the pair read at init() and a pair read then.
  std::int64_t ticks() const;
  bool useTsc_ = false;
  std::int64_t tick0_ = 0, ns0_ = 0;

 public:

 private:
  std::vector<TraceEntry> ring_;
  std::uint64_t next_ = 0;  // entries ever begun
  std::size_t slot_ = 0;    // next_ % ring_.size()
  TraceEntry* current_ = nullptr;
  std::string dir_;
  TraceIdentity id_;
  bool written_ = false;
};

// "rank" file name under a directory: DIR/braid-trace-rank<N>.json.
std::string traceFileName(int rank);

}  // namespace braid
