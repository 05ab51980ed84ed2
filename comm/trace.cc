// The recorder's cold half: tallying a finished (or abandoned) plan, and writing the JSON file that
// `braid trace` reads (tools/trace.cc holds the reader; the format is versioned "braid-trace-1").
#include "comm/trace.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include "comm/engine.h"
#include "base/log.h"

namespace braid {
namespace {

void addBytes(TraceEntry& e, int peer, bool sent, std::uint64_t n) {
  for (std::int32_t i = 0; i < e.nPeers; ++i) {
    TracePeerBytes& p = e.peers[i];
    if (p.peer != peer) continue;
    (sent ? p.sent : p.recv) += n;
    return;
  }
  if (e.nPeers < TraceEntry::kPeerSlots) {
    e.peers[e.nPeers++] = {peer, sent ? n : 0, sent ? 0 : n};
    return;
  }
  (sent ? e.otherSent : e.otherRecv) += n;
}

void appendEscaped(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

const char* stateName(TraceEntry::State s) {
  switch (s) {
    case TraceEntry::kRunning: return "running";
    case TraceEntry::kDone: return "done";
    case TraceEntry::kFailed: return "failed";
  }
  return "unknown";
}

}  // namespace

namespace {
// The TSC counts at a constant rate (CPUID's invariant-TSC bit) and the kernel keeps time with it
// (so it is synchronized across cores); otherwise steady_clock.
bool tscUsable() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0x80000007, &a, &b, &c, &d) || !(d & (1u << 8))) return false;
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  return f >> source && source == "tsc";
#else
  return false;
#endif
}
}  // namespace

std::int64_t FlightRecorder::ticks() const {
#if defined(__x86_64__)
  if (useTsc_) return static_cast<std::int64_t>(__rdtsc());
#endif
  return nowNs();
}

double FlightRecorder::nsPerTick() const {
  if (!useTsc_) return 1.0;
  const std::int64_t tick1 = ticks(), ns1 = nowNs();
  return tick1 > tick0_ ? static_cast<double>(ns1 - ns0_) / static_cast<double>(tick1 - tick0_) : 1.0;
}

std::int64_t FlightRecorder::nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string traceFileName(int rank) { return "braid-trace-rank" + std::to_string(rank) + ".json"; }

void FlightRecorder::init(std::size_t capacity, std::string dir, TraceIdentity id) {
  ring_.assign(capacity, TraceEntry{});
  useTsc_ = tscUsable();  // (the live state reads this clock with the recorder off too)
  tick0_ = ticks();
  ns0_ = nowNs();
  next_ = 0;
  slot_ = 0;
  current_ = nullptr;
  dir_ = std::move(dir);
  id_ = std::move(id);
  written_ = false;
}

// A message "waits on its peer" unless a local dependency holds it back; among those, receives
// come first (a rank that cannot send is usually waiting for its peer to receive something else).
void FlightRecorder::tally(const Plan& plan) {
  TraceEntry* e = current_;
  if (!e) return;
  for (const Op& op : plan.ops_) addBytes(*e, op.peer, op.kind == Op::kSend, op.done);
  const Op* pick = nullptr;
  int best = 4;
  for (std::size_t i = 0; i < plan.numQueues_; ++i) {  // the plan's queues (the rest are spares)
    const Plan::Queue& q = plan.queues_[i];
    if (q.head >= q.ops.size()) continue;
    const Op& op = plan.ops_[static_cast<std::size_t>(q.ops[q.head])];
    bool gated = false;
    if (op.dep >= 0) {
      const Op& d = plan.ops_[static_cast<std::size_t>(op.dep)];
      gated = !d.started || (op.kind != Op::kRecvCopy && op.started && d.done <= op.done && op.done < op.bytes);
    }
    int score = (gated ? 2 : 0) + (q.sending ? 1 : 0);
    if (score < best) {
      best = score;
      pick = &op;
    }
  }
  if (!pick) return;
  e->stuck = true;
  e->stuckSending = pick->kind == Op::kSend;
  e->stuckHeader = pick->started;
  e->stuckPeer = pick->peer;
  e->stuckChannel = pick->channel;
  e->stuckStep = pick->step;
  e->stuckDone = pick->done;
  e->stuckBytes = pick->bytes;
}

void FlightRecorder::peerBytes(int peer, std::uint64_t sent, std::uint64_t recv) {
  if (!current_) return;
  if (sent) addBytes(*current_, peer, true, sent);
  if (recv) addBytes(*current_, peer, false, recv);
}

void FlightRecorder::mailboxStuck(int peer, bool posting) {
  TraceEntry* e = current_;
  if (!e || peer < 0) return;
  e->stuck = true;
  e->stuckSending = posting;
  e->stuckHeader = false;
  e->stuckPeer = peer;
  e->stuckChannel = 0;
  e->stuckStep = 0;
  e->stuckDone = 0;
  e->stuckBytes = 0;
}

std::vector<TraceEntry> FlightRecorder::entries() const {
  std::vector<TraceEntry> out;
  const std::size_t cap = ring_.size();
  if (!cap) return out;
  std::uint64_t first = next_ > cap ? next_ - cap : 0;
  const std::int64_t tick1 = ticks(), ns1 = nowNs();
  const double nsPerTick = tick1 > tick0_ ? static_cast<double>(ns1 - ns0_) / static_cast<double>(tick1 - tick0_) : 1.0;
  auto toNs = [&](std::int64_t t) {
    return t ? ns0_ + static_cast<std::int64_t>(static_cast<double>(t - tick0_) * nsPerTick) : 0;
  };
  for (std::uint64_t i = first; i < next_; ++i) {
    TraceEntry e = ring_[i % cap];
    e.startNs = toNs(e.startNs);
    e.endNs = toNs(e.endNs);
    out.push_back(e);
  }
  return out;
}

std::string FlightRecorder::path() const {
  if (dir_.empty()) return "";
  return dir_ + (dir_.back() == '/' ? "" : "/") + traceFileName(id_.rank);
}

std::string FlightRecorder::toJson(const Status& error) const {
  auto num = [](auto v) { return std::to_string(v); };
  std::string o;
  o.reserve(4096 + ring_.size() * 256);
  char tag[17];
  std::snprintf(tag, sizeof(tag), "%016llx", static_cast<unsigned long long>(id_.commTag));
  const auto unixNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  o += "{\n  \"schema\": \"braid.trace/1\",\n  \"format\": \"braid-trace-1\",\n";
  o += "  \"rank\": " + num(id_.rank) + ",\n  \"nranks\": " + num(id_.nranks) + ",\n  \"pid\": " + num(id_.pid) + ",\n";
  o += "  \"host\": ";
  appendEscaped(o, id_.host);
  o += ",\n  \"comm\": \"" + std::string(tag) + "\",\n  \"reason\": ";
  appendEscaped(o, codeName(error.code()));
  o += ",\n  \"error\": ";
  appendEscaped(o, error.message());
  // The two clocks read together, so that steady_clock times below convert to wall time.
  o += ",\n  \"steady_ns\": " + num(nowNs()) + ",\n  \"unix_ns\": " + num(unixNs) + ",\n";
  o += "  \"buffer\": " + num(ring_.size()) + ",\n  \"recorded\": " + num(next_) + ",\n  \"entries\": [";
  bool firstEntry = true;
  for (const TraceEntry& e : entries()) {
    o += firstEntry ? "\n" : ",\n";
    firstEntry = false;
    const Fingerprint& f = e.fp;
    o += "    {\"seq\": " + num(f.seq) + ", \"coll\": \"" + collName(f.kind) + "\", \"dtype\": \"" +
         dataTypeName(f.dtype) + "\", \"op\": \"" + reduceOpName(f.op) + "\", \"count\": " + num(f.count) +
         ", \"root\": " + num(f.root) + ", \"sender\": " + num(f.sender) + ", \"state\": \"" + stateName(e.state) +
         "\", \"start_ns\": " + num(e.startNs) + ", \"end_ns\": " + num(e.endNs) + ",\n     \"peers\": [";
    for (std::int32_t i = 0; i < e.nPeers; ++i)
      o += std::string(i ? ", " : "") + "{\"peer\": " + num(e.peers[i].peer) + ", \"sent\": " + num(e.peers[i].sent) +
           ", \"recv\": " + num(e.peers[i].recv) + "}";
    o += "]";
    if (e.otherSent || e.otherRecv)
      o += ", \"other_sent\": " + num(e.otherSent) + ", \"other_recv\": " + num(e.otherRecv);
    if (e.stuck)
      o += ",\n     \"stuck\": {\"peer\": " + num(e.stuckPeer) + ", \"dir\": \"" + (e.stuckSending ? "send" : "recv") +
           "\", \"step\": " + num(e.stuckStep) + ", \"channel\": " + num(e.stuckChannel) +
           ", \"header\": " + (e.stuckHeader ? "true" : "false") + ", \"done\": " + num(e.stuckDone) +
           ", \"bytes\": " + num(e.stuckBytes) + "}";
    o += "}";
  }
  o += "\n  ]\n}\n";
  return o;
}

void FlightRecorder::failed(const Status& s) {
  if (written_ || ring_.empty() || dir_.empty()) return;
  written_ = true;  // once per communicator: the first failure is the root cause
  if (::mkdir(dir_.c_str(), 0777) != 0 && errno != EEXIST) {
    BRAID_LOG(kWarn, kColl, "BRAID_TRACE_DIR=%s: cannot create it: %s", dir_.c_str(), std::strerror(errno));
    return;
  }
  const std::string file = path();
  const std::string tmp = file + ".tmp" + std::to_string(id_.pid);
  const std::string text = toJson(s);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f) ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), file.c_str()) != 0) {
    BRAID_LOG(kWarn, kColl, "could not write the flight recorder to %s: %s", file.c_str(), std::strerror(errno));
    std::remove(tmp.c_str());
    return;
  }
  BRAID_LOG(kWarn, kColl, "flight recorder written to %s (read it with: braid trace %s)", file.c_str(), dir_.c_str());
}

}  // namespace braid
