// What a rank is doing right now, for `braid status`: the call it is in (or its last one), since
// when, the bytes it has moved, and the peer it last waited on. The executing thread writes it
// with relaxed stores (a version counter around the call's fields, as a seqlock); the watcher
// thread reads it when the store relays an observer's query, and answers with one JSON record.
// Cost on the call path: about ten plain stores at the start and end of a call, two plain adds
// per piece of data moved (the total and the peer's), and a clock read when a wait ends
// (LiveProgress, comm/engine.cc).
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/engine.h"
#include "comm/fingerprint.h"

namespace braid {

// One rank's metrics, as its metrics port serves them and braid status --prom prints them (from
// the rank's record): one formatter for both, prometheusText.
struct RankMetrics {
  struct PerKind {
    std::string collective;
    std::uint64_t calls = 0, failed = 0, bytes = 0;
    double seconds = 0;
  };
  int rank = 0;
  std::string host, state;
  bool answered = true, inCall = false;
  double callSeconds = 0, bytesPerSec = 0;
  std::uint64_t bytes = 0, calls = 0, failed = 0, lastCollective = 0;
  std::vector<PerKind> byKind;  // the collectives this rank has called
  struct Peer {
    int peer;
    std::uint64_t bytes;
    double stallSeconds;  // time this rank's plans waited with this peer the one they waited on
  };
  std::vector<Peer> peers;  // the peers it waited on longest or moved most with (peer -1: the rest)
};
// Prometheus text exposition (0.0.4); `stalled` >= 0 adds braid_job_stalled (braid status's verdict).
std::string prometheusText(const std::vector<RankMetrics>& ranks, int stalled = -1);

class LiveState {
 public:
  // The executing thread (one call at a time, under the communicator's execution mutex).
  // `now`: the flight recorder's clock (FlightRecorder::now: TSC ticks where usable), read once
  // per call for both; readers convert with its nsPerTick.
  void begin(const Fingerprint& fp, std::int64_t now);
  void end(bool ok, std::int64_t now);
  LiveProgress& progress() { return progress_; }
  // Any thread: nanoseconds this rank's calls waited on a peer, all calls so far.
  std::uint64_t stallNs() const { return progress_.stallNs.load(std::memory_order_relaxed); }
  // Any thread: the totals by collective, and this rank's metrics now.
  RankMetrics metrics(int rank, const std::string& host, std::int64_t now, double nsPerTick) const;

  // Any thread: this rank's record as JSON (one line), schema braid.status/1's rank object.
  std::string record(int rank, int nranks, const std::string& host, long pid, std::int64_t now, double nsPerTick) const;

 private:
  std::atomic<std::uint32_t> version_{0};  // odd while begin/end write
  std::atomic<bool> inCall_{false};
  std::atomic<std::uint8_t> kind_{0}, dtype_{0}, op_{0};
  std::atomic<std::uint64_t> count_{0}, seq_{0};
  std::atomic<std::int32_t> root_{-1}, sender_{-1};
  std::atomic<std::int64_t> start_{0};  // the call's start (clock ticks)
  std::atomic<std::uint64_t> collectivesDone_{0};  // the last collective finished (its sequence number)
  std::atomic<std::uint64_t> calls_{0}, failed_{0};
  std::uint64_t bytesAtBegin_ = 0;  // (the executing thread's own)
  // Per CollKind (by its value): calls, failed calls, payload bytes and clock ticks in calls.
  struct Totals {
    std::atomic<std::uint64_t> calls{0}, failed{0}, bytes{0}, ticks{0};
  };
  static constexpr std::size_t kKinds = 10;
  std::array<Totals, kKinds> totals_;
  LiveProgress progress_;
  // A consistent read of the call's fields (the seqlock), and the peers a record names: the 16
  // waited on longest or that carried the most; the rest summed in *other (peer -1).
  struct Snapshot {
    Fingerprint fp;
    bool in = false;
    std::int64_t start = 0;
    std::uint64_t done = 0, calls = 0, failed = 0;
  };
  Snapshot snapshot() const;
  static constexpr std::size_t kTopPeers = 16;
  std::vector<RankMetrics::Peer> topPeers(RankMetrics::Peer* other, std::size_t* left) const;
};

}  // namespace braid
