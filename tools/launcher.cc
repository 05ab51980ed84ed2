// `braid run`. The launcher's one real job is making sure no rank is left behind: a collective
// job whose rank died leaves its peers blocked forever, so the first failure stops everyone
// (SIGTERM, then SIGKILL after a grace period) and the launcher's own death takes the ranks along
// (PR_SET_PDEATHSIG). Each rank starts a session (and so a process group) of its own, and the
// signals go to the whole group, so whatever a rank started (data-loader workers, a shell's
// children) stops with it, as torchrun stops its workers' groups. The launcher is the subreaper
// of everything its ranks start, so orphans are reaped here and a group's end can be seen.
// Everything is driven from one poll() loop over a signalfd and the output pipes, so signals never
// run code in a handler and nothing sleeps (except once, before the ranks start, to see which
// cores are idle). Its second job is pinning ranks to cores.
#include "tools/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "base/fdlimit.h"
#include "base/socket.h"
#include "topology/topology.h"

namespace braid::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage =
    "usage: braid run -n N [--master-addr A] [--master-port P] [--nnodes K --node-rank R]\n"
    "                 [--bind-to core|none] [--tag-output] [--] PROGRAM [ARGS...]\n"
    "Starts N ranks of PROGRAM on this host with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
    "GROUP_RANK, MASTER_ADDR, MASTER_PORT and BRAID_LAUNCHER=1 set, as torchrun does.\n"
    "  -n, --nproc-per-node N  ranks on this host (1..4096)\n"
    "  --nnodes K              hosts in the job (default 1)\n"
    "  --node-rank R           this host's index, 0 <= R < K (required when K > 1)\n"
    "  --master-addr A         host of global rank 0 (default 127.0.0.1; required when K > 1)\n"
    "  --master-port P         port on that host (default: a free local port; required when K > 1)\n"
    "  --bind-to core|none     core (default): pin local rank i to the i-th core this launcher may\n"
    "                          use, round-robin when ranks outnumber cores; none: leave ranks free\n"
    "  --tag-output            prefix every output line with \"[RANK] \"\n"
    "  -h, --help              show this help\n"
    "Each rank runs in a session and process group of its own. When a rank fails, every rank's\n"
    "group (the rank and whatever it started) gets SIGTERM and, 3 s later, SIGKILL; the exit status\n"
    "is the failed rank's (128+signal if it was killed). SIGINT and SIGTERM sent to the launcher are\n"
    "forwarded to every group, with the same 3 s before SIGKILL; the exit status is then 128+signal.\n"
    "Processes a rank leaves running in its group when it exits are stopped the same way.\n";

// Far beyond one host's accelerators; the cap keeps a typo from forking a machine to death.
constexpr int kMaxLocalRanks = 4096;
// Ranks get this long to act on SIGTERM; with the SIGKILL after it, all are gone well within 5 s.
constexpr auto kStopGrace = std::chrono::seconds(3);
// A rank that survives SIGKILL this long is stuck in the kernel; waiting longer would only hang us.
constexpr auto kReapAfterKill = std::chrono::seconds(2);
// The signalfd only sees SIGCHLD if no other thread of the host process takes it first, so reap on
// a slow timer as well rather than trusting it blindly.
constexpr int kSafetyPollMs = 1000;
// How often the launcher looks whether the processes a rank left in its group have ended.
constexpr int kGroupPollMs = 20;
// A "line" this long without a newline is split so one rank cannot grow the launcher without bound.
constexpr std::size_t kMaxLineBytes = 64 * 1024;
// Reads per stream per loop turn, so one chatty rank cannot starve the others or signal handling.
constexpr int kReadsPerTurn = 16;

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd other) noexcept { std::swap(fd_, other.fd_); return *this; }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() { if (fd_ >= 0) ::close(std::exchange(fd_, -1)); }

 private:
  int fd_ = -1;
};

// Tagged output is interleaved line by line with the launcher's own messages, so both go through
// raw write() on the same fds rather than through stdio buffers.
void writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else {
      return;  // Nobody reads our output any more; losing it beats wedging the shutdown.
    }
  }
}

// One line to stderr from a forked child, formatted on the stack.
template <typename... Args>
void childPrint(const char* format, Args... args) {
  char message[1024];
  const int len = std::snprintf(message, sizeof message, format, args...);
  if (len > 0) {
    [[maybe_unused]] const ssize_t n =
        ::write(STDERR_FILENO, message, std::min<std::size_t>(static_cast<std::size_t>(len), sizeof message - 1));
  }
}

// How long the launcher watches the CPUs before choosing idle ones: /proc/stat counts in 10 ms
// ticks, so 100 ms tells a busy core (10 ticks) from an idle one.
constexpr auto kBusySample = std::chrono::milliseconds(100);

// Per CPU, the share of `sample` it spent running anything (user, system, interrupts; not idle,
// I/O wait or time the hypervisor stole), from /proc/stat. Empty if /proc/stat cannot be read.
std::map<int, double> busyFractions(std::chrono::milliseconds sample) {
  auto read = [] {
    std::map<int, std::pair<unsigned long long, unsigned long long>> out;  // cpu -> (busy, total)
    std::ifstream stat("/proc/stat");
    for (std::string line; std::getline(stat, line);) {
      if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || !std::isdigit(static_cast<unsigned char>(line[3])))
        continue;
      std::istringstream fields(line.substr(3));
      int cpu = -1;
      unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
      fields >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
      const unsigned long long busy = user + nice + system + irq + softirq;
      out[cpu] = {busy, busy + idle + iowait + steal};
    }
    return out;
  };
  const auto before = read();
  std::this_thread::sleep_for(sample);
  std::map<int, double> out;
  for (const auto& [cpu, now] : read()) {
    auto it = before.find(cpu);
    if (it == before.end() || now.second <= it->second.second) continue;
    out[cpu] = static_cast<double>(now.first - it->second.first) / static_cast<double>(now.second - it->second.second);
  }
  return out;
}

void printError(const std::string& message) { writeAll(STDERR_FILENO, "braid run: " + message + "\n"); }

std::string signalText(int sig) {
  const char* name = ::strsignal(sig);
  return std::to_string(sig) + " (" + (name != nullptr ? name : "unknown signal") + ")";
}

struct Options {
  int nproc = 0;
  int nnodes = 1;
  int nodeRank = -1;
  std::string masterAddr;
  int masterPort = 0;
  bool tagOutput = false;
  std::string bindTo = "core";  // or "none"
  bool help = false;
  std::vector<std::string> program;
  std::string secret;  // BRAID_SECRET for the ranks (one host: made up here, unless already set)
};

std::optional<int> parseNumber(std::string_view text, long long lo, long long hi) {
  long long value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < lo || value > hi) return std::nullopt;
  return static_cast<int>(value);
}

// Returns why the command line is unusable, or "" when `opts` is ready to run.
std::string parseOptions(int argc, char** argv, Options& opts) {
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // The first word that is no option is PROGRAM.

    std::string name;
    std::optional<std::string> attached;  // --opt=value, -nVALUE, -n=VALUE
    if (arg.starts_with("--")) {
      const std::size_t eq = arg.find('=');
      name = arg.substr(0, eq);
      if (eq != std::string_view::npos) attached = std::string(arg.substr(eq + 1));
      // torchrun spells its options with underscores; accept those as they are typed.
      std::replace(name.begin() + 2, name.end(), '_', '-');
    } else {
      name = arg.substr(0, 2);
      if (arg.size() > 2) attached = std::string(arg.substr(arg[2] == '=' ? 3 : 2));
    }

    if (name == "-h" || name == "--help" || name == "--tag-output") {
      if (attached) return name + " takes no value";
      (name == "--tag-output" ? opts.tagOutput : opts.help) = true;
      if (opts.help) return "";
      continue;
    }
    const bool takesValue = name == "-n" || name == "--nproc-per-node" || name == "--nnodes" ||
                            name == "--node-rank" || name == "--master-addr" || name == "--master-port" ||
                            name == "--bind-to";
    if (!takesValue) return "unknown option '" + std::string(arg) + "'";
    std::string value;
    if (attached) {
      value = *attached;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return "missing value for " + name;
    }

    if (name == "--bind-to") {
      if (value != "core" && value != "none") return "--bind-to takes core or none, not '" + value + "'";
      opts.bindTo = value;
      continue;
    }
    if (name == "--master-addr") {
      if (value.empty()) return "--master-addr must not be empty";
      opts.masterAddr = value;
      continue;
    }
    const bool isN = name == "-n" || name == "--nproc-per-node";
    const auto [target, lo, hi] = isN                     ? std::tuple{&opts.nproc, 1, kMaxLocalRanks}
                                  : name == "--nnodes"      ? std::tuple{&opts.nnodes, 1, INT_MAX}
                                  : name == "--node-rank"   ? std::tuple{&opts.nodeRank, 0, INT_MAX}
                                                            : std::tuple{&opts.masterPort, 1, 65535};
    const auto number = parseNumber(value, lo, hi);
    if (!number) {
      return "invalid " + name + " '" + value + "': need " + std::to_string(lo) +
             (hi == INT_MAX ? " or more" : ".." + std::to_string(hi));
    }
    *target = *number;
  }
  for (; i < argc; ++i) opts.program.emplace_back(argv[i]);

  if (opts.nproc == 0) return "missing -n N (ranks per node)";
  if (opts.program.empty()) return "missing PROGRAM";
  if (opts.nodeRank < 0) {
    if (opts.nnodes > 1) return "--node-rank is required when --nnodes > 1";
    opts.nodeRank = 0;
  }
  if (opts.nodeRank >= opts.nnodes) {
    return "--node-rank " + std::to_string(opts.nodeRank) + " is out of range for --nnodes " +
           std::to_string(opts.nnodes) + " (need 0 <= R < K)";
  }
  if (static_cast<long long>(opts.nproc) * opts.nnodes > INT_MAX) return "world size N*K is too large";
  if (opts.nnodes > 1 && opts.masterAddr.empty()) return "--master-addr is required when --nnodes > 1";
  if (opts.nnodes > 1 && opts.masterPort == 0) return "--master-port is required when --nnodes > 1";
  return "";
}

// Another process may take the port before rank 0 binds it; that window is the price of not
// asking the user for a port on a single host, and the same one torchrun accepts.
// A free port on the loopback interface (0: any), or none with *error set.
std::optional<int> freePort(int port, std::string& error) {
  UniqueFd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t len = sizeof addr;
  if (!sock.valid() || ::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    error = std::strerror(errno);
    return std::nullopt;
  }
  return ntohs(addr.sin_port);
}

// MASTER_PORT: a free port whose next one is free too (the launcher's rendezvous store, beside the
// port the program may use itself, as torch's env:// store does).
std::optional<int> pickFreePort(std::string& error) {
  for (int tries = 0; tries < 32; ++tries) {
    const auto port = freePort(0, error);
    if (!port) return std::nullopt;
    if (*port < 65535 && freePort(*port + 1, error)) return port;
  }
  error = "no two free ports in a row after 32 tries";
  return std::nullopt;
}

struct Stream {
  UniqueFd fd;          // Read end of the rank's pipe; reset at EOF.
  int sink = -1;        // The launcher's own stdout or stderr.
  std::string pending;  // Bytes after the last newline.
};

struct Rank {
  int rank = 0;  // Global rank: the tag and the name in messages.
  pid_t pid = -1;  // also its process group's id: the rank starts a session of its own
  bool alive = false;  // not reaped yet
  bool group = false;  // its process group may still have members (the rank or its descendants)
  Stream out;
  Stream err;
};

// Whether output written to `fd` could keep a reader waiting after the launcher exits: a pipe or a
// socket stays open while any descendant of a rank holds it; a terminal or a file never blocks.
bool holdsReaders(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
}

class Launcher {
 public:
  Launcher(Options opts, StoreHost* store) : opts_(std::move(opts)), store_(store) {}

  int run() {
    std::fflush(nullptr);  // Output the host process buffered must come before the ranks'.
    chooseBindings();
    // Through pipes of the launcher's own when tagging, or when the launcher's output is a pipe:
    // then a rank's descendant that outlives it holds the launcher's pipe, not the reader's, and
    // the reader sees EOF when the launcher exits. A terminal or a file is inherited as it is
    // (a rank keeps its isatty() and its line buffering there).
    relay_[0] = opts_.tagOutput || holdsReaders(STDOUT_FILENO);
    relay_[1] = opts_.tagOutput || holdsReaders(STDERR_FILENO);
    // Orphans of the ranks' descendants come to the launcher (and are reaped by it), so a group's
    // last member is seen to end even where init does not reap.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (!setUpSignals()) return 1;
    launcherPid_ = ::getpid();
    // Two pipes a rank: room for them under the soft limit (raised toward the hard one where
    // needed); each rank gets back the limit the launcher was started with.
    ::getrlimit(RLIMIT_NOFILE, &startLimit_);
    // Every host's ranks are told the same (launchers on every host decide alike), node 0's hosts it.
    launcherStore_ = store_ && store_->wanted();
    hostsStore_ = launcherStore_ && opts_.nodeRank == 0;
    const long ranks = static_cast<long>(opts_.nproc) * opts_.nnodes;
    if (Status room = fdlimit::reserve(2L * opts_.nproc + (hostsStore_ ? ranks : 0), "braid run",
                                       "2 pipes for each of " + std::to_string(opts_.nproc) + " ranks" +
                                           (hostsStore_ ? ", " + std::to_string(ranks) + " for the rendezvous store's ranks" : ""));
        !room.ok()) {
      printError(room.message());
      restoreSignals();
      return 1;
    }
    for (std::string& word : opts_.program) childArgv_.push_back(word.data());
    childArgv_.push_back(nullptr);
    ranks_.resize(static_cast<std::size_t>(opts_.nproc));
    for (int local = 0; local < opts_.nproc; ++local) {
      if (!spawn(ranks_[static_cast<std::size_t>(local)], local)) {
        status_ = 1;
        beginStop();
        break;
      }
    }
    if (hostsStore_ && !stopping_ && !startStore()) {
      status_ = 1;
      beginStop();
    }
    loop();
    restoreSignals();  // (a Ctrl-C during the wait below ends the launcher)
    if (hostsStore_) {
      // The other hosts' ranks may still be in their last calls, or hearing of this host's
      // failure: serve them until they leave (as rank 0 did when it hosted the store).
      store_->waitUntilAllLeft(status_ != 0);
      store_->stop();
    }
    return status_;
  }

 private:
  // Left to the scheduler, ranks that spin while they wait sometimes share one core for a whole
  // run while another idles: on the 2-core CI machine type 128 of 1473 two-rank launches ran a
  // 128 KiB all-reduce at 20-97 us instead of 10-11, pinned 1 did (at 20 us). So each rank gets a
  // core, and when ranks outnumber the cores they are dealt out round-robin, which puts ring
  // neighbours on different cores: 4 ranks on 2 cores ran an 8-byte all-reduce in 3.1 instead of
  // 6.5 us, a 2 MiB one in 792 instead of 1428 (docs/architecture/transports.md, "Pinning, measured"). When the job leaves cores
  // over, it takes the idle ones first, so that a second job on the host does not pile onto the
  // cores of the first, as `mpirun`'s binding does.
  void chooseBindings() {
    if (opts_.bindTo == "none") return;
    std::vector<std::vector<int>> cores = topology::allowedCores();
    if (cores.empty()) return;
    if (static_cast<std::size_t>(opts_.nproc) < cores.size()) {
      const std::map<int, double> busy = busyFractions(kBusySample);
      std::stable_partition(cores.begin(), cores.end(), [&](const std::vector<int>& core) {
        return std::none_of(core.begin(), core.end(), [&](int cpu) {
          auto it = busy.find(cpu);
          return it != busy.end() && it->second > 0.5;
        });
      });
    }
    bindings_.resize(static_cast<std::size_t>(opts_.nproc));
    for (std::size_t i = 0; i < bindings_.size(); ++i) {
      CPU_ZERO(&bindings_[i]);
      for (int cpu : cores[i % cores.size()]) CPU_SET(cpu, &bindings_[i]);
    }
  }

  bool setUpSignals() {
    sigemptyset(&handled_);
    sigaddset(&handled_, SIGINT);
    sigaddset(&handled_, SIGTERM);
    sigaddset(&handled_, SIGCHLD);
    // With SIGCHLD ignored the kernel would reap ranks itself and we could not tell how they ended.
    struct sigaction deflt {};
    deflt.sa_handler = SIG_DFL;
    sigemptyset(&deflt.sa_mask);
    ::sigaction(SIGCHLD, &deflt, &oldChild_);
    ::pthread_sigmask(SIG_BLOCK, &handled_, &oldMask_);
    signalFd_ = UniqueFd(::signalfd(-1, &handled_, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!signalFd_.valid()) {
      printError(std::string("cannot create signalfd: ") + std::strerror(errno));
      restoreSignals();
      return false;
    }
    return true;
  }

  void restoreSignals() {
    signalFd_.reset();
    ::pthread_sigmask(SIG_SETMASK, &oldMask_, nullptr);
    ::sigaction(SIGCHLD, &oldChild_, nullptr);
  }

  bool spawn(Rank& r, int localRank) {
    r.rank = opts_.nodeRank * opts_.nproc + localRank;
    UniqueFd outWrite;
    UniqueFd errWrite;
    for (auto [stream, writeEnd, sink] : {std::tuple{&r.out, &outWrite, STDOUT_FILENO},
                                          std::tuple{&r.err, &errWrite, STDERR_FILENO}}) {
      if (relay_[sink - STDOUT_FILENO]) {
        int fds[2];
        // Only our end is non-blocking: a rank writing to a full pipe must wait, not get EAGAIN.
        if (::pipe2(fds, O_CLOEXEC) != 0) {
          printError("cannot start rank " + std::to_string(r.rank) + ": pipe: " + net::errnoText(errno));
          return false;
        }
        stream->fd = UniqueFd(fds[0]);
        *writeEnd = UniqueFd(fds[1]);
        ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
        stream->sink = sink;
      }
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      printError("cannot start rank " + std::to_string(r.rank) + ": fork: " + net::errnoText(errno));
      return false;
    }
    if (pid == 0) execChild(localRank, r.rank, outWrite.get(), errWrite.get());
    r.pid = pid;
    r.alive = true;
    r.group = true;
    // Our copies of the write ends close here, so EOF means the rank (and whatever it spawned) is done.
    return true;
  }

  // Runs in the forked child. The launcher is single-threaded while it forks, so the allocations
  // inside setenv are safe here.
  [[noreturn]] void execChild(int localRank, int globalRank, int outFd, int errFd) {
    // A SIGKILLed launcher cannot stop its ranks, so each rank arranges to die with it. If the
    // launcher died before prctl took effect, the parent already changed and the signal never comes.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcherPid_) ::_exit(1);
    // A session of its own: its process group is the rank and what it starts, signalled as one,
    // and the terminal's job control (Ctrl-C, SIGTTIN on reads) is the launcher's alone.
    ::setsid();
    ::sigaction(SIGCHLD, &oldChild_, nullptr);
    // Unblocking delivers a SIGTERM forwarded before exec, so a rank stopped early still stops.
    ::pthread_sigmask(SIG_SETMASK, &oldMask_, nullptr);
    // Moving both ends above 2 first keeps dup2 correct even if a pipe landed on fd 1 or 2.
    const int out = outFd >= 0 ? ::fcntl(outFd, F_DUPFD, 3) : -1;
    const int err = errFd >= 0 ? ::fcntl(errFd, F_DUPFD, 3) : -1;
    for (auto [fd, target] : {std::pair{out, STDOUT_FILENO}, std::pair{err, STDERR_FILENO}}) {
      if (fd < 0) {
        if ((target == STDOUT_FILENO ? outFd : errFd) >= 0) ::_exit(127);
        continue;
      }
      if (::dup2(fd, target) < 0) ::_exit(127);
      ::close(fd);
    }
    const std::pair<const char*, std::string> vars[] = {
        {"RANK", std::to_string(globalRank)},
        {"WORLD_SIZE", std::to_string(opts_.nproc * opts_.nnodes)},
        {"LOCAL_RANK", std::to_string(localRank)},
        {"LOCAL_WORLD_SIZE", std::to_string(opts_.nproc)},
        {"GROUP_RANK", std::to_string(opts_.nodeRank)},
        {"MASTER_ADDR", opts_.masterAddr},
        {"MASTER_PORT", std::to_string(opts_.masterPort)},
        {"BRAID_LAUNCHER", "1"},
        {"BRAID_STORE_HOST", launcherStore_ ? "launcher" : "rank0"},
    };
    for (const auto& [name, value] : vars) {
      if (::setenv(name, value.c_str(), 1) != 0) ::_exit(127);
    }
    ::setrlimit(RLIMIT_NOFILE, &startLimit_);
    if (!opts_.secret.empty() && ::setenv("BRAID_SECRET", opts_.secret.c_str(), 0) != 0) ::_exit(127);
    if (!bindings_.empty() &&
        ::sched_setaffinity(0, sizeof(cpu_set_t), &bindings_[static_cast<std::size_t>(localRank)]) != 0) {
      childPrint("braid run: rank %d runs unpinned: sched_setaffinity: %s\n", globalRank, std::strerror(errno));
    }
    ::execvp(childArgv_[0], childArgv_.data());
    childPrint("braid run: cannot execute %s: %s\n", childArgv_[0], std::strerror(errno));
    ::_exit(127);
  }

  // The store on the port after MASTER_PORT (the program's own, as torch's env:// store uses it).
  bool startStore() {
    const int port = opts_.masterPort + 1;
    const std::string why = port > 65535 ? std::string("MASTER_PORT is the last port") : store_->start(opts_.masterAddr, port, opts_.secret);
    if (why.empty()) return true;
    printError("cannot host the rendezvous store at " + opts_.masterAddr + ":" + std::to_string(port) +
               " (MASTER_PORT + 1): " + why + " (pick another --master-port, or set BRAID_STORE_HOST=rank0)");
    return false;
  }

  bool anyAlive() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.alive; });
  }

  // Whether a rank's process group still has members. While the rank is unreaped it does (a
  // zombie still owns its pid, so its group's id cannot go to a stranger); after that, until the
  // kernel says the group is empty. Its members' orphans are the launcher's to reap (subreaper).
  bool groupLive(Rank& r) {
    if (r.group && !r.alive && ::kill(-r.pid, 0) != 0 && errno == ESRCH) r.group = false;
    return r.group;
  }

  bool anyGroupLive() {
    bool any = false;
    for (Rank& r : ranks_) any = groupLive(r) || any;
    return any;
  }

  void signalLive(int sig) {
    for (Rank& r : ranks_) {
      // To the rank itself too: one that moved to another group (setsid of its own) still gets it.
      if (r.alive) ::kill(r.pid, sig);
      if (groupLive(r)) ::kill(-r.pid, sig);
    }
  }

  void beginStop() {
    stopping_ = true;
    killAt_ = Clock::now() + kStopGrace;
    signalLive(SIGTERM);
  }

  void onExit(const Rank& r, int waitStatus) {
    if (WIFEXITED(waitStatus) && WEXITSTATUS(waitStatus) == 0) return;
    // Once we are stopping, ranks end because we told them to: not failures, and not the cause.
    if (stopping_) return;
    if (WIFSIGNALED(waitStatus)) {
      const int sig = WTERMSIG(waitStatus);
      printError("rank " + std::to_string(r.rank) + " killed by signal " + signalText(sig));
      status_ = 128 + sig;
    } else {
      status_ = WEXITSTATUS(waitStatus);
      printError("rank " + std::to_string(r.rank) + " exited with status " + std::to_string(status_));
    }
    beginStop();
  }

  void handleSignals() {
    signalfd_siginfo info;
    while (::read(signalFd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD only wakes us; reap() follows.
      signalLive(sig);
      if (!stopping_) {
        printError("got signal " + signalText(sig) + ", stopping all ranks");
        status_ = 128 + sig;
        stopping_ = true;
        killAt_ = Clock::now() + kStopGrace;
      }
    }
  }

  void emit(const Rank& r, Stream& s, bool atEof) {
    if (!opts_.tagOutput) {  // relayed as it comes
      writeAll(s.sink, s.pending);
      s.pending.clear();
      return;
    }
    // Built piecewise: GCC 12 at -O3 warns falsely (-Wrestrict) on "[" + to_string(...) + "] ".
    std::string prefix("[");
    prefix += std::to_string(r.rank);
    prefix += "] ";
    std::string out;
    std::size_t start = 0;
    for (std::size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      out += prefix;
      out.append(s.pending, start, nl + 1 - start);
    }
    s.pending.erase(0, start);
    if (!s.pending.empty() && (atEof || s.pending.size() >= kMaxLineBytes)) {
      out += prefix + s.pending + "\n";
      s.pending.clear();
    }
    writeAll(s.sink, out);
  }

  void readStream(const Rank& r, Stream& s, int maxReads) {
    char buffer[16384];
    for (int reads = 0; s.fd.valid() && reads < maxReads; ++reads) {
      const ssize_t n = ::read(s.fd.get(), buffer, sizeof buffer);
      if (n > 0) {
        s.pending.append(buffer, static_cast<std::size_t>(n));
        emit(r, s, false);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {
        emit(r, s, true);
        s.fd.reset();
      }
    }
  }

  // Reaps every child that has ended: ranks, and the orphans of their descendants that came to the
  // launcher as their subreaper (nothing to report for those).
  void reap() {
    for (;;) {
      int waitStatus = 0;
      const pid_t got = ::waitpid(-1, &waitStatus, WNOHANG);
      if (got < 0 && errno == EINTR) continue;
      // ECHILD with ranks unreaped: they were reaped behind our back (another thread of the host
      // process); nothing to report for them.
      if (got < 0 && errno == ECHILD)
        for (Rank& r : ranks_) r.alive = false;
      if (got <= 0) break;
      auto it = std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.alive && r.pid == got; });
      if (it == ranks_.end()) continue;
      it->alive = false;
      // Its last words are already in the pipes; show them before the verdict on it.
      readStream(*it, it->out, INT_MAX);
      readStream(*it, it->err, INT_MAX);
      onExit(*it, waitStatus);
    }
  }

  // Every rank has exited 0 but some left processes in their groups: those are stopped like the
  // ranks of a failed job (they would hold the job's output and its resources).
  void stopLeftovers() {
    for (Rank& r : ranks_)
      if (groupLive(r))
        printError("rank " + std::to_string(r.rank) + " exited, leaving processes running in its process group " +
                   std::to_string(r.pid) + "; stopping them");
    stopping_ = true;
    killAt_ = Clock::now() + kStopGrace;
    signalLive(SIGTERM);
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> owners;
    for (;;) {
      const bool ranksLeft = anyAlive();
      const bool groupsLeft = anyGroupLive();
      if (!ranksLeft && !groupsLeft) break;
      if (!ranksLeft && !stopping_) stopLeftovers();
      const auto now = Clock::now();
      if (stopping_ && !killed_ && now >= killAt_) {
        signalLive(SIGKILL);
        killed_ = true;
        giveUpAt_ = now + kReapAfterKill;
      }
      if (killed_ && now >= giveUpAt_) {
        for (Rank& r : ranks_) {
          if (r.alive)
            printError("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") survived SIGKILL; leaving it behind");
          else if (groupLive(r))
            printError("processes that rank " + std::to_string(r.rank) + " started (process group " + std::to_string(r.pid) +
                       ") survived SIGKILL; leaving them behind");
        }
        break;
      }

      fds.assign(1, pollfd{signalFd_.get(), POLLIN, 0});
      owners.assign(1, {nullptr, nullptr});
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (!s->fd.valid()) continue;
          fds.push_back(pollfd{s->fd.get(), POLLIN, 0});
          owners.emplace_back(&r, s);
        }
      }
      // A group's members need not be the launcher's children, so their end wakes nobody: look often.
      int timeoutMs = ranksLeft ? kSafetyPollMs : kGroupPollMs;
      if (stopping_) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>((killed_ ? giveUpAt_ : killAt_) - now);
        timeoutMs = static_cast<int>(std::clamp<long long>(left.count(), 0, timeoutMs));
      }
      if (::poll(fds.data(), fds.size(), timeoutMs) < 0 && errno != EINTR) {
        // Without poll we can neither relay output nor notice signals: end the job the hard way.
        printError(std::string("poll failed: ") + std::strerror(errno) + "; killing all ranks");
        if (!stopping_) status_ = 1;
        signalLive(SIGKILL);
        for (Rank& r : ranks_) {
          while (r.alive && ::waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
          }
          r.alive = false;
        }
        break;
      }
      if (fds[0].revents != 0) handleSignals();
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) readStream(*owners[i].first, *owners[i].second, kReadsPerTurn);
      }
      reap();
      // Every rank left the store, and some are still running: the job's next communicator meets
      // a new one at the same address (its ranks retry until it is there). One that cannot be
      // started fails only the communicators that would meet it, not the job.
      if (hostsStore_ && !stopping_ && anyAlive() && store_->finished() && !startStore()) hostsStore_ = false;
    }
    // Every rank and its group are gone, so the ranks' own output is already in the pipes, and one
    // non-blocking drain gets all of it without waiting for EOF. A pipe still open after it is held
    // by something outside the rank's group (a daemon: a new session of its own): the launcher does
    // not wait for it, and says so.
    for (Rank& r : ranks_) {
      std::string held;
      for (Stream* s : {&r.out, &r.err}) {
        readStream(r, *s, INT_MAX);
        if (!s->fd.valid()) continue;
        emit(r, *s, true);
        s->fd.reset();
        held += held.empty() ? "" : " and ";
        held += s == &r.out ? "stdout" : "stderr";
      }
      if (!held.empty())
        printError("something rank " + std::to_string(r.rank) + " started still holds its " + held +
                   " (a process outside its process group, such as a daemon); not waiting for it: its further output is lost");
    }
  }

  Options opts_;
  StoreHost* store_ = nullptr;
  bool launcherStore_ = false;  // node 0's launcher hosts the store
  bool hostsStore_ = false;     // and this is it
  std::vector<cpu_set_t> bindings_;  // by local rank; empty: ranks run unpinned
  std::vector<Rank> ranks_;
  std::vector<char*> childArgv_;
  UniqueFd signalFd_;
  sigset_t handled_{};
  sigset_t oldMask_{};
  struct sigaction oldChild_ {};
  pid_t launcherPid_ = 0;
  int status_ = 0;
  rlimit startLimit_{RLIM_INFINITY, RLIM_INFINITY};  // RLIMIT_NOFILE as the launcher found it: the ranks' own
  bool relay_[2] = {false, false};  // ranks' stdout, stderr come through the launcher's pipes (Stream)
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point killAt_{};
  Clock::time_point giveUpAt_{};
};

}  // namespace

int runLauncher(int argc, char** argv, StoreHost* store) {
  Options opts;
  const std::string error = parseOptions(argc, argv, opts);
  if (!error.empty()) {
    writeAll(STDERR_FILENO, "braid run: " + error + "\n" + std::string(kUsage));
    return 2;
  }
  if (opts.help) {
    writeAll(STDOUT_FILENO, kUsage);
    return 0;
  }
  if (opts.masterAddr.empty()) opts.masterAddr = "127.0.0.1";
  if (opts.masterPort == 0) {
    std::string why;
    const auto port = pickFreePort(why);
    if (!port) {
      printError("cannot pick a free port for MASTER_PORT: " + why + " (pass --master-port)");
      return 1;
    }
    opts.masterPort = *port;
  }
  if (opts.nnodes == 1) {
    // All ranks are ours: give the job a secret of its own, so that only they can join its store
    // and connect to its ranks. (Across hosts every launcher would need the same one: set
    // BRAID_SECRET yourself; a value already in the environment is kept.)
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) == static_cast<ssize_t>(sizeof raw))
      for (unsigned char b : raw) {
        char hex[3];
        std::snprintf(hex, sizeof hex, "%02x", b);
        opts.secret += hex;
      }
  }
  return Launcher(std::move(opts), store).run();
}

}  // namespace braid::tools
