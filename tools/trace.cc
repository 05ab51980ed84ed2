// `braid trace DIR`: merges the ranks' flight recorder files and names the rank the others wait for.
//
// The verdict follows the waits: start from the lowest-numbered rank stuck in the oldest unfinished
// call, go to the peer it waited for, and keep going while that peer is stuck in the same call. The
// chain ends at the culprit: a rank that wrote no file (killed), one that never entered the call
// (stopped or busy outside Braid), or one that finished it (the bytes were lost on the way). Ranks
// that recorded different calls under one sequence number are reported first: then nothing else
// can be trusted.
#include "tools/trace.h"

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tools/json.h"

namespace braid::tools {
namespace {

// Calls in one sequence space: collectives share one; send/recv counts per ordered pair.
bool sameSpace(const TraceCall& a, const TraceCall& b) {
  if (a.p2p() != b.p2p()) return false;
  return !a.p2p() || (a.sender == b.sender && a.root == b.root);
}
const TraceCall* findCall(const RankTrace& t, const TraceCall& like) {
  for (const TraceCall& c : t.calls)
    if (sameSpace(c, like) && c.seq == like.seq) return &c;
  return nullptr;
}
// The newest call a rank began in like's space, and the newest it completed.
std::uint64_t lastSeq(const RankTrace& t, const TraceCall& like, bool doneOnly) {
  std::uint64_t s = 0;
  for (const TraceCall& c : t.calls)
    if (sameSpace(c, like) && (!doneOnly || c.state == "done")) s = std::max(s, c.seq);
  return s;
}
const TraceCall* unfinished(const RankTrace& t) {
  if (t.calls.empty() || t.calls.back().state == "done") return nullptr;
  return &t.calls.back();
}

std::string shortName(const TraceCall& c) { return c.coll + " #" + std::to_string(c.seq); }

std::string rankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string seconds(std::int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f s", static_cast<double>(ns) / 1e9);
  return buf;
}

std::string describeRank(const RankTrace& t) {
  std::ostringstream o;
  o << "rank " << t.rank << " (" << t.host << ", pid " << t.pid << "): " << t.recorded << " call(s) recorded";
  const TraceCall* u = unfinished(t);
  std::uint64_t done = 0;
  for (const TraceCall& c : t.calls)
    if (c.state == "done" && !c.p2p()) done = std::max(done, c.seq);
  o << ", last completed collective #" << done << "\n";
  if (u) {
    std::int64_t took = (u->endNs ? u->endNs : t.steadyNs) - u->startNs;
    o << "  " << u->describe() << " #" << u->seq << " " << u->state << " after " << seconds(took);
    if (u->stuck)
      o << ", stuck at step " << u->stuckStep << " " << (u->stuckSending ? "sending to" : "receiving from") << " rank "
        << u->stuckPeer << " (channel " << u->stuckChannel << ", " << u->stuckDone << " of " << u->stuckBytes
        << " bytes moved, header " << (u->stuckHeader ? "through" : "not through") << ")";
    o << "\n";
    if (!u->peers.empty()) {
      o << "  bytes in this call:";
      for (std::size_t i = 0; i < u->peers.size(); ++i)
        o << (i ? ";" : "") << " with rank " << u->peers[i].peer << " sent " << u->peers[i].sent << ", received "
          << u->peers[i].recv;
      o << "\n";
    }
  } else {
    o << "  not inside a collective\n";
  }
  if (!t.error.empty()) o << "  error: " << t.reason << ": " << t.error << "\n";
  return o.str();
}

// Ranks that recorded different calls under one collective sequence number: "" if none.
std::string findMismatch(const std::map<int, RankTrace>& traces) {
  std::map<std::uint64_t, std::map<std::string, std::vector<int>>> bySeq;
  for (const auto& [r, t] : traces)
    for (const TraceCall& c : t.calls)
      if (!c.p2p()) bySeq[c.seq][c.describe()].push_back(r);
  for (const auto& [seq, calls] : bySeq) {
    if (calls.size() < 2) continue;
    std::string s = "the ranks called different collectives as #" + std::to_string(seq) + ": ";
    bool first = true;
    for (const auto& [what, ranks] : calls) {
      s += (first ? "" : "; ") + rankList(ranks) + " called " + what;
      first = false;
    }
    return s + " (every rank must issue the same collectives in the same order)";
  }
  return "";
}

std::string followWaits(const std::map<int, RankTrace>& traces, int nranks) {
  // The oldest unfinished call that some rank was stuck in; collectives before send/recv.
  const TraceCall* focus = nullptr;
  int start = -1;
  for (const auto& [r, t] : traces) {
    const TraceCall* u = unfinished(t);
    if (!u || !u->stuck) continue;
    bool better = !focus || (focus->p2p() && !u->p2p()) || (focus->p2p() == u->p2p() && u->seq < focus->seq);
    if (better) {
      focus = u;
      start = r;
    }
  }
  if (!focus) return "";
  std::set<int> visited;
  std::vector<int> chain;
  int cur = start;
  for (;;) {
    visited.insert(cur);
    chain.push_back(cur);
    const TraceCall& e = *findCall(traces.at(cur), *focus);
    const int p = e.stuckPeer;
    std::string what = "rank " + std::to_string(cur) + " is stuck in " + shortName(e) + " step " +
                       std::to_string(e.stuckStep) + " waiting for rank " + std::to_string(p);
    auto it = traces.find(p);
    if (p < 0 || p >= nranks) return what + " (a rank outside the communicator: corrupt trace?)";
    if (it == traces.end()) return what + "; rank " + std::to_string(p) + " wrote no trace (killed?)";
    const RankTrace& peer = it->second;
    const TraceCall* pe = findCall(peer, e);
    if (!pe) {
      std::uint64_t began = lastSeq(peer, e, false), done = lastSeq(peer, e, true);
      if (began > e.seq)
        return what + "; rank " + std::to_string(p) + " has no record of #" + std::to_string(e.seq) +
               " although it went on to #" + std::to_string(began);
      std::string where;  // a rank held up in another kind of call (send/recv vs collective)
      if (const TraceCall* pu = unfinished(peer); pu && !sameSpace(*pu, e))
        where = "; it is stuck in " + shortName(*pu) +
                (pu->stuck ? " waiting for rank " + std::to_string(pu->stuckPeer) : std::string());
      return what + "; rank " + std::to_string(p) + " never entered #" + std::to_string(e.seq) +
             (done ? " (last completed #" + std::to_string(done) + ")" : " (it completed none)") + where;
    }
    if (pe->state == "done")
      return what + "; rank " + std::to_string(p) + " completed #" + std::to_string(e.seq) +
             ", so what it sent rank " + std::to_string(cur) + " was lost or delayed on the way";
    if (!pe->stuck) return what + "; rank " + std::to_string(p) + " failed in #" + std::to_string(e.seq) + ": " + peer.error;
    if (visited.count(p)) {
      std::sort(chain.begin(), chain.end());
      return rankList(chain) + " wait for each other in " + shortName(e) +
             " (a cycle: ranks built different plans? check that BRAID_ALGO and BRAID_NSOCKS match)";
    }
    cur = p;
  }
}

}  // namespace

std::string TraceCall::describe() const {
  if (p2p()) return "send/recv(count=" + std::to_string(count) + ", " + dtype + ") rank " + std::to_string(sender) + "->" +
                    std::to_string(root);
  if (coll == "barrier") return "barrier()";
  std::string s = coll + "(count=" + std::to_string(count) + ", " + dtype;
  if (coll == "allreduce" || coll == "reducescatter" || coll == "reduce") s += ", " + op;
  if (coll == "broadcast" || coll == "reduce") s += ", root=" + std::to_string(root);
  return s + ")";
}

Result<RankTrace> parseRankTrace(const std::string& text) {
  auto doc = parseJson(text);
  if (!doc.ok()) return doc.status();
  const Json& d = *doc;
  if (d.type != Json::kObject || strOf(d.get("format")) != "braid-trace-1")
    return Status::InvalidArgument("not a braid flight recorder file (format braid-trace-1)");
  RankTrace t;
  t.rank = static_cast<int>(intOf(d.get("rank"), -1));
  t.nranks = static_cast<int>(intOf(d.get("nranks")));
  if (t.rank < 0 || t.nranks <= 0 || t.nranks > (1 << 20) || t.rank >= t.nranks)
    return Status::InvalidArgument("bad rank or nranks");
  t.pid = static_cast<long>(intOf(d.get("pid")));
  t.host = strOf(d.get("host"));
  t.comm = strOf(d.get("comm"));
  t.reason = strOf(d.get("reason"));
  t.error = strOf(d.get("error"));
  t.steadyNs = intOf(d.get("steady_ns"));
  t.unixNs = intOf(d.get("unix_ns"));
  t.recorded = uintOf(d.get("recorded"));
  const Json* entries = d.get("entries");
  if (!entries || entries->type != Json::kArray) return Status::InvalidArgument("no entries array");
  for (const Json& e : entries->items) {
    if (e.type != Json::kObject) return Status::InvalidArgument("an entry is not an object");
    TraceCall c;
    c.seq = uintOf(e.get("seq"));
    c.coll = strOf(e.get("coll"));
    c.dtype = strOf(e.get("dtype"));
    c.op = strOf(e.get("op"));
    c.state = strOf(e.get("state"));
    c.count = uintOf(e.get("count"));
    c.root = static_cast<int>(intOf(e.get("root"), -1));
    c.sender = static_cast<int>(intOf(e.get("sender"), -1));
    c.startNs = intOf(e.get("start_ns"));
    c.endNs = intOf(e.get("end_ns"));
    if (const Json* peers = e.get("peers"); peers && peers->type == Json::kArray)
      for (const Json& p : peers->items)
        c.peers.push_back({static_cast<int>(intOf(p.get("peer"), -1)), uintOf(p.get("sent")), uintOf(p.get("recv"))});
    if (const Json* s = e.get("stuck"); s && s->type == Json::kObject) {
      c.stuck = true;
      c.stuckPeer = static_cast<int>(intOf(s->get("peer"), -1));
      c.stuckSending = strOf(s->get("dir")) == "send";
      c.stuckStep = static_cast<std::uint32_t>(uintOf(s->get("step")));
      c.stuckChannel = static_cast<int>(intOf(s->get("channel")));
      c.stuckHeader = boolOf(s->get("header"));
      c.stuckDone = uintOf(s->get("done"));
      c.stuckBytes = uintOf(s->get("bytes"));
    }
    if (c.coll.empty() || c.state.empty()) return Status::InvalidArgument("an entry lacks coll or state");
    t.calls.push_back(std::move(c));
  }
  return t;
}

TraceReport analyzeTraces(std::vector<RankTrace> all, const std::vector<std::string>& problems) {
  TraceReport rep;
  std::string details;
  for (const std::string& p : problems) details += p + "\n";
  rep.anyFile = !all.empty();
  if (all.empty()) {
    rep.details = details;
    rep.verdict = "verdict: no flight recorder files (braid-trace-rank<N>.json) to read";
    return rep;
  }
  // Files from another communicator (an earlier job in the same directory) are set aside: keep the
  // communicator with the most files, the newest on a tie.
  std::map<std::string, std::pair<int, std::int64_t>> comms;
  for (const RankTrace& t : all) {
    auto& [n, newest] = comms[t.comm];
    ++n;
    newest = std::max(newest, t.unixNs);
  }
  std::string comm = all.front().comm;
  for (const auto& [c, v] : comms)
    if (v.first > comms[comm].first || (v.first == comms[comm].first && v.second > comms[comm].second)) comm = c;
  std::map<int, RankTrace> traces;
  int nranks = 0;
  for (RankTrace& t : all) {
    if (t.comm != comm) {
      details += "rank " + std::to_string(t.rank) + "'s file (" + t.file + ") is from another communicator (" + t.comm +
                 ", not " + comm + "): set aside\n";
      continue;
    }
    nranks = std::max(nranks, t.nranks);
    traces[t.rank] = std::move(t);
  }
  std::vector<int> missing, nrankDiffers;
  for (int r = 0; r < nranks; ++r)
    if (!traces.count(r)) missing.push_back(r);
  for (const auto& [r, t] : traces)
    if (t.nranks != nranks) nrankDiffers.push_back(r);
  std::string head = "communicator " + comm + ", " + std::to_string(nranks) + " ranks, " +
                     std::to_string(traces.size()) + " file(s)\n";
  for (const auto& [r, t] : traces) details += describeRank(t);
  for (int r : missing) details += "rank " + std::to_string(r) + " wrote no trace (killed?)\n";
  if (!nrankDiffers.empty())
    details += rankList(nrankDiffers) + " recorded a different number of ranks than " + std::to_string(nranks) + "\n";
  rep.details = head + details;

  std::string v = findMismatch(traces);
  if (v.empty()) v = followWaits(traces, nranks);
  if (v.empty()) {
    // Unfinished calls with no pending message: they failed for a reason of their own (an error
    // found before any message moved); name the oldest.
    const TraceCall* oldest = nullptr;
    for (const auto& [r, t] : traces) {
      const TraceCall* u = unfinished(t);
      if (!u || (oldest && u->seq >= oldest->seq)) continue;
      oldest = u;
      v = shortName(*u) + " did not finish on rank " + std::to_string(r) + " (no message was pending): " + t.reason +
          ": " + t.error;
    }
  }
  if (v.empty()) {
    if (!missing.empty()) {
      v = "";
      for (int r : missing) v += (v.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " wrote no trace (killed?)";
      v += "; no rank that wrote one was stuck inside a collective";
    } else {
      const RankTrace& first = traces.begin()->second;
      v = "no rank was stuck inside a collective; rank " + std::to_string(first.rank) + " reported " + first.reason +
          ": " + first.error;
    }
  } else if (!missing.empty() && v.find("wrote no trace") == std::string::npos) {
    v += " (also, " + rankList(missing) + " wrote no trace)";
  }
  rep.verdict = "verdict: " + v;
  return rep;
}

TraceReport analyzeTraceDir(const std::string& dir) {
  std::vector<RankTrace> traces;
  std::vector<std::string> problems;
  DIR* d = opendir(dir.c_str());
  if (!d) {
    TraceReport rep;
    rep.verdict = "verdict: cannot open " + dir + ": " + std::strerror(errno);
    return rep;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("braid-trace-rank", 0) == 0 && name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
      names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    std::string path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    std::stringstream buf;
    buf << in.rdbuf();
    auto t = parseRankTrace(buf.str());
    if (!t.ok()) {
      problems.push_back(path + ": unreadable: " + t.status().message());
      continue;
    }
    t->file = path;
    traces.push_back(std::move(t.value()));
  }
  return analyzeTraces(std::move(traces), problems);
}

int runTrace(int argc, char** argv) {
  if (argc != 2 || argv[1][0] == '-') {
    std::fputs("usage: braid trace DIR   (the BRAID_TRACE_DIR that the ranks wrote to)\n", argc == 2 ? stdout : stderr);
    return argc == 2 && (!std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) ? 0 : 2;
  }
  TraceReport rep = analyzeTraceDir(argv[1]);
  std::fputs(rep.details.c_str(), stdout);
  std::printf("%s\n", rep.verdict.c_str());
  return rep.anyFile ? 0 : 1;
}

}  // namespace braid::tools
