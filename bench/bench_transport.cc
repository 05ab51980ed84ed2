// Braid: what the transports and the progress engine cost, each beside the raw limit measured in
// this same process, so that a ratio survives the machine's drift and noise where absolute numbers
// do not.
//
// Two ranks live as two threads of this process. The transport benchmarks get their connections
// from the transport itself (tests/common/transport_pair.h, as the conformance tests do), drive a
// Channel directly and spin on its nonblocking calls, so they see the transport alone: no
// communicator, engine, Waiter or wire header.
//  - pingPong: the benchmark thread sends M bytes, the partner echoes them back; one iteration
//    is one round trip. Raw limits: for shm a mailbox in plain shared memory (copy in, flip a
//    flag, copy out: the least any shared-memory transport must do); for tcp the same echo over
//    a plain loopback socket pair, nonblocking and polled, as Braid's tcp channel polls.
//  - stream: one-way bandwidth for M-byte messages. One iteration sends enough messages to move
//    at least kBatchBytes and then waits until the receiver holds all of them, so every timed
//    byte has arrived and the pipeline's fill and drain are spread over a long batch. Raw limits:
//    memcpy of the same bytes for shm (a transport that copies in and out cannot beat one copy),
//    the plain socket pair for tcp.
//  - allReduce: the per-call cost of an 8-byte braidAllReduce on 1 rank (API, validation, the
//    local copy) and on 2 ranks (plan, engine, one exchange).
// Each raw row stores what it measured; the transport rows that follow report the ratio to it
// (counter of_raw). If the raw row was filtered out, the transport row measures the limit itself.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "braid/braid.h"
#include "comm/c_handle.h"
#include "base/config.h"
#include "tests/common/transport_pair.h"
#include "transport/transport.h"

namespace {

using Clock = std::chrono::steady_clock;

// A batch moves at least this many bytes, so small messages still stream and the batch-end wait
// is a small share of the time.
constexpr std::size_t kBatchBytes = 16u << 20;

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::size_t messagesPerBatch(std::size_t bytes) { return std::max<std::size_t>(1, kBatchBytes / bytes); }

// Pages touched before timing: a first touch costs several times a memcpy on this machine type.
std::vector<std::byte> touched(std::size_t bytes, int seed) {
  std::vector<std::byte> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(seed)) & 0xff);
  return v;
}

// Every wait in this file spins for up to kSpinBeforeYield, then spins with a yield per pass, as
// Braid's Waiter does by default. Counting time rather than passes keeps the raw links (a pass is
// one load) and the Braid channels (a pass is a call) on the same footing; yielding at all lets a
// descheduled peer run when other work shares the 2 cores.
constexpr auto kSpinBeforeYield = std::chrono::microseconds(50);

class Backoff {
 public:
  void idle() {
    if (++passes_ % 64 != 0) return;
    const auto now = Clock::now();
    if (since_ == Clock::time_point{}) since_ = now;
    if (now - since_ > kSpinBeforeYield) std::this_thread::yield();
  }
  void reset() {
    passes_ = 0;
    since_ = Clock::time_point{};
  }

 private:
  unsigned passes_ = 0;
  Clock::time_point since_{};
};

// ---- Raw limits, kept so the transport rows can report a ratio. A limit is the best the raw path
// achieved, so across repetitions the quickest run is kept, not the last.

struct RawKey {
  std::string what;
  std::size_t bytes;
  bool operator<(const RawKey& o) const { return std::tie(what, bytes) < std::tie(o.what, o.bytes); }
};
std::mutex rawMu;
std::map<RawKey, double> rawSeen;  // seconds per iteration

void storeRaw(const std::string& what, std::size_t bytes, double secPerIter) {
  std::lock_guard<std::mutex> lock(rawMu);
  auto [it, fresh] = rawSeen.try_emplace({what, bytes}, secPerIter);
  if (!fresh) it->second = std::min(it->second, secPerIter);
}

double lookupRaw(const std::string& what, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(rawMu);
  auto it = rawSeen.find({what, bytes});
  return it == rawSeen.end() ? 0.0 : it->second;
}

// A connected loopback TCP pair of our own (nothing from Braid) with TCP_NODELAY and the kernel's
// default buffer sizes, which is also how Braid's tcp transport sets its sockets up: the two
// differ only in what Braid does per call.
class SocketPair {
 public:
  SocketPair() = default;
  SocketPair(const SocketPair&) = delete;
  SocketPair& operator=(const SocketPair&) = delete;
  ~SocketPair() {
    for (int fd : {a_, b_})
      if (fd >= 0) ::close(fd);
  }
  bool open(std::string* err) {
    int lst = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bool ok = lst >= 0 && ::bind(lst, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
              ::listen(lst, 1) == 0 && ::getsockname(lst, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    if (ok) {
      a_ = ::socket(AF_INET, SOCK_STREAM, 0);
      ok = a_ >= 0 && ::connect(a_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    }
    if (ok) {
      b_ = ::accept(lst, nullptr, nullptr);
      ok = b_ >= 0;
    }
    int one = 1;
    for (int fd : {a_, b_})
      ok = ok && ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0;
    if (!ok) *err = std::string("loopback socket pair: ") + std::strerror(errno);
    if (lst >= 0) ::close(lst);
    return ok;
  }
  int a() const { return a_; }
  int b() const { return b_; }

 private:
  int a_ = -1, b_ = -1;
};

// Each kind of link below offers the same two calls, send(side, ...) and recv(side, ...), with
// side 0 the benchmark thread and side 1 the partner thread, so that one ping-pong loop and one
// stream loop time all of them and only the link differs between a row and its raw limit. A
// wait gives up (returns false) when `stop` is set, which is how the partner thread is ended.

// Polled like Braid's tcp channel (MSG_DONTWAIT), so the raw pair and the channel pay the same
// kind of system calls and differ only in what Braid adds.
class SocketLink {
 public:
  bool open(std::string* err) { return pair_.open(err); }
  bool send(int side, const std::byte* p, std::size_t n, const std::atomic<bool>* stop) {
    const int fd = side == 0 ? pair_.a() : pair_.b();
    Backoff b;
    while (n > 0) {
      ssize_t k = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        b.reset();
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (stop && stop->load(std::memory_order_relaxed)) return false;
        b.idle();
      } else {
        return false;
      }
    }
    return true;
  }
  bool recv(int side, std::byte* p, std::size_t n, const std::atomic<bool>* stop) {
    const int fd = side == 0 ? pair_.a() : pair_.b();
    Backoff b;
    while (n > 0) {
      ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        b.reset();
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (stop && stop->load(std::memory_order_relaxed)) return false;
        b.idle();
      } else {
        return false;
      }
    }
    return true;
  }

 private:
  SocketPair pair_;
};

// The least a shared-memory round trip can cost: copy into a shared slot whose sequence number
// shares the first cache line with the data, publish it with one release store; the peer sees it
// and copies out. A small message thus crosses between the cores as one cache line. One slot per
// direction, so it is only correct when sends alternate with replies, as in a ping-pong.
class MailboxLink {
 public:
  explicit MailboxLink(std::size_t bytes) : slot_{Slot(bytes), Slot(bytes)} {}
  bool send(int side, const std::byte* p, std::size_t n, const std::atomic<bool>*) {
    Slot& s = slot_[side];
    std::memcpy(s.data(), p, n);
    s.seq().store(++s.sent, std::memory_order_release);
    return true;
  }
  bool recv(int side, std::byte* p, std::size_t n, const std::atomic<bool>* stop) {
    Slot& s = slot_[1 - side];
    const std::uint64_t want = ++s.taken;
    Backoff b;
    while (s.seq().load(std::memory_order_acquire) < want) {
      if (stop && stop->load(std::memory_order_relaxed)) return false;
      b.idle();
    }
    std::memcpy(p, s.data(), n);
    return true;
  }

 private:
  class Slot {
   public:
    explicit Slot(std::size_t bytes) : mem_(64 + bytes + 64) {
      auto addr = reinterpret_cast<std::uintptr_t>(mem_.data());
      base_ = mem_.data() + ((64 - addr % 64) % 64);
      new (base_) std::atomic<std::uint64_t>(0);
    }
    Slot(Slot&&) = default;  // a moved vector keeps its buffer, so base_ stays valid
    std::atomic<std::uint64_t>& seq() { return *std::launder(reinterpret_cast<std::atomic<std::uint64_t>*>(base_)); }
    std::byte* data() { return base_ + sizeof(std::uint64_t); }
    alignas(64) std::uint64_t sent = 0;   // the sender's count, on a line of its own
    alignas(64) std::uint64_t taken = 0;  // the receiver's count, likewise

   private:
    std::vector<std::byte> mem_;
    std::byte* base_;
  };
  Slot slot_[2];
};

// ---- Two Braid ranks as two threads of this process (for the all-reduce rows: the whole stack).

class RankPair {
 public:
  // tcp: BRAID_SHM_DISABLE=1 before the communicators exist, which is when the setting is read.
  static std::unique_ptr<RankPair> create(bool tcp, std::string* err) {
    setenv("BRAID_SHM_DISABLE", tcp ? "1" : "0", 1);
    setenv("BRAID_TIMEOUT", "60", 1);
    auto p = std::unique_ptr<RankPair>(new RankPair);
    braidUniqueId id;
    if (braidGetUniqueId(&id) != braidSuccess) {
      *err = std::string("braidGetUniqueId: ") + braidGetLastError(nullptr);
      return nullptr;
    }
    braidResult_t r1 = braidInternalError;
    std::thread t([&] { r1 = braidCommInitRank(&p->b_, 2, id, 1); });
    braidResult_t r0 = braidCommInitRank(&p->a_, 2, id, 0);
    t.join();
    unsetenv("BRAID_SHM_DISABLE");
    if (r0 != braidSuccess || r1 != braidSuccess) {
      *err = std::string("braidCommInitRank: ") + braidGetLastError(r0 != braidSuccess ? p->a_ : p->b_);
      return nullptr;
    }
    const std::string want = tcp ? "tcp" : "shm";
    if (p->a_->impl->transportOf(1) != want) {
      *err = "rank 1 is reached over " + p->a_->impl->transportOf(1) + ", not " + want;
      return nullptr;
    }
    return p;
  }
  RankPair(const RankPair&) = delete;
  RankPair& operator=(const RankPair&) = delete;
  // Destroy is collective: both ranks leave together.
  ~RankPair() {
    if (a_ && b_) {
      std::thread t([this] { braidCommDestroy(b_); });
      braidCommDestroy(a_);
      t.join();
    } else {
      if (a_) braidCommAbort(a_);
      if (b_) braidCommAbort(b_);
    }
  }
  braidComm_t comm(int side) const { return side == 0 ? a_ : b_; }

 private:
  RankPair() = default;
  braidComm_t a_ = nullptr, b_ = nullptr;
};

// Channel 0 between the two ranks, driven by spinning on the nonblocking calls.
class ChannelLink {
 public:
  explicit ChannelLink(braid::test::TransportPair& pair) : ch_{&pair.channel(0), &pair.channel(1)} {}
  bool send(int side, const std::byte* p, std::size_t n, const std::atomic<bool>* stop) {
    Backoff b;
    while (n > 0) {
      auto k = ch_[side]->trySend(p, n);
      if (!k.ok()) return false;
      if (*k > 0) {
        p += *k;
        n -= *k;
        b.reset();
      } else {
        if (stop && stop->load(std::memory_order_relaxed)) return false;
        b.idle();
      }
    }
    return true;
  }
  bool recv(int side, std::byte* p, std::size_t n, const std::atomic<bool>* stop) {
    Backoff b;
    while (n > 0) {
      auto k = ch_[side]->tryRecv(p, n);
      if (!k.ok()) return false;
      if (*k > 0) {
        p += *k;
        n -= *k;
        b.reset();
      } else {
        if (stop && stop->load(std::memory_order_relaxed)) return false;
        b.idle();
      }
    }
    return true;
  }

 private:
  braid::Channel* ch_[2];
};

// Runs `body` on a partner thread; the destructor tells it to stop (any wait it is in returns
// false) and joins it. finished() is set once the body has returned, stopped or failed: the
// benchmark thread passes it as its own stop flag, so it cannot wait forever on a dead partner.
class Partner {
 public:
  template <typename F>
  explicit Partner(F body)
      : thread_([this, body] {
          body(&stop_);
          finished_.store(true, std::memory_order_release);
        }) {}
  Partner(const Partner&) = delete;
  Partner& operator=(const Partner&) = delete;
  ~Partner() {
    stop_.store(true, std::memory_order_relaxed);
    thread_.join();
  }
  const std::atomic<bool>* finished() const { return &finished_; }

 private:
  std::atomic<bool> stop_{false}, finished_{false};
  std::thread thread_;
};

// Runs `iteration` under the benchmark's loop when there is a State, else `fallbackIters` times;
// returns seconds per iteration, or a negative number if an iteration failed.
template <typename F>
double timeLoop(benchmark::State* state, int fallbackIters, F iteration) {
  bool ok = true;
  std::uint64_t n = 0;
  auto t0 = Clock::now();
  if (state) {
    for (auto _ : *state) {
      ok = ok && iteration();
      ++n;
    }
  } else {
    for (; n < static_cast<std::uint64_t>(fallbackIters) && ok; ++n) ok = iteration();
  }
  double per = secondsSince(t0) / static_cast<double>(std::max<std::uint64_t>(n, 1));
  return ok ? per : -1;
}

// ---- (a) ping-pong latency: side 0 sends, side 1 echoes; one iteration is one round trip.

template <typename Link>
double pingPong(Link& link, benchmark::State* state, int fallbackIters, std::size_t bytes) {
  std::vector<std::byte> mine = touched(bytes, 1), echo = touched(bytes, 2);
  Partner partner([&](const std::atomic<bool>* stop) {
    while (link.recv(1, echo.data(), bytes, stop) && link.send(1, echo.data(), bytes, stop)) {
    }
  });
  return timeLoop(state, fallbackIters, [&] {
    return link.send(0, mine.data(), bytes, partner.finished()) && link.recv(0, mine.data(), bytes, partner.finished());
  });
}

// Raw round trip for `bytes`, measured now: used when the raw row did not run. The best of three
// tries, since the first one also pays for starting the partner thread and warming the caches.
double rawRoundTrip(bool tcp, std::size_t bytes) {
  double best = -1;
  for (int attempt = 0; attempt < 3; ++attempt) {
    double t = -1;
    if (tcp) {
      SocketLink link;
      std::string err;
      if (link.open(&err)) t = pingPong(link, nullptr, 2000, bytes);
    } else {
      MailboxLink link(bytes);
      t = pingPong(link, nullptr, 20000, bytes);
    }
    if (t > 0 && (best < 0 || t < best)) best = t;
  }
  return best;
}

void reportLatency(benchmark::State& state, double secPerIter, double rawSecPerIter) {
  state.counters["one_way_us"] = secPerIter / 2 * 1e6;
  if (rawSecPerIter > 0) {
    state.counters["raw_rtt_us"] = rawSecPerIter * 1e6;
    state.counters["x_raw"] = secPerIter / rawSecPerIter;  // how many raw round trips one costs
  }
}

void rawPingPongBench(benchmark::State& state, bool tcp) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  double per = -1;
  std::string err = "loopback socket failed";
  if (tcp) {
    SocketLink link;
    if (link.open(&err)) per = pingPong(link, &state, 0, bytes);
  } else {
    MailboxLink link(bytes);
    per = pingPong(link, &state, 0, bytes);
  }
  if (per < 0) {
    state.SkipWithError(err.c_str());
    return;
  }
  storeRaw(tcp ? "rtt_tcp" : "rtt_shm", bytes, per);
  reportLatency(state, per, 0);
}

// One Braid channel benchmark: `measure` times the channel, `report` sets the counters beside the raw
// limit stored under `rawKey` by the raw benchmark (or measured now with `rawNow` if it did not run).
// `transport`: the registry's name ("" for shm or tcp by `tcp`); a transport without a raw row
// here (ib: its limit is perftest's, bench/ib_compare) passes a null rawKey.
template <typename Measure, typename RawNow, typename Report>
void channelBench(benchmark::State& state, bool tcp, const char* rawKey, Measure measure, RawNow rawNow, Report report,
                  const char* transport = nullptr) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  // The transport's own connections (no communicator), under the environment's BRAID_* settings.
  auto config = braid::Config::fromEnvironment();
  if (!config.ok()) {
    state.SkipWithError(config.status().toString().c_str());
    return;
  }
  config->timeoutSec = 60;
  auto pair = braid::test::TransportPair::make(transport ? transport : tcp ? "tcp" : "shm", *config);
  if (!pair.ok()) {
    state.SkipWithError(pair.status().toString().c_str());
    return;
  }
  ChannelLink link(**pair);
  double per = measure(link, &state, 0, bytes);
  if (per < 0) {
    state.SkipWithError("channel failed");
    return;
  }
  double raw = rawKey ? lookupRaw(rawKey, bytes) : 0;
  report(state, bytes, per, raw > 0 || !rawKey ? raw : rawNow(tcp, bytes));
}

void pingPongBench(benchmark::State& state, bool tcp) {
  channelBench(state, tcp, tcp ? "rtt_tcp" : "rtt_shm", pingPong<ChannelLink>, rawRoundTrip,
               [](benchmark::State& s, std::size_t, double per, double raw) { reportLatency(s, per, raw); });
}

// ---- (b) one-way streaming bandwidth

// One iteration sends a batch of messages from side 0 and waits until side 1 has received all
// of them: the receiver publishes each whole message through `received`.
template <typename Link>
double stream(Link& link, benchmark::State* state, int fallbackIters, std::size_t bytes) {
  std::vector<std::byte> src = touched(bytes, 1), dst = touched(bytes, 2);
  std::atomic<std::uint64_t> received{0};
  Partner partner([&](const std::atomic<bool>* stop) {
    while (link.recv(1, dst.data(), bytes, stop)) received.fetch_add(1, std::memory_order_release);
  });
  const std::size_t perBatch = messagesPerBatch(bytes);
  std::uint64_t sent = 0;
  return timeLoop(state, fallbackIters, [&] {
    for (std::size_t m = 0; m < perBatch; ++m, ++sent)
      if (!link.send(0, src.data(), bytes, partner.finished())) return false;
    Backoff b;
    while (received.load(std::memory_order_acquire) < sent) {
      if (partner.finished()->load(std::memory_order_acquire)) return false;
      b.idle();
    }
    return true;
  });
}

// One memcpy per message, from the same source into the same destination, like the transport
// rows (whose sender and receiver buffers also stay the same): the caches see the same reuse.
double memcpyStream(benchmark::State* state, int fallbackIters, std::size_t bytes) {
  std::vector<std::byte> src = touched(bytes, 1), dst = touched(bytes, 2);
  const std::size_t perBatch = messagesPerBatch(bytes);
  return timeLoop(state, fallbackIters, [&] {
    for (std::size_t m = 0; m < perBatch; ++m) {
      std::memcpy(dst.data(), src.data(), bytes);
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
    return true;
  });
}

double rawStream(bool tcp, std::size_t bytes) {
  if (tcp) {
    SocketLink link;
    std::string err;
    return link.open(&err) ? stream(link, nullptr, 5, bytes) : -1;
  }
  return memcpyStream(nullptr, 5, bytes);
}

void reportStream(benchmark::State& state, std::size_t bytes, double secPerIter, double rawSecPerIter) {
  const double perIter = static_cast<double>(bytes * messagesPerBatch(bytes));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(perIter));
  state.counters["GBps"] = perIter / secPerIter / 1e9;  // 1e9 B/s, as braid perf and nccl-tests
  if (rawSecPerIter > 0) {
    state.counters["raw_GBps"] = perIter / rawSecPerIter / 1e9;
    state.counters["of_raw"] = rawSecPerIter / secPerIter;  // fraction of the raw bandwidth
  }
}

void rawStreamBench(benchmark::State& state, bool tcp) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  double per = -1;
  std::string err = "loopback socket failed";
  if (tcp) {
    SocketLink link;
    if (link.open(&err)) per = stream(link, &state, 0, bytes);
  } else {
    per = memcpyStream(&state, 0, bytes);
  }
  if (per < 0) {
    state.SkipWithError(err.c_str());
    return;
  }
  storeRaw(tcp ? "stream_tcp" : "stream_shm", bytes, per);
  reportStream(state, bytes, per, 0);
}

void streamBench(benchmark::State& state, bool tcp) {
  channelBench(state, tcp, tcp ? "stream_tcp" : "stream_shm", stream<ChannelLink>, rawStream, reportStream);
}

// ib's rows: over whatever BRAID_IBVERBS_LIB loads (on these machines the verbs emulation, whose
// limit perftest measures: bench/ib_compare puts the two side by side).
void pingPongIbBench(benchmark::State& state) {
  channelBench(state, false, nullptr, pingPong<ChannelLink>, rawRoundTrip,
               [](benchmark::State& s, std::size_t, double per, double raw) { reportLatency(s, per, raw); }, "ib");
}
void streamIbBench(benchmark::State& state) {
  channelBench(state, false, nullptr, stream<ChannelLink>, rawStream, reportStream, "ib");
}

// ---- (c) per-collective overhead of the engine

void allReduce1Rank(benchmark::State& state) {
  braidUniqueId id;
  braidComm_t comm = nullptr;
  if (braidGetUniqueId(&id) != braidSuccess || braidCommInitRank(&comm, 1, id, 0) != braidSuccess) {
    state.SkipWithError(braidGetLastError(comm));
    return;
  }
  float in[2] = {1, 2}, out[2] = {0, 0};
  bool ok = true;
  for (auto _ : state) {
    ok = ok && braidAllReduce(in, out, 2, braidFloat32, braidSum, comm, nullptr) == braidSuccess;
    benchmark::DoNotOptimize(out);
  }
  if (!ok) state.SkipWithError(braidGetLastError(comm));
  braidCommDestroy(comm);
}

// The partner rank must call exactly as many all-reduces as the benchmark loop will: a range-for
// over State runs max_iterations times, which is known before the loop starts.
void allReduce2Ranks(benchmark::State& state, bool tcp) {
  std::string err;
  auto pair = RankPair::create(tcp, &err);
  if (!pair) {
    state.SkipWithError(err.c_str());
    return;
  }
  constexpr int kWarmup = 100;
  const auto calls = static_cast<std::uint64_t>(state.max_iterations) + kWarmup;
  std::atomic<bool> partnerOk{true};
  std::thread partner([&] {
    float in[2] = {3, 4}, out[2];
    for (std::uint64_t i = 0; i < calls; ++i)
      if (braidAllReduce(in, out, 2, braidFloat32, braidSum, pair->comm(1), nullptr) != braidSuccess) {
        partnerOk = false;
        return;
      }
  });
  float in[2] = {1, 2}, out[2] = {0, 0};
  bool ok = true;
  for (int i = 0; i < kWarmup && ok; ++i)
    ok = braidAllReduce(in, out, 2, braidFloat32, braidSum, pair->comm(0), nullptr) == braidSuccess;
  for (auto _ : state) {
    ok = ok && braidAllReduce(in, out, 2, braidFloat32, braidSum, pair->comm(0), nullptr) == braidSuccess;
    benchmark::DoNotOptimize(out);
  }
  if (!ok) braidCommAbort(pair->comm(0));  // lets the partner's pending call return
  partner.join();
  if (!ok || !partnerOk) {
    state.SkipWithError("all-reduce failed");
    return;
  }
  if (out[0] != 4 || out[1] != 6) state.SkipWithError("wrong all-reduce result");
}

void latencySizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t bytes : {8LL, 64LL, 4LL << 10}) b->Arg(bytes);
  b->UseRealTime();
}

void streamSizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t bytes : {64LL << 10, 256LL << 10, 1LL << 20, 4LL << 20, 16LL << 20}) b->Arg(bytes);
  b->UseRealTime();
}

}  // namespace

// Raw rows first: each transport row after them reads the limit its raw row just measured.
BENCHMARK_CAPTURE(rawPingPongBench, shm_mailbox, false)->Name("pingpong/raw_shm_mailbox")->Apply(latencySizes);
BENCHMARK_CAPTURE(pingPongBench, shm, false)->Name("pingpong/shm")->Apply(latencySizes);
BENCHMARK_CAPTURE(rawPingPongBench, tcp_socket, true)->Name("pingpong/raw_tcp_socket")->Apply(latencySizes);
BENCHMARK_CAPTURE(pingPongBench, tcp, true)->Name("pingpong/tcp")->Apply(latencySizes);
BENCHMARK_CAPTURE(rawStreamBench, memcpy, false)->Name("stream/raw_memcpy")->Apply(streamSizes);
BENCHMARK_CAPTURE(streamBench, shm, false)->Name("stream/shm")->Apply(streamSizes);
BENCHMARK_CAPTURE(rawStreamBench, tcp_socket, true)->Name("stream/raw_tcp_socket")->Apply(streamSizes);
BENCHMARK_CAPTURE(streamBench, tcp, true)->Name("stream/tcp")->Apply(streamSizes);
BENCHMARK(pingPongIbBench)->Name("pingpong/ib")->Apply(latencySizes);
BENCHMARK(streamIbBench)->Name("stream/ib")->Apply(streamSizes);
BENCHMARK(allReduce1Rank)->Name("allreduce_8B/1rank")->UseRealTime();
BENCHMARK_CAPTURE(allReduce2Ranks, shm, false)->Name("allreduce_8B/2ranks_shm")->UseRealTime();
BENCHMARK_CAPTURE(allReduce2Ranks, tcp, true)->Name("allreduce_8B/2ranks_tcp")->UseRealTime();
