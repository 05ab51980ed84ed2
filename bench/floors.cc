// The machine's floors under Braid's all-reduce, measured in the same run as the comparison
// (bench/compare runs this program once per round, interleaved with the collectives):
//
//   floors mem --sizes S1,S2,...   For an all-reduce of S bytes, the memory work that the zero-copy
//                                  algorithm (comm/algorithms/direct.cc) must do on each of 2 ranks:
//                                  reduce c = a + b over S/2 bytes of fp32 (reads S, writes S/2),
//                                  then copy the peer's S/2 bytes of result (reads S/2, writes
//                                  S/2). Timed with 2 concurrent workers (threads, one per rank,
//                                  the copy reading the other worker's result), and with 1 worker
//                                  for reference.
//   floors tcp --sizes S1,S2,...   Loopback TCP with both directions busy, as a 2-rank all-reduce
//                                  keeps them: two processes joined by K connections on 127.0.0.1
//                                  (--conns, default 1 and 2: Braid opens BRAID_NSOCKS = 2 per peer),
//                                  each sending S bytes while it receives S bytes, split evenly
//                                  over the connections (a sending and a receiving thread per
//                                  connection, blocking calls, TCP_NODELAY, kernel-default buffers),
//                                  with the system's congestion control (kind tcp-bidir) and with
//                                  each --cc name (default reno, what Braid uses between ranks of
//                                  one host: kind tcp-bidir-reno); a name that is the system's
//                                  default is measured once.
//   floors pingpong [--cpus A,B]   The cost of one cache line's round trip between two CPUs (default:
//                                  where `braid run` puts ranks 0 and 1, one CPU of each of the
//                                  first two cores this process may use): two processes, each pinned to one, pass a counter
//                                  back and forth in shared memory, in batches of 2000 round trips.
//                                  No exchange between ranks on one host can answer faster, so it
//                                  is the floor under the shm latency; bench/compare also uses it
//                                  to see where the host has placed this machine's CPUs (a virtual
//                                  machine's two vCPUs may sit on neighbouring hardware threads or
//                                  far apart, and every program's cross-core traffic follows).
//
// Every kind runs -r repetitions per size after one untimed repetition; the row gives the fastest
// repetition (a floor is what the machine can do) and the median.
// Output (stdout): '#' comment lines, then CSV with the header
//   kind,workers,size,bytes,best_s,median_s,best_GBps,median_GBps,reps
// where `size` is the all-reduce size the row stands for, `bytes` the bytes each worker moved
// (mem: S/2 of output per worker and kernel; tcp: S each way; `workers` is then the number of
// connections); kind reduce+copy is the sum of the
// two phases' times in each repetition (GBps there: S/2 over that sum), GBps = bytes / seconds / 1e9 per worker (mem)
// or per direction (tcp). bench/compare turns these rows into busbw floors (docs/PERFORMANCE.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "bench/peers/sizes.h"
#include "topology/topology.h"
#include "base/socket.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

void row(const char* kind, int workers, std::size_t size, std::size_t bytes, const std::vector<double>& times) {
  const double best = *std::min_element(times.begin(), times.end()), med = median(times);
  const double b = static_cast<double>(bytes);
  std::printf("%s,%d,%zu,%zu,%.9g,%.9g,%.4f,%.4f,%zu\n", kind, workers, size, bytes, best, med, b / best / 1e9,
              b / med / 1e9, times.size());
  std::fflush(stdout);
}

// Out of line so that the compiler keeps every pass.
__attribute__((noinline)) void reduceSum(float* __restrict c, const float* __restrict a, const float* __restrict b,
                                         std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

__attribute__((noinline)) void copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }

// The zero-copy all-reduce's memory work, `workers` threads at once, each as one rank of it: per
// repetition, reduce c = a + b over S/2 bytes (its half of its own and of the peer's input), a
// barrier, then copy S/2 bytes from the next worker's c (the peer's half of the result; its own c
// with 1 worker) into d. Buffers per worker: 4 x S/2, so the two workers touch 4 S in all, as two
// ranks do (two send and two receive buffers of S). Each phase's time is the slowest worker's, from
// a common start; the barrier between them is not timed.
void memFloor(int workers, std::size_t size, int reps) {
  const std::size_t half = size / 2 / sizeof(float) * sizeof(float), count = half / sizeof(float);
  const std::size_t nw = static_cast<std::size_t>(workers);
  struct Bufs {
    std::vector<float> a, b, c, d;
  };
  std::vector<Bufs> bufs(nw);
  const std::size_t slots = nw * static_cast<std::size_t>(reps + 1);
  std::vector<double> reduceTook(slots), copyTook(slots);
  std::barrier sync(workers);
  std::vector<std::thread> ts;
  for (std::size_t w = 0; w < nw; ++w)
    ts.emplace_back([&, w] {
      Bufs& m = bufs[w];
      // Filled by the worker itself: every page is touched (and placed) before the timing.
      m.a.assign(count, 1.0f + static_cast<float>(w));
      m.b.assign(count, 2.0f);
      m.c.assign(count, 0.0f);
      m.d.assign(count, 0.0f);
      const Bufs& peer = bufs[(w + 1) % nw];
      for (std::size_t r = 0; r <= static_cast<std::size_t>(reps); ++r) {
        sync.arrive_and_wait();
        double t0 = now();
        reduceSum(m.c.data(), m.a.data(), m.b.data(), count);
        reduceTook[r * nw + w] = now() - t0;
        sync.arrive_and_wait();
        t0 = now();
        copy(m.d.data(), peer.c.data(), half);
        copyTook[r * nw + w] = now() - t0;
      }
    });
  for (std::thread& t : ts) t.join();
  std::vector<double> reduceTimes, copyTimes, both;
  for (std::size_t r = 1; r <= static_cast<std::size_t>(reps); ++r) {  // repetition 0 is the warm-up
    const auto phase = [&](const std::vector<double>& took) {
      return *std::max_element(took.begin() + static_cast<std::ptrdiff_t>(r * nw),
                               took.begin() + static_cast<std::ptrdiff_t>((r + 1) * nw));
    };
    reduceTimes.push_back(phase(reduceTook));
    copyTimes.push_back(phase(copyTook));
    both.push_back(reduceTimes.back() + copyTimes.back());
  }
  for (std::size_t w = 0; w < nw; ++w)
    if (bufs[w].d[count / 2] != bufs[(w + 1) % nw].a[0] + 2.0f) {
      std::fprintf(stderr, "floors: the memory work gave a wrong value\n");
      std::exit(1);
    }
  row("reduce", workers, size, half, reduceTimes);
  row("copy", workers, size, half, copyTimes);
  row("reduce+copy", workers, size, half, both);
}

// fork() after flushing stdout (so the child does not print the parent's buffered lines again);
// -1, with the reason on stderr, if it failed.
pid_t forkChild() {
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) std::perror("floors: fork");
  return child;
}

bool writeAll(int fd, const char* p, std::size_t n) {
  while (n) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool readAll(int fd, char* p, std::size_t n) {
  while (n) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

// One side of the exchange over k connections: per repetition, a one-byte handshake both ways on
// the first (the streams are ordered, so it also marks the end of the previous repetition), then
// S bytes each way at once, S/k per connection, one sending and one receiving thread per
// connection (the main thread receives on the first).
bool tcpSide(const std::vector<int>& fds, const std::vector<std::size_t>& sizes, int reps, const std::string& cc,
             bool report) {
  const int one = 1;
  for (int fd : fds) {
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (cc.empty()) continue;
    if (braid::Status s = braid::net::setCongestion(fd, cc); !s.ok()) {
      std::fprintf(stderr, "floors: %s\n", s.message().c_str());
      return false;
    }
  }
  const std::size_t k = fds.size();
  const std::size_t maxBytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<char> out(maxBytes, 'x'), in(maxBytes, 0);
  for (std::size_t size : sizes) {
    std::vector<double> times;
    auto share = [&](std::size_t j) { return std::pair{size * j / k, size * (j + 1) / k - size * j / k}; };
    for (int r = 0; r <= reps; ++r) {
      char h = 'h';
      if (!writeAll(fds[0], &h, 1) || !readAll(fds[0], &h, 1)) return false;
      const double t0 = now();
      std::vector<char> ok(2 * k, 0);
      std::vector<std::thread> ts;
      for (std::size_t j = 0; j < k; ++j) {
        ts.emplace_back([&, j] {
          auto [off, len] = share(j);
          ok[j] = writeAll(fds[j], out.data() + off, len);
        });
        if (j > 0)
          ts.emplace_back([&, j] {
            auto [off, len] = share(j);
            ok[k + j] = readAll(fds[j], in.data() + off, len);
          });
      }
      auto [off0, len0] = share(0);
      ok[k] = readAll(fds[0], in.data() + off0, len0);
      for (std::thread& t : ts) t.join();
      if (std::count(ok.begin(), ok.end(), 0)) return false;
      if (r > 0) times.push_back(now() - t0);
    }
    if (in[0] != 'x' || in[size - 1] != 'x') return false;
    if (report) row(cc.empty() ? "tcp-bidir" : ("tcp-bidir-" + cc).c_str(), static_cast<int>(k), size, size, times);
  }
  return true;
}

// Two processes joined by k loopback connections; the child names each connection's index first,
// so both sides agree on which share goes where. `cc`: the congestion control ("": the system's).
int tcpFloor(const std::vector<std::size_t>& sizes, int reps, int k, const std::string& cc) {
  int lis = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (lis < 0 || ::bind(lis, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(lis, k) != 0 ||
      ::getsockname(lis, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("floors: listen");
    return 1;
  }
  const pid_t child = forkChild();
  if (child < 0) return 1;
  if (child == 0) {
    ::close(lis);
    std::vector<int> fds;
    for (int j = 0; j < k; ++j) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      const char index = static_cast<char>(j);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || !writeAll(fd, &index, 1))
        _exit(1);
      fds.push_back(fd);
    }
    _exit(tcpSide(fds, sizes, reps, cc, false) ? 0 : 1);
  }
  std::vector<int> fds(static_cast<std::size_t>(k), -1);
  bool ok = true;
  for (int j = 0; j < k && ok; ++j) {
    int fd = ::accept(lis, nullptr, nullptr);
    char index = 0;
    ok = fd >= 0 && readAll(fd, &index, 1) && index >= 0 && index < k && fds[static_cast<std::size_t>(index)] < 0;
    if (ok) fds[static_cast<std::size_t>(index)] = fd;
  }
  ::close(lis);
  ok = ok && tcpSide(fds, sizes, reps, cc, true);
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "floors: the tcp exchange failed\n");
    return 1;
  }
  return 0;
}

// Two processes pinned to cpus[0] and cpus[1] pass a counter back and forth: the parent writes
// odd values, the child answers with the next even one. Row: seconds per round trip.
int pingPong(int reps, const std::vector<int>& cpus) {
  constexpr int kBatch = 2000;
  void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("floors: mmap");
    return 1;
  }
  auto* flag = new (mem) std::atomic<std::uint32_t>(0);
  const auto pin = [](int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return ::sched_setaffinity(0, sizeof(set), &set) == 0;
  };
  // Waits for `want`; yields now and then so that two processes on one CPU (a failed pin) still
  // finish, and gives up after 10 s (the other process died or never runs).
  const auto await = [&](std::uint32_t want) {
    double since = 0;
    for (unsigned spins = 1; flag->load(std::memory_order_acquire) != want; ++spins) {
      if (spins % 4096 != 0) continue;
      ::sched_yield();
      const double t = now();
      if (since == 0) since = t;
      if (t - since > 10) return false;
    }
    return true;
  };
  const std::uint32_t rounds = static_cast<std::uint32_t>(reps + 1) * kBatch;
  const pid_t child = forkChild();
  if (child < 0) return 1;
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent
    pin(cpus[1]);
    for (std::uint32_t i = 0; i < rounds; ++i) {
      if (!await(2 * i + 1)) _exit(1);
      flag->store(2 * i + 2, std::memory_order_release);
    }
    _exit(0);
  }
  const bool pinned = pin(cpus[0]);
  std::vector<double> times;
  double t0 = 0;
  for (std::uint32_t i = 0; i < rounds; ++i) {
    if (i % kBatch == 0) t0 = now();
    flag->store(2 * i + 1, std::memory_order_release);
    if (!await(2 * i + 2)) {
      std::fprintf(stderr, "floors: the process on CPU %d stopped answering\n", cpus[1]);
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
      return 1;
    }
    if (i % kBatch == kBatch - 1 && i >= kBatch) times.push_back((now() - t0) / kBatch);  // batch 0: warm-up
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ::munmap(mem, 4096);
  std::printf("# cpus %d and %d%s\n", cpus[0], cpus[1], pinned ? "" : " (pinning failed: the figure is not a floor)");
  row("pingpong", 2, 64, 64, times);
  return 0;
}

// Where `braid run` puts ranks 0 and 1: the first CPU of each of the first two cores this process
// may use (both on the one core when there is only one); empty with a single CPU.
std::vector<int> rankZeroAndOneCpus() {
  const std::vector<std::vector<int>> cores = braid::topology::allowedCores();
  if (cores.size() >= 2) return {cores[0][0], cores[1][0]};
  if (cores.size() == 1 && cores[0].size() >= 2) return {cores[0][0], cores[0][1]};
  return {};
}

const char* kUsage =
    "usage: floors mem|tcp [--sizes S1,S2,...] [-r REPS] [--conns K1,K2,...] [--cc NAME,...]\n"
    "       floors pingpong [-r REPS] [--cpus A,B]\n"
    "  sizes take K, M, G (default 16M,256M); --conns: tcp connections per run (default 1,2);\n"
    "  --cc: congestion controls to measure besides the system's (default reno; none: only the system's);\n"
    "  pingpong: REPS batches of 2000 cache-line round trips between CPUs A and B (default: where braid run\n"
    "  puts ranks 0 and 1)\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string mode = argv[1];
  std::vector<std::size_t> sizes;
  int reps = 5;
  std::vector<int> conns = {1, 2};
  std::vector<std::string> ccs = {"reno"};
  std::vector<int> cpus;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    const char* v = argv[++i];
    if (a == "--sizes") {
      if (!peers::parseSizeList(v, &sizes)) {
        std::fputs(kUsage, stderr);
        return 2;
      }
    } else if (a == "-r") {
      reps = std::atoi(v);
    } else if (a == "--cpus") {
      int x = -1, y = -1;
      char tail = 0;
      if (std::sscanf(v, "%d,%d%c", &x, &y, &tail) != 2 || x < 0 || y < 0 || x == y || x >= CPU_SETSIZE ||
          y >= CPU_SETSIZE) {
        std::fputs(kUsage, stderr);
        return 2;
      }
      cpus = {x, y};
    } else if (a == "--cc") {
      ccs.clear();
      for (std::string list = v; !list.empty() && list != "none";) {
        const std::size_t comma = list.find(',');
        ccs.push_back(list.substr(0, comma));
        list = comma == std::string::npos ? "" : list.substr(comma + 1);
      }
    } else if (a == "--conns") {
      conns.clear();
      for (const char* p = v; *p;) {
        char* end = nullptr;
        const long c = std::strtol(p, &end, 10);
        if (end == p || c < 1 || c > 64) {
          std::fputs(kUsage, stderr);
          return 2;
        }
        conns.push_back(static_cast<int>(c));
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
          std::fputs(kUsage, stderr);
          return 2;
        }
      }
    } else {
      std::fputs(kUsage, stderr);
      return 2;
    }
  }
  if (sizes.empty()) sizes = {16u << 20, 256u << 20};
  if ((mode != "mem" && mode != "tcp" && mode != "pingpong") || reps < 1) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (mode == "pingpong") {
    if (cpus.empty()) cpus = rankZeroAndOneCpus();
    if (cpus.size() < 2) {
      std::fputs("floors: pingpong needs two CPUs and this process may use only one (skipped)\n", stderr);
      return 77;  // what meson counts as a skipped test
    }
    std::printf("# floors pingpong: %d batches of 2000 round trips after one untimed\n", reps);
    std::printf("kind,workers,size,bytes,best_s,median_s,best_GBps,median_GBps,reps\n");
    return pingPong(reps, cpus);
  }
  std::printf("# floors %s: %d repetitions per size after one untimed\n", mode.c_str(), reps);
  std::printf("kind,workers,size,bytes,best_s,median_s,best_GBps,median_GBps,reps\n");
  if (mode == "tcp") {
    const std::string system = braid::net::systemCongestion();
    std::printf("# the system's congestion control: %s\n", system.empty() ? "unknown" : system.c_str());
    std::vector<std::string> runs = {""};
    for (const std::string& cc : ccs)
      if (cc != system && std::find(runs.begin(), runs.end(), cc) == runs.end()) runs.push_back(cc);
    for (const std::string& cc : runs)
      for (int k : conns)
        if (int rc = tcpFloor(sizes, reps, k, cc); rc != 0) return rc;
    return 0;
  }
  for (std::size_t size : sizes)
    for (int workers : {1, 2}) memFloor(workers, size, reps);
  return 0;
}
