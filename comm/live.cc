#include "comm/live.h"

#include <algorithm>
#include <cstdio>
#include <thread>

namespace braid {

void LiveState::begin(const Fingerprint& fp, std::int64_t now) {
  const std::uint32_t v = version_.load(std::memory_order_relaxed);
  version_.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  kind_.store(static_cast<std::uint8_t>(fp.kind), std::memory_order_relaxed);
  dtype_.store(static_cast<std::uint8_t>(fp.dtype), std::memory_order_relaxed);
  op_.store(static_cast<std::uint8_t>(fp.op), std::memory_order_relaxed);
  count_.store(fp.count, std::memory_order_relaxed);
  seq_.store(fp.seq, std::memory_order_relaxed);
  root_.store(fp.root, std::memory_order_relaxed);
  sender_.store(fp.sender, std::memory_order_relaxed);
  start_.store(now, std::memory_order_relaxed);
  progress_.waitPeer.store(-1, std::memory_order_relaxed);
  bytesAtBegin_ = progress_.bytes.load(std::memory_order_relaxed);
  inCall_.store(true, std::memory_order_relaxed);
  version_.store(v + 2, std::memory_order_release);
}

void LiveState::end(bool ok, std::int64_t now) {
  const auto bump = LiveProgress::bump;  // (a plain add by the only writer)
  if (!inCall_.load(std::memory_order_relaxed)) return;  // (a call refused before it began)
  const std::size_t k = std::min<std::size_t>(kind_.load(std::memory_order_relaxed), kKinds - 1);
  Totals& t = totals_[k];
  bump(t.calls, 1);
  if (!ok) bump(t.failed, 1);
  bump(t.bytes, progress_.bytes.load(std::memory_order_relaxed) - bytesAtBegin_);
  bump(t.ticks, static_cast<std::uint64_t>(std::max<std::int64_t>(0, now - start_.load(std::memory_order_relaxed))));
  const std::uint32_t v = version_.load(std::memory_order_relaxed);
  version_.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  inCall_.store(false, std::memory_order_relaxed);
  if (static_cast<CollKind>(kind_.load(std::memory_order_relaxed)) != CollKind::kSendRecv && ok)
    collectivesDone_.store(seq_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  bump(calls_, 1);
  if (!ok) bump(failed_, 1);
  version_.store(v + 2, std::memory_order_release);
}

LiveState::Snapshot LiveState::snapshot() const {
  Snapshot x;
  // A seqlock read: retried while a call starts or ends (yielding now and then, should the writer
  // have been preempted in between).
  for (int attempt = 0;; ++attempt) {
    const std::uint32_t v = version_.load(std::memory_order_acquire);
    if (!(v & 1)) {
      x.in = inCall_.load(std::memory_order_relaxed);
      x.fp.kind = static_cast<CollKind>(kind_.load(std::memory_order_relaxed));
      x.fp.dtype = static_cast<DataType>(dtype_.load(std::memory_order_relaxed));
      x.fp.op = static_cast<ReduceOp>(op_.load(std::memory_order_relaxed));
      x.fp.count = count_.load(std::memory_order_relaxed);
      x.fp.seq = seq_.load(std::memory_order_relaxed);
      x.fp.root = root_.load(std::memory_order_relaxed);
      x.fp.sender = sender_.load(std::memory_order_relaxed);
      x.start = start_.load(std::memory_order_relaxed);
      x.done = collectivesDone_.load(std::memory_order_relaxed);
      x.calls = calls_.load(std::memory_order_relaxed);
      x.failed = failed_.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (version_.load(std::memory_order_relaxed) == v) return x;
    }
    if (attempt % 64 == 63) std::this_thread::yield();
  }
}

std::vector<RankMetrics::Peer> LiveState::topPeers(RankMetrics::Peer* other, std::size_t* left) const {
  std::vector<RankMetrics::Peer> all;
  for (int p = 0; p < progress_.peers; ++p) {
    const std::uint64_t b = progress_.peerBytes[p].load(std::memory_order_relaxed);
    const std::uint64_t ns = progress_.peerStallNs[p].load(std::memory_order_relaxed);
    if (b || ns) all.push_back({p, b, static_cast<double>(ns) / 1e9});
  }
  // The peers waited on longest, then those that carried the most.
  std::sort(all.begin(), all.end(), [](const RankMetrics::Peer& a, const RankMetrics::Peer& b) {
    return a.stallSeconds != b.stallSeconds ? a.stallSeconds > b.stallSeconds : a.bytes > b.bytes;
  });
  *other = {-1, 0, 0};
  for (std::size_t i = kTopPeers; i < all.size(); ++i) other->bytes += all[i].bytes, other->stallSeconds += all[i].stallSeconds;
  const std::size_t rest = all.size() > kTopPeers ? all.size() - kTopPeers : 0;
  all.resize(std::min(all.size(), kTopPeers));
  *left = rest;
  return all;
}

std::string LiveState::record(int rank, int nranks, const std::string& host, long pid, std::int64_t now, double nsPerTick) const {
  const Snapshot x = snapshot();
  const Fingerprint& fp = x.fp;
  const bool in = x.in;
  const bool any = fp.seq != 0 || in;
  std::string call = any ? fp.describe() : "";
  std::string quoted;  // (describe() writes no quotes or backslashes; keep the JSON valid regardless)
  for (char c : call) quoted += c == '"' || c == '\\' ? '_' : c;
  std::string h;
  for (char c : host) h += c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20 ? '_' : c;
  std::string byKind;
  for (std::size_t k = 1; k < kKinds; ++k) {
    const std::uint64_t calls = totals_[k].calls.load(std::memory_order_relaxed);
    if (!calls) continue;
    char b[192];
    std::snprintf(b, sizeof(b), "%s\"%s\": {\"calls\": %llu, \"failed\": %llu, \"bytes\": %llu, \"seconds\": %.6f}",
                  byKind.empty() ? "" : ", ", collName(static_cast<CollKind>(k)), static_cast<unsigned long long>(calls),
                  static_cast<unsigned long long>(totals_[k].failed.load(std::memory_order_relaxed)),
                  static_cast<unsigned long long>(totals_[k].bytes.load(std::memory_order_relaxed)),
                  static_cast<double>(totals_[k].ticks.load(std::memory_order_relaxed)) * nsPerTick / 1e9);
    byKind += b;
  }
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "{\"rank\": %d, \"nranks\": %d, \"host\": \"%s\", \"pid\": %ld, \"in_call\": %s, \"call\": \"%s\", "
                "\"kind\": \"%s\", \"seq\": %llu, \"for_ms\": %.1f, \"bytes\": %llu, \"wait_peer\": %d, \"wait_channel\": %d, "
                "\"wait_step\": %u, \"wait_sending\": %s, \"last_collective\": %llu, \"calls\": %llu, \"failed\": %llu}",
                rank, nranks, h.c_str(), pid, in ? "true" : "false", quoted.c_str(), any ? collName(fp.kind) : "",
                static_cast<unsigned long long>(fp.seq), in ? static_cast<double>(now - x.start) * nsPerTick / 1e6 : 0.0,
                static_cast<unsigned long long>(progress_.bytes.load(std::memory_order_relaxed)),
                in ? progress_.waitPeer.load(std::memory_order_relaxed) : -1, progress_.waitChannel.load(std::memory_order_relaxed),
                progress_.waitStep.load(std::memory_order_relaxed), progress_.waitSending.load(std::memory_order_relaxed) ? "true" : "false",
                static_cast<unsigned long long>(x.done), static_cast<unsigned long long>(x.calls), static_cast<unsigned long long>(x.failed));
  RankMetrics::Peer other;
  std::size_t left = 0;
  std::string peers;
  for (const RankMetrics::Peer& p : topPeers(&other, &left)) {
    char e[128];
    std::snprintf(e, sizeof(e), "%s{\"peer\": %d, \"bytes\": %llu, \"stall_s\": %.6f}", peers.empty() ? "" : ", ", p.peer,
                  static_cast<unsigned long long>(p.bytes), p.stallSeconds);
    peers += e;
  }
  char rest[160];
  std::snprintf(rest, sizeof(rest), "\"other_peers\": {\"count\": %zu, \"bytes\": %llu, \"stall_s\": %.6f}", left,
                static_cast<unsigned long long>(other.bytes), other.stallSeconds);
  std::string out = buf;
  out.pop_back();  // the closing brace: the totals by collective and by peer follow
  return out + ", \"by_collective\": {" + byKind + "}, \"peers\": [" + peers + "], " + rest + "}";
}

RankMetrics LiveState::metrics(int rank, const std::string& host, std::int64_t now, double nsPerTick) const {
  const Snapshot x = snapshot();
  RankMetrics m;
  m.rank = rank;
  m.host = host;
  m.inCall = x.in;
  m.state = m.inCall ? "in call" : "idle";
  m.callSeconds = m.inCall ? static_cast<double>(now - x.start) * nsPerTick / 1e9 : 0;
  m.bytes = progress_.bytes.load(std::memory_order_relaxed);
  m.calls = x.calls;
  m.failed = x.failed;
  m.lastCollective = x.done;
  for (std::size_t k = 1; k < kKinds; ++k)
    if (const std::uint64_t calls = totals_[k].calls.load(std::memory_order_relaxed))
      m.byKind.push_back({collName(static_cast<CollKind>(k)), calls, totals_[k].failed.load(std::memory_order_relaxed),
                          totals_[k].bytes.load(std::memory_order_relaxed),
                          static_cast<double>(totals_[k].ticks.load(std::memory_order_relaxed)) * nsPerTick / 1e9});
  RankMetrics::Peer other;
  std::size_t left = 0;
  m.peers = topPeers(&other, &left);
  if (other.bytes || other.stallSeconds > 0) m.peers.push_back(other);
  return m;
}

namespace {
// A label value as the exposition format quotes it.
std::string promLabel(const std::string& v) {
  std::string out;
  for (char c : v) out += c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : std::string(1, c);
  return out;
}
std::string promNumber(double v) {
  char b[64];
  if (v == static_cast<double>(static_cast<long long>(v)) && v < 9.0e15 && v > -9.0e15)
    std::snprintf(b, sizeof(b), "%lld", static_cast<long long>(v));
  else
    std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}
}  // namespace

std::string prometheusText(const std::vector<RankMetrics>& ranks, int stalled) {
  struct Metric {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const RankMetrics&);
  };
  static const Metric perRank[] = {
      {"braid_rank_up", "gauge", "1 if the rank answered", [](const RankMetrics& m) { return m.answered ? 1.0 : 0.0; }},
      {"braid_rank_in_call", "gauge", "1 while the rank is inside a call", [](const RankMetrics& m) { return m.inCall ? 1.0 : 0.0; }},
      {"braid_rank_call_seconds", "gauge", "seconds the rank has been in its current call", [](const RankMetrics& m) { return m.callSeconds; }},
      {"braid_rank_bytes_total", "counter", "payload bytes the rank sent and received on this communicator",
       [](const RankMetrics& m) { return static_cast<double>(m.bytes); }},
      {"braid_rank_bytes_per_second", "gauge", "payload bytes per second between braid status's two samples",
       [](const RankMetrics& m) { return m.bytesPerSec; }},
      {"braid_rank_calls_total", "counter", "calls the rank finished", [](const RankMetrics& m) { return static_cast<double>(m.calls); }},
      {"braid_rank_failed_calls_total", "counter", "calls that failed", [](const RankMetrics& m) { return static_cast<double>(m.failed); }},
      {"braid_rank_last_collective", "gauge", "sequence number of the last collective the rank finished",
       [](const RankMetrics& m) { return static_cast<double>(m.lastCollective); }},
  };
  std::string out;
  auto labels = [](const RankMetrics& m) { return "rank=\"" + std::to_string(m.rank) + "\",host=\"" + promLabel(m.host) + "\""; };
  for (const Metric& x : perRank) {
    out += std::string("# HELP ") + x.name + " " + x.help + "\n# TYPE " + x.name + " " + x.type + "\n";
    for (const RankMetrics& m : ranks) out += std::string(x.name) + "{" + labels(m) + "} " + promNumber(x.value(m)) + "\n";
  }
  // The state as a label of its own series (one per rank), so the others keep theirs.
  out += "# HELP braid_rank_state the rank's state (progressing, waiting, idle, in call, stopped, silent, gone, ...)\n"
         "# TYPE braid_rank_state gauge\n";
  for (const RankMetrics& m : ranks) out += "braid_rank_state{" + labels(m) + ",state=\"" + promLabel(m.state) + "\"} 1\n";
  struct KindMetric {
    const char* name;
    const char* help;
    double (*value)(const RankMetrics::PerKind&);
  };
  static const KindMetric perKind[] = {
      {"braid_collective_calls_total", "calls of this collective", [](const RankMetrics::PerKind& k) { return static_cast<double>(k.calls); }},
      {"braid_collective_failed_calls_total", "failed calls of this collective",
       [](const RankMetrics::PerKind& k) { return static_cast<double>(k.failed); }},
      {"braid_collective_bytes_total", "payload bytes sent and received in this collective",
       [](const RankMetrics::PerKind& k) { return static_cast<double>(k.bytes); }},
      {"braid_collective_seconds_total", "seconds spent in this collective", [](const RankMetrics::PerKind& k) { return k.seconds; }},
  };
  for (const KindMetric& x : perKind) {
    out += std::string("# HELP ") + x.name + " " + x.help + "\n# TYPE " + x.name + " counter\n";
    for (const RankMetrics& m : ranks)
      for (const RankMetrics::PerKind& k : m.byKind)
        out += std::string(x.name) + "{" + labels(m) + ",collective=\"" + promLabel(k.collective) + "\"} " + promNumber(x.value(k)) + "\n";
  }
  static const struct {
    const char* name;
    const char* help;
    bool stall;
  } perPeer[] = {{"braid_peer_bytes_total", "payload bytes sent to and received from this peer", false},
                 {"braid_peer_stall_seconds_total", "seconds the rank's calls waited with this peer the one they waited on", true}};
  for (const auto& x : perPeer) {
    out += std::string("# HELP ") + x.name + " " + x.help + "\n# TYPE " + x.name + " counter\n";
    for (const RankMetrics& m : ranks)
      for (const RankMetrics::Peer& p : m.peers)
        out += std::string(x.name) + "{" + labels(m) + ",peer=\"" + (p.peer < 0 ? std::string("other") : std::to_string(p.peer)) + "\"} " +
               promNumber(x.stall ? p.stallSeconds : static_cast<double>(p.bytes)) + "\n";
  }
  if (stalled >= 0)
    out += "# HELP braid_job_stalled 1 if braid status judged the job stalled\n# TYPE braid_job_stalled gauge\nbraid_job_stalled " +
           std::to_string(stalled) + "\n";
  return out;
}

}  // namespace braid
