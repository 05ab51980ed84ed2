#include "comm/bootstrap/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <thread>
#include <map>
#include <mutex>
#include <vector>

#include "base/auth.h"
#include "base/fdlimit.h"
#include "base/log.h"
#include "comm/bootstrap/wire_codec.h"

namespace braid {
namespace {

enum : std::uint8_t {
  kChallenge = 'C', kHello = 'H', kSet = 'S', kGet = 'G', kAdd = 'A', kWaitGe = 'W', kReport = 'R', kBye = 'B',
  kOk = 'O', kValue = 'V', kErr = 'E', kNotice = 'N',
  kRetry = 'T',  // to a hello: this store serves a communicator that is closing; connect again
  kMultiGet = 'M',  // several keys, answered together once every one of them is set
  kStatusQuery = 'Q',  // an observer asks every rank for its status record
};

// The rank an observer's hello claims (with 0 ranks): braid status, which is no rank.
constexpr std::int32_t kObserverRank = -2;

// Keys a multi-get asks for at most (its answer must fit a frame: PeerInfos are ~200 bytes).
constexpr std::uint32_t kMultiGetKeys = 1024;

std::string frame(std::uint8_t type, const std::string& payload) {
  Writer w;
  w.u32(static_cast<std::uint32_t>(payload.size() + 1));
  w.u8(type);
  return w.data() + payload;
}

// What a rank's hello proves: it knows the secret, it answers this connection's challenge (so a
// recorded hello is useless), and the rank and size it claims are the ones it was given.
auth::Digest helloMac(const std::string& secret, const std::string& storeChallenge, const std::string& rankChallenge,
                      std::int32_t rank, std::int32_t nranks) {
  Writer w;
  w.str(storeChallenge);
  w.str(rankChallenge);
  w.i32(rank);
  w.i32(nranks);
  return auth::hmacSha256(secret, "braid-store-hello" + w.data());
}

std::string encodeNotice(const Notice& n) {
  Writer w;
  w.i32(n.kind);
  w.i32(n.rank);
  w.i32(static_cast<int>(n.code));
  w.str(n.message);
  return w.data();
}

// The failure a notice reports, as a rank that read it while it waited says it (during set-up, or after).
Status failureOf(const Notice& n, bool inSetup = true) {
  if (n.kind == Notice::kPeerGone)
    return Status::RemoteError("rank " + std::to_string(n.rank) + " exited or closed its connection" +
                               (inSetup ? " during setup" : ""));
  return Status(n.code, n.message);
}

bool decodeNotice(const std::string& p, Notice* n) {
  Reader r(p);
  std::int32_t kind, code;
  if (!r.i32(&kind) || !r.i32(&n->rank) || !r.i32(&code) || !r.str(&n->message)) return false;
  n->kind = kind == Notice::kPeerGone       ? Notice::kPeerGone
            : kind == Notice::kTimedOut     ? Notice::kTimedOut
            : kind == Notice::kStatusQuery  ? Notice::kStatusQuery
            : kind == Notice::kStatusAnswer ? Notice::kStatusAnswer
                                            : Notice::kError;
  // Codes come from the network: only failures are accepted, anything else is a remote error.
  n->code = code >= static_cast<int>(Code::kCudaError) && code <= static_cast<int>(Code::kAborted) &&
                    code != static_cast<int>(Code::kInProgress)
                ? static_cast<Code>(code)
                : Code::kRemoteError;
  return true;
}

// Reads one frame (blocking until the deadline).
Status readFrame(int fd, std::uint8_t* type, std::string* payload, const Deadline& d) {
  std::uint32_t len = 0;
  Status s = net::recvAll(fd, &len, 4, d);
  if (!s.ok()) return s;
  if (len < 1 || len > kMaxFrame) return Status::RemoteError("malformed frame from the store");
  std::string body(len, '\0');
  s = net::recvAll(fd, body.data(), len, d);
  if (!s.ok()) return s;
  *type = static_cast<std::uint8_t>(body[0]);
  *payload = body.substr(1);
  return Status::Ok();
}

struct ServerClient {
  net::Fd fd;
  std::string challenge;  // sent on accept; the hello must answer it
  Deadline helloBy = Deadline::after(10);
  std::string in;
  int rank = -1;
  bool observer = false;  // braid status: proved the secret, is no rank
  bool left = false;      // said goodbye or closed
  bool saidBye = false;
  bool asked = false;     // a status query it has not answered yet (it gets no second one meanwhile)
};

struct PendingWait {
  std::size_t client;
  std::uint8_t type;
  std::string key;
  std::int64_t atLeast;
  std::vector<std::string> keys;  // kMultiGet
  std::size_t present = 0;        // kMultiGet: keys[0..present) are known to be set
};

}  // namespace

// ---------------------------------------------------------------- server

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& ip, int port, const std::string& nonce) {
  auto fd = net::listenOn(ip, port);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<StoreServer> s(new StoreServer());
  s->listen_ = std::move(fd.value());
  s->port_ = net::localPort(s->listen_.get());
  s->nonce_ = nonce;
  s->thread_ = std::thread([srv = s.get(), fd = s->listen_.get()] { srv->serve(fd); });
  BRAID_LOG(kInfo, kBoot, "rendezvous store listening on %s:%d", ip.c_str(), s->port_);
  return s;
}

StoreServer::~StoreServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void StoreServer::waitUntilAllLeft(const Deadline& d) {
  while (!finished_ && !d.expired()) usleep(2000);
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

namespace {
// Detached servers of this process, by nonce. Leaked on purpose, like the servers themselves.
std::mutex& detachedMutex() {
  static auto* m = new std::mutex();
  return *m;
}
// With the pid that started each: a forked child inherits the table but not the threads.
std::map<std::string, std::pair<pid_t, StoreServer*>>& detachedServers() {
  static auto* d = new std::map<std::string, std::pair<pid_t, StoreServer*>>();
  return *d;
}
}  // namespace

void StoreServer::waitForDetached(const std::string& nonce, const Deadline& d) {
  StoreServer* s = nullptr;
  {
    std::lock_guard<std::mutex> g(detachedMutex());
    auto it = detachedServers().find(nonce);
    if (it != detachedServers().end() && it->second.first == getpid()) s = it->second.second;
  }
  while (s && !s->finished_ && !d.expired()) usleep(2000);
}

std::int64_t StoreServer::requestsOfDetached(const std::string& nonce) {
  std::lock_guard<std::mutex> g(detachedMutex());
  auto it = detachedServers().find(nonce);
  return it != detachedServers().end() && it->second.first == getpid() ? it->second.second->requests() : -1;
}

std::int64_t StoreServer::bytesOfDetached(const std::string& nonce) {
  std::lock_guard<std::mutex> g(detachedMutex());
  auto it = detachedServers().find(nonce);
  return it != detachedServers().end() && it->second.first == getpid() ? it->second.second->bytes() : -1;
}

void StoreServer::detach() {
  {
    std::lock_guard<std::mutex> g(detachedMutex());
    detachedServers()[nonce_] = {getpid(), this};
  }
  // The server thread owns itself from now on; it exits when every rank has left.
  thread_.detach();
  const int fd = listen_.release();
  if (listener_.exchange(kDetached) == kThreadDone) ::close(fd);  // the thread is gone: close it here
}

void StoreServer::serve(int listenFd) {
  std::vector<ServerClient> clients;
  std::map<std::string, std::string> kv;
  std::map<std::string, std::int64_t> counters;
  std::vector<PendingWait> waits;
  int nranks = -1, joined = 0, left = 0;
  // Held so that, out of descriptors, the store can still accept a rank to tell it so.
  net::Fd spare(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  bool outOfFds = false;
  Deadline writeBudget = Deadline::after(1);

  auto send = [&](ServerClient& c, std::uint8_t type, const std::string& payload) {
    if (c.left || !c.fd.valid()) return;
    writeBudget = Deadline::after(1);
    bytes_.fetch_add(static_cast<std::int64_t>(payload.size() + 5), std::memory_order_relaxed);
    if (!net::sendAll(c.fd.get(), frame(type, payload).data(), payload.size() + 5, writeBudget).ok()) c.fd.reset();
  };
  // Every notice so far, for ranks that join later: a rank that failed or vanished before another
  // said hello is news to that one too.
  std::vector<Notice> history;
  auto broadcast = [&](const Notice& n, std::size_t except) {
    history.push_back(n);
    for (std::size_t i = 0; i < clients.size(); ++i)
      if (i != except && clients[i].rank >= 0) send(clients[i], kNotice, encodeNotice(n));
  };
  auto drop = [&](std::size_t i, bool announce) {
    ServerClient& c = clients[i];
    if (c.left) return;
    c.left = true;
    if (c.rank >= 0) {
      ++left;
      if (announce) {
        Notice n{Notice::kPeerGone, c.rank, Code::kRemoteError, ""};
        BRAID_LOG(kWarn, kBoot, "store: rank %d closed its connection without saying goodbye", c.rank);
        broadcast(n, i);
      }
    }
    c.fd.reset();
  };
  auto serveWaits = [&] {
    for (std::size_t w = 0; w < waits.size();) {
      PendingWait& pw = waits[w];
      bool done = false;
      if (pw.type == kGet) {
        auto it = kv.find(pw.key);
        if (it != kv.end()) { Writer v; v.str(it->second); send(clients[pw.client], kValue, v.data()); done = true; }
      } else if (pw.type == kMultiGet) {
        while (pw.present < pw.keys.size() && kv.count(pw.keys[pw.present])) ++pw.present;
        if (pw.present == pw.keys.size()) {
          Writer v;
          v.u32(static_cast<std::uint32_t>(pw.keys.size()));
          for (const std::string& k : pw.keys) v.str(kv[k]);
          send(clients[pw.client], kValue, v.data());
          done = true;
        }
      } else if (counters[pw.key] >= pw.atLeast) {
        send(clients[pw.client], kOk, "");
        done = true;
      }
      if (done) { waits[w] = waits.back(); waits.pop_back(); } else ++w;
    }
  };
  auto handle = [&](std::size_t i, std::uint8_t type, const std::string& payload) -> bool {
    ServerClient& c = clients[i];
    Reader r(payload);
    requests_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(static_cast<std::int64_t>(payload.size() + 5), std::memory_order_relaxed);
    if (c.rank < 0 && !c.observer && type != kHello) return false;  // nothing before a valid hello
    // An observer reads keys and asks for status; nothing else (it never joins or reports).
    if (c.observer && type != kGet && type != kMultiGet && type != kStatusQuery && type != kBye) return false;
    switch (type) {
      case kHello: {
        std::string theirChallenge, mac;
        std::int32_t rank, n;
        if (c.rank >= 0 || c.observer || !r.str(&theirChallenge) || !r.i32(&rank) || !r.i32(&n) || !r.str(&mac) ||
            theirChallenge.size() != 16 || mac.size() != 32)
          return false;
        auth::Digest want = helloMac(nonce_, c.challenge, theirChallenge, rank, n);
        auth::Digest got;
        std::memcpy(got.data(), mac.data(), got.size());
        if (!auth::equal(want, got)) {
          Writer w;
          w.str("authentication failed: this process does not know the job's secret (the unique id, or BRAID_SECRET "
                "as braid run sets it)");
          send(c, kErr, w.data());
          return false;
        }
        if (rank == kObserverRank && n == 0) {
          if (c.observer) return false;
          c.observer = true;
          auth::Digest proof = auth::hmacSha256(nonce_, "braid-store-ok" + theirChallenge + c.challenge);
          Writer w;
          w.str(std::string(reinterpret_cast<const char*>(proof.data()), proof.size()));
          send(c, kValue, w.data());
          return true;
        }
        // The rank already joined this store and left it: it is creating its next communicator
        // while this one (same address, same secret) still waits for slower ranks to leave.
        // It must meet the next store, not this one.
        for (auto& o : clients)
          if (&o != &c && o.rank == rank && o.left) { send(c, kRetry, ""); return false; }
        std::string err;
        if (n < 1 || rank < 0 || rank >= n) err = "rank " + std::to_string(rank) + " is outside 0.." + std::to_string(n - 1);
        else if (nranks >= 0 && n != nranks) err = "rank " + std::to_string(rank) + " says there are " + std::to_string(n) + " ranks, others said " + std::to_string(nranks);
        for (auto& o : clients)
          if (&o != &c && o.rank == rank && err.empty()) err = "rank " + std::to_string(rank) + " joined twice (two processes were given the same rank)";
        if (!err.empty()) { Writer w; w.str(err); send(c, kErr, w.data()); return false; }
        nranks = n;
        c.rank = rank;
        ++joined;
        joined_.store(joined, std::memory_order_relaxed);
        auth::Digest proof = auth::hmacSha256(nonce_, "braid-store-ok" + theirChallenge + c.challenge);
        Writer w;
        w.str(std::string(reinterpret_cast<const char*>(proof.data()), proof.size()));
        send(c, kValue, w.data());
        for (const Notice& n : history) send(c, kNotice, encodeNotice(n));
        return true;
      }
      case kSet: {
        std::string k, v;
        if (!r.str(&k) || !r.str(&v)) return false;
        kv[k] = v;
        send(c, kOk, "");
        serveWaits();
        return true;
      }
      case kGet: {
        std::string k;
        if (!r.str(&k)) return false;
        waits.push_back({i, kGet, k, 0, {}, 0});
        serveWaits();
        return true;
      }
      case kAdd: {
        std::string k;
        std::int64_t delta;
        if (!r.str(&k) || !r.i64(&delta)) return false;
        std::int64_t sum;
        if (__builtin_add_overflow(counters[k], delta, &sum)) return false;  // found by fuzz_store
        counters[k] = sum;
        Writer v;
        v.str(std::to_string(sum));
        send(c, kValue, v.data());
        serveWaits();
        return true;
      }
      case kMultiGet: {
        std::uint32_t count = 0;
        if (!r.u32(&count) || count == 0 || count > kMultiGetKeys) return false;
        PendingWait pw{i, kMultiGet, "", 0, {}, 0};
        pw.keys.resize(count);
        for (std::string& k : pw.keys)
          if (!r.str(&k)) return false;
        waits.push_back(std::move(pw));
        serveWaits();
        return true;
      }
      case kWaitGe: {
        std::string k;
        std::int64_t n;
        if (!r.str(&k) || !r.i64(&n)) return false;
        waits.push_back({i, kWaitGe, k, n, {}, 0});
        serveWaits();
        return true;
      }
      case kReport: {
        Notice n;
        if (!decodeNotice(payload, &n)) return false;
        if (n.kind == Notice::kStatusQuery) return true;  // only observers ask
        if (n.kind == Notice::kStatusAnswer) {  // to the observers, kept by nobody
          n.rank = c.rank;
          c.asked = false;
          for (ServerClient& o : clients)
            if (o.observer) send(o, kNotice, encodeNotice(n));
          return true;
        }
        broadcast(n, i);
        return true;
      }
      case kStatusQuery: {
        // The ranks' connections as the store sees them, then the question to every connected one.
        std::string id;
        if (!c.observer || !r.str(&id) || id.size() > 64) return false;
        std::vector<std::uint8_t> state(static_cast<std::size_t>(std::max(nranks, 0)), StatusReply::kNeverJoined);
        for (const ServerClient& o : clients)
          if (o.rank >= 0 && o.rank < nranks)
            state[static_cast<std::size_t>(o.rank)] = !o.left ? StatusReply::kConnected : o.saidBye ? StatusReply::kLeft : StatusReply::kGone;
        Writer v;
        v.str(std::string(state.begin(), state.end()));
        send(c, kValue, v.data());
        // A rank that has not answered the last query (stopped, or not reading its connection) is
        // not asked again: questions would pile up in its socket until a send to it blocked.
        const std::string ask = encodeNotice({Notice::kStatusQuery, -1, Code::kRemoteError, id});
        for (ServerClient& o : clients)
          if (o.rank >= 0 && !o.left && !o.asked) send(o, kNotice, ask), o.asked = true;
        return true;
      }
      case kBye:
        c.saidBye = true;
        drop(i, false);
        return true;
      default:
        return false;
    }
  };

  while (!stop_) {
    if (nranks > 0 && joined >= nranks && left >= joined) break;
    std::vector<pollfd> pfds{{listenFd, POLLIN, 0}};
    std::vector<std::size_t> owner{0};
    for (std::size_t i = 0; i < clients.size(); ++i)
      if (!clients[i].left && clients[i].fd.valid()) { pfds.push_back({clients[i].fd.get(), POLLIN, 0}); owner.push_back(i); }
    // (No event is no reason to skip the sweep below: a socket found broken while writing to it
    // after the last event is dropped there, or nobody ever would.)
    if (::poll(pfds.data(), pfds.size(), 50) < 0)
      for (pollfd& p : pfds) p.revents = 0;
    if (pfds[0].revents & POLLIN) {
      int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0 && fdlimit::exhausted(errno)) {
        // Out of descriptors: the spare one makes room to accept this rank and tell it why (rather
        // than leave it in the backlog until BRAID_TIMEOUT), and every joined rank hears it too.
        const std::string why = "the rendezvous store (in rank 0's process, braid run's launcher on node 0, or the process "
                                "that created the unique id) cannot accept more ranks: " + net::errnoText(errno);
        if (!outOfFds) {
          BRAID_LOG(kWarn, kBoot, "store: %s", why.c_str());
          broadcast({Notice::kError, -1, Code::kSystemError, why}, clients.size());
        }
        outOfFds = true;
        spare.reset();
        net::Fd refused(::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (refused.valid()) {
          Writer w;
          w.str(why);
          const std::string f = frame(kErr, w.data());
          (void)::send(refused.get(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        refused.reset();
        spare.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (!spare.valid()) usleep(10000);  // the system's table is full: do not spin
      }
      if (fd >= 0) {
        clients.push_back({});
        clients.back().fd.reset(fd);
        clients.back().challenge = auth::randomBytes(16);
        Writer w;
        w.str(clients.back().challenge);
        send(clients.back(), kChallenge, w.data());
      }
    }
    for (std::size_t p = 1; p < pfds.size(); ++p) {
      if (!pfds[p].revents) continue;
      std::size_t i = owner[p];
      char buf[65536];
      ssize_t k = ::recv(clients[i].fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) { drop(i, true); continue; }
      if (k < 0) continue;
      clients[i].in.append(buf, static_cast<std::size_t>(k));
      for (;;) {
        std::string& in = clients[i].in;
        if (in.size() < 4) break;
        std::uint32_t len;
        std::memcpy(&len, in.data(), 4);
        if (len < 1 || len > kMaxFrame) { drop(i, clients[i].rank >= 0); break; }
        if (in.size() < 4 + len) break;
        std::uint8_t type = static_cast<std::uint8_t>(in[4]);
        std::string payload = in.substr(5, len - 1);
        in.erase(0, 4 + len);
        if (!handle(i, type, payload)) { drop(i, clients[i].rank >= 0 && !clients[i].left); break; }
        if (clients[i].left) break;
      }
    }
    // A client whose socket broke while we wrote to it, or that has not proved itself within
    // 10 s, is dropped (and announced, if it had joined). An announcement may break an earlier
    // one's socket: the next pass, 50 ms on at most, drops that one.
    for (std::size_t i = 0; i < clients.size(); ++i) {
      ServerClient& c = clients[i];
      if (c.left) continue;
      if (!c.fd.valid() || (c.rank < 0 && !c.observer && c.helloBy.expired())) drop(i, c.rank >= 0);
    }
    // Waits of clients that are gone can never be served.
    for (std::size_t w = 0; w < waits.size();)
      if (clients[waits[w].client].left) { waits[w] = waits.back(); waits.pop_back(); } else ++w;
  }
  // Stop listening at once (the descriptor itself is closed by its owner): a rank that comes for
  // the next communicator at this address is refused and retries, rather than waiting in a
  // backlog nobody accepts from.
  ::shutdown(listenFd, SHUT_RDWR);
  finished_ = true;
  if (listener_.exchange(kThreadDone) == kDetached) ::close(listenFd);  // detached: the thread owns the listener
}

// ---------------------------------------------------------------- client

namespace {
// One try at joining: connect, answer the store's challenge, check its proof. *retry is set when
// the store that answered cannot be this communicator's (a previous communicator's store that is
// closing, or a listener that closed before speaking): the caller connects again.
Result<net::Fd> joinOnce(const std::string& ip, int port, const std::string& secret, int rank, int nranks,
                         const Deadline& d, bool* retry) {
  const std::string where = ip + ":" + std::to_string(port);
  const std::string who = rank == kObserverRank ? "braid status" : "rank " + std::to_string(rank);
  *retry = false;
  auto fd = net::connectWithRetry(ip, port, d);
  if (!fd.ok())
    return Status::SystemError(who + " could not reach the rendezvous store at " + where + " (" +
                               fd.status().message() + "). Likely causes: MASTER_ADDR/MASTER_PORT (or the unique id) point "
                               "to the wrong place, a firewall blocks the port, or rank 0 has not started; raise BRAID_TIMEOUT "
                               "if rank 0 starts late");
  // The store speaks first: a fresh challenge. Answering it proves the secret without sending it;
  // the store's answer to ours proves the same of the store.
  std::uint8_t t = 0;
  std::string p, challenge;
  Status s = readFrame(fd->get(), &t, &p, d);
  if (!s.ok() && s.code() != Code::kTimeout) { *retry = true; return s; }  // closed before speaking
  if (s.ok() && t == kErr) {  // refused before the challenge (the store is out of descriptors)
    std::string text;
    Reader(p).str(&text);
    return Status::SystemError(who + " could not join the rendezvous at " + where + ": " + text);
  }
  if (!s.ok() || t != kChallenge || !Reader(p).str(&challenge) || challenge.size() != 16)
    return Status::RemoteError("the rendezvous at " + where + " did not open with a challenge: is it a Braid store?");
  std::string mine = auth::randomBytes(16);
  auth::Digest mac = helloMac(secret, challenge, mine, rank, nranks);
  Writer w;
  w.str(mine);
  w.i32(rank);
  w.i32(nranks);
  w.str(std::string(reinterpret_cast<const char*>(mac.data()), mac.size()));
  std::string hello = frame(kHello, w.data());
  s = net::sendAll(fd->get(), hello.data(), hello.size(), d);
  if (s.ok()) s = readFrame(fd->get(), &t, &p, d);
  if (!s.ok() && s.code() != Code::kTimeout) { *retry = true; return s; }  // the store ended meanwhile
  if (!s.ok()) return Status::Timeout("no answer from the rendezvous store at " + where + " before BRAID_TIMEOUT");
  if (t == kRetry) { *retry = true; return Status::RemoteError("the rendezvous at " + where + " serves a communicator that is closing"); }
  Reader r(p);
  std::string text;
  if (t == kErr) { r.str(&text); return Status::InvalidUsage(text).withContext("joining the rendezvous at " + where); }
  if (t != kValue || !r.str(&text)) return Status::RemoteError("the rendezvous at " + where + " answered the hello oddly");
  auth::Digest want = auth::hmacSha256(secret, "braid-store-ok" + mine + challenge), got{};
  if (text.size() != got.size()) return Status::RemoteError("the rendezvous at " + where + " answered the hello oddly");
  std::memcpy(got.data(), text.data(), got.size());
  if (!auth::equal(want, got))
    return Status::RemoteError("the rendezvous at " + where + " does not know the job's secret: another job's store?");
  return std::move(fd.value());
}
}  // namespace

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& ip, int port, const std::string& secret,
                                                          int rank, int nranks, const Deadline& d) {
  // A communicator created right after the previous one was destroyed may first meet that one's
  // store (rank 0 still waits there for slower ranks to leave): it tries again until its own
  // store answers, within the deadline.
  int backoffMs = 2;
  for (;;) {
    bool retry = false;
    auto fd = joinOnce(ip, port, secret, rank, nranks, d, &retry);
    if (fd.ok()) {
      std::unique_ptr<StoreClient> c(new StoreClient());
      c->fd_ = std::move(fd.value());
      c->endpoint_ = ip + ":" + std::to_string(port);
      return c;
    }
    if (!retry) return fd.status();
    if (d.expired())
      return Status::Timeout("rank " + std::to_string(rank) + " found only a closing rendezvous store at " + ip + ":" +
                             std::to_string(port) + " until BRAID_TIMEOUT (" + fd.status().message() +
                             "): the previous communicator's ranks did not all leave it, or its host never started the next one");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoffMs, d.msLeft())));
    backoffMs = std::min(backoffMs * 2, 100);
  }
}

Result<std::unique_ptr<StoreClient>> StoreClient::observe(const std::string& ip, int port, const std::string& secret,
                                                          const Deadline& d) {
  bool retry = false;
  auto fd = joinOnce(ip, port, secret, kObserverRank, 0, d, &retry);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->fd_ = std::move(fd.value());
  c->endpoint_ = ip + ":" + std::to_string(port);
  return c;
}

Result<StatusReply> StoreClient::queryStatus(const Deadline& d) {
  const std::string raw = auth::randomBytes(8), id = auth::toHex(raw.data(), raw.size());
  Writer w;
  w.str(id);
  auto states = request(kStatusQuery, w.data(), d);
  if (!states.ok()) return states.status();
  StatusReply reply;
  int waiting = 0;
  for (char c : *states) {
    reply.ranks.push_back(static_cast<StatusReply::RankState>(std::min<std::uint8_t>(static_cast<std::uint8_t>(c), 3)));
    waiting += reply.ranks.back() == StatusReply::kConnected;
  }
  reply.answers.assign(reply.ranks.size(), "");
  // Answers carry the query's id on their first line (a late answer to an earlier query is skipped).
  while (waiting > 0) {
    std::uint8_t t;
    std::string p;
    Notice n;
    Status s = readFrame(fd_.get(), &t, &p, d);
    if (s.code() == Code::kTimeout) break;
    if (!s.ok()) return Status::RemoteError("the rendezvous store at " + endpoint_ + " went away during the status query (" + s.message() + ")");
    if (t != kNotice || !decodeNotice(p, &n) || n.kind != Notice::kStatusAnswer) continue;
    const std::size_t nl = n.message.find('\n');
    if (nl == std::string::npos || n.message.compare(0, nl, id) != 0 || n.rank < 0 ||
        n.rank >= static_cast<int>(reply.answers.size()) || !reply.answers[static_cast<std::size_t>(n.rank)].empty())
      continue;
    reply.answers[static_cast<std::size_t>(n.rank)] = n.message.substr(nl + 1);
    --waiting;
  }
  return reply;
}

StoreClient::~StoreClient() { close(); }

Status StoreClient::nextFrame(std::uint8_t* type, std::string* payload, const Deadline& d) {
  if (!watching_) return readFrame(fd_.get(), type, payload, d);
  std::unique_lock<std::mutex> g(replyMu_);
  while (replies_.empty() && gone_.empty())
    if (replyCv_.wait_until(g, d.at()) == std::cv_status::timeout && replies_.empty()) return Status::Timeout("no frame");
  if (replies_.empty()) return Status::RemoteError(gone_);
  *type = replies_.front().first;
  *payload = std::move(replies_.front().second);
  replies_.pop_front();
  return Status::Ok();
}

Result<std::string> StoreClient::request(std::uint8_t type, const std::string& payload, const Deadline& d) {
  std::unique_lock<std::mutex> one(requestMu_, std::defer_lock);
  if (watching_) {
    one.lock();
    std::lock_guard<std::mutex> g(replyMu_);
    replies_.clear();
    awaiting_ = true;
  }
  struct Done {
    StoreClient* c;
    ~Done() {
      if (!c->watching_) return;
      std::lock_guard<std::mutex> g(c->replyMu_);
      c->awaiting_ = false;
    }
  } done{this};
  {
    std::lock_guard<std::mutex> g(writeMu_);
    std::string f = frame(type, payload);
    Status s = net::sendAll(fd_.get(), f.data(), f.size(), d);
    if (!s.ok()) return s.withContext("rendezvous store at " + endpoint_);
  }
  // A notice (another rank failed) is kept for the watcher, and the reply is still awaited: a set or
  // add is always answered, and a get or wait usually is too (the failure may have come just after
  // every rank passed the last setup barrier). A get or wait that stays unanswered for a short
  // grace after a notice fails with that notice instead of running into BRAID_TIMEOUT.
  Deadline waitUntil = d;
  for (;;) {
    std::uint8_t t;
    std::string p;
    Status s = nextFrame(&t, &p, waitUntil);
    if (!s.ok() && !early_.empty()) {  // unanswered, or the store went away: the notice is the cause
      return failureOf(early_.front(), !watching_);
    }
    if (s.code() == Code::kTimeout) return Status::Timeout("no answer from the rendezvous store at " + endpoint_ + " before BRAID_TIMEOUT: some rank has not arrived");
    if (!s.ok()) return Status::RemoteError("the rendezvous store at " + endpoint_ + " went away (" + s.message() + "): rank 0 or the process that created the unique id exited");
    if (t == kNotice) {
      Notice n;
      if (!decodeNotice(p, &n)) return Status::RemoteError("malformed notice from the store");
      if (n.kind == Notice::kStatusQuery) answerInSetup(n);
      if (n.kind == Notice::kStatusQuery || n.kind == Notice::kStatusAnswer) continue;  // no failure
      early_.push_back(n);
      if (type == kGet || type == kWaitGe || type == kMultiGet) {
        Deadline grace = Deadline::after(1.0);
        if (grace.at() < waitUntil.at()) waitUntil = grace;
      }
      continue;
    }
    Reader r(p);
    std::string text;
    if (t == kErr) { r.str(&text); return Status::InvalidUsage(text); }
    if (t == kValue && type == kMultiGet) return p;  // the values, as getMany reads them
    if (t == kValue) { if (!r.str(&text)) return Status::Internal("malformed store value"); return text; }
    if (t == kOk) return std::string();
    return Status::Internal("unexpected frame from the store");
  }
}

Status StoreClient::set(const std::string& key, const std::string& value, const Deadline& d) {
  Writer w;
  w.str(key);
  w.str(value);
  return request(kSet, w.data(), d).status();
}

Result<std::string> StoreClient::get(const std::string& key, const Deadline& d) {
  Writer w;
  w.str(key);
  return request(kGet, w.data(), d);
}

Result<std::vector<std::string>> StoreClient::getMany(const std::vector<std::string>& keys, const Deadline& d) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (std::size_t first = 0; first < keys.size(); first += kMultiGetKeys) {
    const std::size_t count = std::min<std::size_t>(kMultiGetKeys, keys.size() - first);
    Writer w;
    w.u32(static_cast<std::uint32_t>(count));
    for (std::size_t k = first; k < first + count; ++k) w.str(keys[k]);
    auto reply = request(kMultiGet, w.data(), d);
    if (!reply.ok()) return reply.status();
    Reader r(*reply);
    std::uint32_t n = 0;
    if (!r.u32(&n) || n != count) return Status::Internal("malformed multi-get answer from the store");
    for (std::uint32_t k = 0; k < n; ++k) {
      std::string v;
      if (!r.str(&v)) return Status::Internal("malformed multi-get answer from the store");
      out.push_back(std::move(v));
    }
  }
  return out;
}

Result<std::int64_t> StoreClient::add(const std::string& key, std::int64_t delta, const Deadline& d) {
  Writer w;
  w.str(key);
  w.i64(delta);
  auto r = request(kAdd, w.data(), d);
  if (!r.ok()) return r.status();
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(r->data(), r->data() + r->size(), v);
  if (ec != std::errc() || end != r->data() + r->size()) return Status::Internal("malformed counter from the store");
  return v;
}

Status StoreClient::waitAtLeast(const std::string& key, std::int64_t n, const Deadline& d) {
  Writer w;
  w.str(key);
  w.i64(n);
  return request(kWaitGe, w.data(), d).status();
}

Status StoreClient::barrier(const std::string& name, int nranks, const Deadline& d) {
  auto r = add(name, 1, d);
  if (!r.ok()) return r.status();
  return waitAtLeast(name, nranks, d);
}

void StoreClient::startWatching(std::function<void(const Notice&)> onNotice) {
  for (const Notice& n : early_) onNotice(n);
  early_.clear();
  watching_ = true;
  watcher_ = std::thread([this, onNotice = std::move(onNotice)] {
    auto end = [&](const std::string& why) {
      std::lock_guard<std::mutex> g(replyMu_);
      gone_ = why;
      replyCv_.notify_all();
    };
    for (;;) {
      if (extraFd_ >= 0) {  // the store's connection, and the other descriptor this thread serves
        pollfd p[2] = {{fd_.get(), POLLIN, 0}, {extraFd_, POLLIN, 0}};
        if (::poll(p, 2, -1) < 0 && errno != EINTR) extraFd_ = -1;
        if (p[1].revents & POLLIN) onExtra_();
        if (!p[0].revents && !closing_) continue;
      }
      std::uint8_t t;
      std::string p;
      Status s = readFrame(fd_.get(), &t, &p, Deadline::after(1e9));
      if (closing_) return end("the communicator is closing");
      if (!s.ok()) {
        const std::string lost = "lost the connection to the rendezvous store at " + endpoint_ +
                                 ": the process hosting it (rank 0, braid run's launcher on node 0, or the one that created the "
                                 "unique id) exited";
        end(lost);
        onNotice({Notice::kStoreLost, -1, Code::kRemoteError, lost});
        return;
      }
      Notice n;
      const bool notice = t == kNotice && decodeNotice(p, &n);
      if (notice && n.kind == Notice::kStatusQuery) {  // answered here, and no request's business
        onNotice(n);
        continue;
      }
      {
        // A request's answer, or a notice it should hear of (it then stops waiting soon).
        std::lock_guard<std::mutex> g(replyMu_);
        if (awaiting_) {
          replies_.emplace_back(t, p);
          replyCv_.notify_all();
        }
      }
      if (notice) onNotice(n);
    }
  });
}

bool StoreClient::readNotice(const Deadline& d, Status* failure) {
  if (!early_.empty()) {
    *failure = failureOf(early_.front());
    return true;
  }
  if (d.expired()) return false;  // only asked about notices already read
  std::uint8_t t;
  std::string p;
  Notice n;
  Status s = readFrame(fd_.get(), &t, &p, d);
  if (!s.ok() && s.code() == Code::kTimeout) return false;
  // A status query in set-up is answered as such: it is no failure, and nothing else came with it.
  if (s.ok() && t == kNotice && decodeNotice(p, &n) && n.kind == Notice::kStatusQuery) {
    answerInSetup(n);
    return false;
  }
  if (!s.ok())
    *failure = Status::RemoteError("the rendezvous store at " + endpoint_ + " went away (" + s.message() +
                                   "): rank 0 or the process that created the unique id exited");
  else if (t != kNotice || !decodeNotice(p, &n))
    *failure = Status::Internal("unexpected frame from the store during set-up");
  else
    early_.push_back(n), *failure = failureOf(n);
  return true;
}

void StoreClient::answerInSetup(const Notice& query) {
  report({Notice::kStatusAnswer, -1, Code::kRemoteError, query.message + "\n{\"setup\": true}"});
}

void StoreClient::report(const Notice& n) {
  std::lock_guard<std::mutex> g(writeMu_);
  std::string f = frame(kReport, encodeNotice(n));
  (void)net::sendAll(fd_.get(), f.data(), f.size(), Deadline::after(1));
}

void StoreClient::close() {
  if (closing_.exchange(true)) return;
  if (fd_.valid()) {
    {
      std::lock_guard<std::mutex> g(writeMu_);
      std::string f = frame(kBye, "");
      (void)net::sendAll(fd_.get(), f.data(), f.size(), Deadline::after(1));
    }
    ::shutdown(fd_.get(), SHUT_RDWR);  // wakes the watcher
  }
  if (watcher_.joinable()) watcher_.join();
  fd_.reset();
}

}  // namespace braid
