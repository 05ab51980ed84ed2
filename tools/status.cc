// braid status: asks a running job what every rank is doing, through its rendezvous store (as an
// observer that proves the job's secret, StoreClient::observe), twice a short interval apart, and
// says who holds the others up: a rank that does not answer (stopped, hung, gone), one that has
// not entered the call the others wait in, a call in which nothing moves, or all progressing.
// Each rank answers from its store watcher thread out of relaxed counters (comm/live.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/process.h"
#include "base/socket.h"
#include "comm/bootstrap/init.h"
#include "comm/bootstrap/store.h"
#include "comm/live.h"
#include "tools/json.h"
#include "tools/tools.h"
#include "transport/transport.h"

namespace braid::tools {
namespace {

const char* kStatusUsage =
    "usage: braid status [--addr HOST:PORT | --unique-id ID] [--interval SECONDS] [--watch SECONDS] [--json | --prom]\n"
    "  Asks every rank of a running job what it is doing and says who holds the others up.\n"
    "  --addr      the job's rendezvous store (default: MASTER_ADDR:MASTER_PORT, as the job's launcher set them;\n"
    "              outside a job's environment, the job whose ranks run on this host, with their BRAID_SECRET)\n"
    "  --unique-id a job that met through a unique id (host:port/nonce: braidUniqueIdToString, braid_torch.unique_id());\n"
    "              the nonce is then the secret\n"
    "  --interval  seconds between the two samples that tell moving from waiting (default 0.5)\n"
    "  --watch S   ask again every S seconds until interrupted\n"
    "  --json      one object per report, schema braid.status/1\n"
    "  --prom      Prometheus text exposition (version 0.0.4): per rank bytes, calls, failures, call time\n"
    "  The job's secret comes from BRAID_SECRET, as for its ranks. Exit status: 0 all progressing or idle,\n"
    "  1 stalled (a rank that does not answer, has not entered the call the others wait in, or a call in\n"
    "  which nothing moves), 2 the store could not be reached or refused the query.\n";

struct RankView {
  int rank = 0;
  std::string state;  // progressing, waiting, idle, stopped, silent, gone, left, never joined
  std::string host, call, kind;
  long pid = 0;
  bool answered = false, inCall = false, inSetup = false;
  bool idleBoth = false;  // outside any call in both samples, no call finished in between
  std::uint64_t seq = 0, lastCollective = 0, bytes = 0, calls = 0, failed = 0;
  double forMs = 0, bytesPerSec = 0;
  std::vector<RankMetrics::PerKind> byKind;
  std::vector<RankMetrics::Peer> peers;
  int waitPeer = -1;
  bool waitSending = false;
};

std::string oneLine(const RankView& v) {
  std::string s = "rank " + std::to_string(v.rank) + " (" + (v.host.empty() ? "?" : v.host) + ", pid " + std::to_string(v.pid) + "): " + v.state;
  if (v.inCall) {
    char b[96];
    std::snprintf(b, sizeof(b), " in %s #%llu for %.1f s", v.call.c_str(), static_cast<unsigned long long>(v.seq), v.forMs / 1000);
    s += b;
    if (v.state == "waiting" && v.waitPeer >= 0)
      s += std::string(", ") + (v.waitSending ? "to send to" : "to receive from") + " rank " + std::to_string(v.waitPeer);
    if (v.bytesPerSec > 0) {
      std::snprintf(b, sizeof(b), ", %.1f MB/s", v.bytesPerSec / 1e6);
      s += b;
    }
  } else if (v.answered) {
    s += " (outside any call; last collective #" + std::to_string(v.lastCollective) + ")";
  }
  return s;
}

// Reads each answer; fills what the record says.
void readRecord(const std::string& text, RankView* v) {
  auto doc = parseJson(text);
  if (!doc.ok()) return;
  v->answered = true;
  v->inSetup = boolOf(doc->get("setup"));
  v->host = strOf(doc->get("host"));
  v->pid = static_cast<long>(intOf(doc->get("pid")));
  v->inCall = boolOf(doc->get("in_call"));
  v->call = strOf(doc->get("call"));
  v->kind = strOf(doc->get("kind"));
  v->seq = uintOf(doc->get("seq"));
  v->forMs = doubleOf(doc->get("for_ms"));
  v->bytes = uintOf(doc->get("bytes"));
  v->waitPeer = static_cast<int>(intOf(doc->get("wait_peer"), -1));
  v->waitSending = boolOf(doc->get("wait_sending"));
  v->lastCollective = uintOf(doc->get("last_collective"));
  v->calls = uintOf(doc->get("calls"));
  v->failed = uintOf(doc->get("failed"));
  if (const Json* by = doc->get("by_collective"); by && by->type == Json::kObject)
    for (std::size_t i = 0; i < by->keys.size(); ++i) {
      const Json& k = by->values[i];
      v->byKind.push_back({by->keys[i], uintOf(k.get("calls")), uintOf(k.get("failed")), uintOf(k.get("bytes")), doubleOf(k.get("seconds"))});
    }
  if (const Json* peers = doc->get("peers"); peers && peers->type == Json::kArray)
    for (const Json& p : peers->items)
      v->peers.push_back({static_cast<int>(intOf(p.get("peer"))), uintOf(p.get("bytes")), doubleOf(p.get("stall_s"))});
}

struct Report {
  std::vector<RankView> ranks;
  std::string verdict;
  bool stalled = false;
};

// The ranks' states from two samples `interval` seconds apart, and the verdict.
Report judge(const StatusReply& first, const StatusReply& second, double interval, StoreClient& store, const Deadline& d) {
  Report rep;
  const std::size_t n = second.ranks.size();
  char here[256] = {};
  gethostname(here, sizeof(here) - 1);
  std::vector<std::string> missing;  // info keys of ranks that did not answer (their host and pid)
  for (std::size_t r = 0; r < n; ++r) {
    RankView v;
    v.rank = static_cast<int>(r);
    RankView before;
    if (r < first.answers.size() && !first.answers[r].empty()) readRecord(first.answers[r], &before);
    if (!second.answers[r].empty()) readRecord(second.answers[r], &v);
    if (v.answered && v.inSetup) {
      v.state = "in set-up";
    } else if (v.answered) {
      const bool sameCall = before.answered && before.inCall && v.inCall && before.seq == v.seq && before.kind == v.kind;
      v.idleBoth = before.answered && !before.inSetup && !before.inCall && !v.inCall && before.calls == v.calls;
      const std::uint64_t moved = before.answered && v.bytes > before.bytes ? v.bytes - before.bytes : 0;
      v.bytesPerSec = static_cast<double>(moved) / interval;
      v.state = !v.inCall ? "idle" : moved > 0 || !sameCall ? "progressing" : "waiting";
    } else {
      switch (second.ranks[r]) {
        case StatusReply::kNeverJoined: v.state = "never joined"; break;
        case StatusReply::kLeft: v.state = "left"; break;
        case StatusReply::kGone: v.state = "gone"; break;
        default: v.state = "silent"; missing.push_back("info/" + std::to_string(r)); break;
      }
    }
    rep.ranks.push_back(v);
  }
  // Where the silent ranks are: their published PeerInfo; on this host, whether the process is stopped.
  if (!missing.empty()) {
    auto infos = store.getMany(missing, d);
    std::size_t k = 0;
    for (RankView& v : rep.ranks) {
      if (v.state != "silent" || !infos.ok() || k >= infos->size()) continue;
      auto info = PeerInfo::parse((*infos)[k++]);
      if (!info.ok()) continue;
      v.host = info->host;
      v.pid = info->pid;
      if (v.host == here && v.pid > 0) {
        if (procStopped(static_cast<int>(v.pid))) v.state = "stopped";
        else if (procState(static_cast<int>(v.pid)) != ProcState::kRuns) v.state = "gone";
      }
    }
  }
  // The verdict, in braid trace's words: the rank the others wait for first.
  std::map<std::string, int> waitingIn;  // "allreduce(...) #812" -> ranks in it
  std::string busiest;
  double longestMs = 0, totalRate = 0;
  for (const RankView& v : rep.ranks) {
    if (v.inCall && v.answered && v.kind != "send/recv") {  // (a send/recv's number counts one pair's calls)
      const std::string key = v.call + " #" + std::to_string(v.seq);
      if (++waitingIn[key] > (busiest.empty() ? 0 : waitingIn[busiest])) busiest = key;
      longestMs = std::max(longestMs, v.forMs);
    }
    totalRate += v.bytesPerSec;
  }
  auto waitText = [](int k) { return std::to_string(k) + (k == 1 ? " rank waits" : " ranks wait"); };
  auto describeRank = [](const RankView& v) {
    return "rank " + std::to_string(v.rank) + " (host " + (v.host.empty() ? "?" : v.host) + ", pid " + std::to_string(v.pid) + ")";
  };
  const int waiting = busiest.empty() ? 0 : waitingIn[busiest];
  // Every rank inside a call, and the calls' numbers: ranks one call apart wait for the same rank.
  int inAnyCall = 0;
  std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
  for (const RankView& v : rep.ranks)
    if (v.answered && v.inCall && v.kind != "send/recv") ++inAnyCall, lo = std::min(lo, v.seq), hi = std::max(hi, v.seq);
  const std::string inCalls = busiest.empty() ? "" : busiest.substr(0, busiest.rfind(" #")) + " #" + std::to_string(lo) +
                                                        (hi != lo ? "-#" + std::to_string(hi) : "");
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.1f s", longestMs / 1000);
  for (const RankView& v : rep.ranks) {
    std::string why;
    if (v.state == "stopped") why = " is stopped (SIGSTOP or a debugger)";
    else if (v.state == "silent") why = " does not answer (stopped, hung, or its process is busy outside Braid with its threads blocked)";
    else if (v.state == "gone") why = " is gone (its process exited or its connection closed)";
    else if (v.state == "never joined") why = " never joined the job";
    else if (v.state == "left") why = " has left (destroyed its communicator)";
    if (why.empty()) continue;
    rep.verdict = describeRank(v) + why + (inAnyCall ? "; " + waitText(inAnyCall) + " in " + inCalls + " for it" : "");
    rep.stalled = true;
    return rep;
  }
  // Not entered: ranks wait in a collective in both samples with nothing moved, while a rank stayed
  // outside any call in both, finishing none, its last collective older than theirs (one snapshot
  // of ranks reaching a call at different times proves nothing).
  int waitingBoth = 0;
  for (const RankView& v : rep.ranks) waitingBoth += v.state == "waiting" && v.kind != "send/recv";
  if (waiting && waitingBoth) {
    const std::uint64_t busiestSeq = std::stoull(busiest.substr(busiest.rfind('#') + 1));
    for (const RankView& v : rep.ranks) {
      if (!v.idleBoth || v.lastCollective >= busiestSeq) continue;
      rep.verdict = describeRank(v) + " has not entered " + busiest + " (its last collective is #" + std::to_string(v.lastCollective) +
                    "); " + waitText(waiting) + " in it for up to " + secs;
      rep.stalled = true;
      return rep;
    }
  }
  int inCall = 0, moving = 0, inSetup = 0;
  for (const RankView& v : rep.ranks) inCall += v.inCall, moving += v.state == "progressing", inSetup += v.state == "in set-up";
  if (inSetup) {
    rep.verdict = std::to_string(inSetup) + " of " + std::to_string(rep.ranks.size()) + " ranks still in set-up (creating the communicator)";
    return rep;
  }
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%.1f MB/s sent and received by all ranks", totalRate / 1e6);
  if (inCall == 0) {
    rep.verdict = "all idle (outside any call)";
  } else if (moving == 0) {
    // Where it stands still: a pair in which one rank waits to send to a peer that waits to receive
    // from it (the data is there, the link does not carry it); else the rank that waited longest.
    std::string where;
    auto at = [&](const RankView& v) { return "rank " + std::to_string(v.rank) + " (host " + (v.host.empty() ? "?" : v.host) + ")"; };
    const RankView* longest = nullptr;
    for (const RankView& v : rep.ranks) {
      if (!v.inCall || v.waitPeer < 0 || v.waitPeer >= static_cast<int>(rep.ranks.size())) continue;
      const RankView& p = rep.ranks[static_cast<std::size_t>(v.waitPeer)];
      if (!v.waitSending && p.inCall && p.waitSending && p.waitPeer == v.rank && where.empty())
        where = "; " + at(p) + " waits to send to " + at(v) + ", which waits to receive from it" +
                (p.host != v.host ? ": the link " + p.host + "–" + v.host + " carries nothing" : "");
      if (!longest || v.forMs > longest->forMs) longest = &v;
    }
    if (where.empty() && longest)
      where = "; " + at(*longest) + " has waited longest, " + std::string(longest->waitSending ? "to send to " : "to receive from ") +
              at(rep.ranks[static_cast<std::size_t>(longest->waitPeer)]);
    rep.verdict = "no rank moved a byte in " + std::to_string(interval).substr(0, 4) + " s while " + std::to_string(inCall) +
                  " ranks wait (the longest for " + secs + ", in " + busiest + ")" + where + ": a stalled link or transport (braid doctor)";
    rep.stalled = true;
  } else {
    rep.verdict = "all progressing (" + busiest + ", " + rate + ")";
  }
  return rep;
}

std::string toJson(const Report& rep, const std::string& addr, double interval) {
  std::string out = "{\"schema\": \"braid.status/1\", \"addr\": " + jsonString(addr) + ", \"interval_s\": " + std::to_string(interval) +
                    ", \"nranks\": " + std::to_string(rep.ranks.size()) + ", \"stalled\": " + (rep.stalled ? "true" : "false") +
                    ", \"verdict\": " + jsonString(rep.verdict) + ", \"ranks\": [";
  for (std::size_t i = 0; i < rep.ranks.size(); ++i) {
    const RankView& v = rep.ranks[i];
    char b[256];
    std::snprintf(b, sizeof(b), "\"rank\": %d, \"pid\": %ld, \"in_call\": %s, \"seq\": %llu, \"for_ms\": %.1f, \"bytes_per_s\": %.0f, "
                                "\"wait_peer\": %d, \"last_collective\": %llu",
                  v.rank, v.pid, v.inCall ? "true" : "false", static_cast<unsigned long long>(v.seq), v.forMs, v.bytesPerSec,
                  v.waitPeer, static_cast<unsigned long long>(v.lastCollective));
    out += std::string(i ? ",\n  {" : "\n  {") + "\"state\": " + jsonString(v.state) + ", \"host\": " + jsonString(v.host) +
           ", \"call\": " + jsonString(v.call) + ", " + b + "}";
  }
  return out + "\n]}\n";
}

// The ranks as their metrics: the same text a rank's BRAID_METRICS_PORT serves (comm/live.h).
std::string toProm(const Report& rep) {
  std::vector<RankMetrics> ranks;
  for (const RankView& v : rep.ranks) {
    RankMetrics m;
    m.rank = v.rank;
    m.host = v.host;
    m.state = v.state;
    m.answered = v.answered;
    m.inCall = v.inCall;
    m.callSeconds = v.inCall ? v.forMs / 1000 : 0;
    m.bytes = v.bytes;
    m.bytesPerSec = v.bytesPerSec;
    m.calls = v.calls;
    m.failed = v.failed;
    m.lastCollective = v.lastCollective;
    m.byKind = v.byKind;
    m.peers = v.peers;
    ranks.push_back(std::move(m));
  }
  return prometheusText(ranks, rep.stalled ? 1 : 0);
}

// A job whose ranks run on this host, in environment mode (braid run, torchrun, mpirun, srun): its
// store's address and the secret its ranks were given, from their /proc/PID/environ (readable
// only by their user and root, who may then ask the job, as its ranks may).
struct LocalJob {
  std::string host;
  int port = 0;
  std::string secret;
  std::vector<int> ranks;
};

std::vector<LocalJob> localJobs() {
  std::map<std::pair<std::string, int>, LocalJob> jobs;
  const int self = static_cast<int>(getpid());
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    const int pid = std::atoi(name.c_str());
    if (pid <= 0 || pid == self) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    const std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (env.empty()) continue;
    std::map<std::string, std::string> vars;
    for (std::size_t at = 0; at < env.size();) {
      std::size_t end = env.find('\0', at);
      if (end == std::string::npos) end = env.size();
      const std::string kv = env.substr(at, end - at);
      const std::size_t eq = kv.find('=');
      if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
      at = end + 1;
    }
    if (!vars.count("RANK") || !vars.count("MASTER_PORT")) continue;
    int port = std::atoi(vars["MASTER_PORT"].c_str());
    // Under torchrun's agent store, or braid run's own, Braid's is on the next port (readLaunchEnv,
    // paramsFromEnv).
    if (vars["TORCHELASTIC_USE_AGENT_STORE"] == "True" || vars["BRAID_STORE_HOST"] == "launcher") ++port;
    const std::string host = vars.count("MASTER_ADDR") && !vars["MASTER_ADDR"].empty() ? vars["MASTER_ADDR"] : "127.0.0.1";
    LocalJob& job = jobs[{host, port}];
    job.host = host, job.port = port, job.secret = vars["BRAID_SECRET"];
    job.ranks.push_back(std::atoi(vars["RANK"].c_str()));
  }
  std::vector<LocalJob> found;
  for (auto& [key, job] : jobs) {
    std::sort(job.ranks.begin(), job.ranks.end());
    found.push_back(job);
  }
  return found;
}

}  // namespace

int runStatus(int argc, char** argv) {
  std::string addr, uniqueId;
  double interval = 0.5, watch = 0;
  bool json = false, prom = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "-h" || a == "--help") { std::fputs(kStatusUsage, stdout); return 0; }
    if (a == "--json") { json = true; continue; }
    if (a == "--prom") { prom = true; continue; }
    if ((a == "--addr" || a == "--unique-id" || a == "--interval" || a == "--watch") && v) {
      ++i;
      if (a == "--addr") addr = v;
      else if (a == "--unique-id") uniqueId = v;
      else if (a == "--interval") interval = std::atof(v);
      else watch = std::atof(v);
      continue;
    }
    std::fprintf(stderr, "braid status: unknown or incomplete argument '%s'\n%s", a.c_str(), kStatusUsage);
    return 2;
  }
  if (!(interval > 0 && interval <= 60) || watch < 0) {
    std::fprintf(stderr, "braid status: --interval takes 0 to 60 seconds, --watch a positive number\n");
    return 2;
  }
  auto cfg = Config::fromEnvironment();
  if (!cfg.ok()) { std::fprintf(stderr, "braid status: %s\n", cfg.status().toString().c_str()); return 2; }
  std::string host, secret;
  std::string braidSecret = cfg->secret;  // BRAID_SECRET: this shell's, or the local job's ranks'
  int port = -1;
  if (!uniqueId.empty()) {  // the store's address and the job's secret, both in the id
    auto id = uniqueIdFromString(uniqueId);
    auto p = id.ok() ? paramsFromUniqueId(*id, 1, 0) : Result<InitParams>(id.status());
    if (!p.ok()) { std::fprintf(stderr, "braid status: --unique-id: %s\n", p.status().toString().c_str()); return 2; }
    host = p->storeIp, port = p->storePort, secret = p->storeNonce;
  } else if (addr.empty()) {
    auto le = readLaunchEnv();
    if (le.ok()) host = le->masterAddr, port = le->masterPort + (cfg->storeHost == "launcher" ? 1 : 0);
    if (host.empty() || port <= 0) {
      // Not in a job's environment: the job whose ranks run on this host, if there is one.
      const std::vector<LocalJob> jobs = localJobs();
      if (jobs.size() > 1) {
        std::fprintf(stderr, "braid status: %zu jobs run ranks on this host; say which with --addr:\n", jobs.size());
        for (const LocalJob& j : jobs)
          std::fprintf(stderr, "  --addr %s:%d  (ranks %d..%d here)\n", j.host.c_str(), j.port, j.ranks.front(), j.ranks.back());
        return 2;
      }
      if (jobs.size() == 1) {
        host = jobs[0].host, port = jobs[0].port;
        if (!jobs[0].secret.empty()) braidSecret = jobs[0].secret;
      }
    }
  } else if (addr.rfind(':') != std::string::npos) {
    host = addr.substr(0, addr.rfind(':'));
    port = std::atoi(addr.substr(addr.rfind(':') + 1).c_str());
  }
  if (host.empty() || port <= 0 || port > 65535) {
    std::fprintf(stderr, "braid status: no job's ranks run on this host (as this user): say where the job's rendezvous store is: "
                         "--addr HOST:PORT, or MASTER_ADDR and MASTER_PORT\n");
    return 2;
  }
  auto ip = net::resolve(host);
  if (!ip.ok()) { std::fprintf(stderr, "braid status: %s\n", ip.status().toString().c_str()); return 2; }
  const std::string where = *ip + ":" + std::to_string(port);
  for (;;) {
    const Deadline d = Deadline::after(std::min(10.0, cfg->timeoutSec));
    auto store = StoreClient::observe(*ip, port, secret.empty() ? storeSecret(braidSecret, *ip, port) : secret, d);
    if (!store.ok()) { std::fprintf(stderr, "braid status: %s\n", store.status().toString().c_str()); return 2; }
    // Answers come from each rank's watcher thread within milliseconds. The second sample is
    // taken an interval after the first: a rank in the same call with no more bytes moved is waiting.
    // (on a loaded host a watcher thread may take a moment to be scheduled: answers are waited
    // for 0.75 s, or the interval if that is longer)
    const double answerWithin = std::max(interval, 0.75);
    const auto start = std::chrono::steady_clock::now();
    auto first = (*store)->queryStatus(Deadline::after(answerWithin));
    const auto firstAt = std::chrono::steady_clock::now();
    std::this_thread::sleep_until(start + std::chrono::duration<double>(interval));
    auto second = first.ok() ? (*store)->queryStatus(Deadline::after(answerWithin)) : first;
    if (!second.ok()) { std::fprintf(stderr, "braid status: %s\n", second.status().toString().c_str()); return 2; }
    // Between the two samples: from the first's last answer to the second's (about the interval).
    const double between = std::max(1e-3, std::chrono::duration<double>(std::chrono::steady_clock::now() - firstAt).count());
    const Report rep = judge(*first, *second, between, **store, Deadline::after(interval));
    if (prom) {
      std::fputs(toProm(rep).c_str(), stdout);
    } else if (json) {
      std::fputs(toJson(rep, where, between).c_str(), stdout);
    } else {
      std::printf("# braid status: %zu ranks, store %s\n", rep.ranks.size(), where.c_str());
      for (const RankView& v : rep.ranks) std::printf("%s\n", oneLine(v).c_str());
      std::printf("verdict: %s\n", rep.verdict.c_str());
    }
    std::fflush(stdout);
    if (watch <= 0) return rep.stalled ? 1 : 0;
    std::this_thread::sleep_for(std::chrono::duration<double>(watch));
  }
}

}  // namespace braid::tools
