// The set-up tree's wire: a child connects to its parent once it holds its whole subtree's entries;
// the two prove the job's secret to each other (HMAC-SHA-256 over each other's fresh challenge,
// bound to the communicator and both ranks); the child sends its subtree's entries, then waits for
// the whole roster, which it passes on to its own children. A connection that does not prove
// itself within a few seconds is dropped and the parent goes on waiting for its real children.
#include "comm/bootstrap/roster.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/auth.h"
#include "base/fdlimit.h"
#include "base/log.h"
#include "comm/bootstrap/store.h"
#include "comm/bootstrap/wire_codec.h"

namespace braid {
namespace {

constexpr std::size_t kChallengeBytes = 16;
constexpr std::uint32_t kMagic = 0x54525242;  // "BRRT"
constexpr std::uint32_t kMaxEntryBytes = 64u << 10;
constexpr double kStrangerSec = 5;  // how long an accepted connection has to prove itself

auth::Digest proof(const std::string& secret, const char* role, const std::string& nonce, const std::string& challenge,
                   int child, int parent) {
  Writer w;
  w.str(nonce);
  w.str(challenge);
  w.i32(child);
  w.i32(parent);
  return auth::hmacSha256(secret, std::string("braid-roster-") + role + w.data());
}

// The store, watched while the tree waits: a notice (another rank failed or left) ends any wait at
// once with its cause, and `noticed` says the failure came from there (not to be reported again).
struct Watch {
  StoreClient& store;
  bool noticed = false;

  // The failure a notice names, once one has come (also during an earlier request); Ok before.
  Status notice(double waitSec) {
    Status failure = Status::Ok();
    if (store.readNotice(Deadline::after(0), &failure)) {
      noticed = true;
      return failure;
    }
    // (a frame that was no failure, a status query, leaves the rest of the time to wait)
    const Deadline until = Deadline::after(waitSec);
    do {
      pollfd p{store.noticeFd(), POLLIN, 0};
      if (::poll(&p, 1, until.msLeft()) <= 0) break;
      if (store.readNotice(Deadline::after(5), &failure)) {
        noticed = true;
        break;
      }
    } while (!until.expired());
    return failure;
  }
  // A connection that broke usually broke because its rank failed: the store's notice of that, if
  // it comes within a second, is the cause to give.
  Status causeOf(const Status& broken) {
    Status s = notice(1);
    return noticed ? s : broken;
  }
};

// Waits until `fd` is ready for `events`: Timeout (naming `what`) once the deadline passes.
Status await(int fd, short events, const Deadline& d, Watch& w, const std::string& what) {
  Status early = w.notice(0);  // also one read during an earlier request; later ones wake the poll
  if (w.noticed) return early;
  for (;;) {
    if (d.expired()) return Status::Timeout(what + ": nothing came within BRAID_TIMEOUT");
    pollfd p[2] = {{fd, events, 0}, {w.store.noticeFd(), POLLIN, 0}};
    int k = ::poll(p, 2, std::max(0, std::min(d.msLeft(), 1000)));
    if (k < 0 && errno != EINTR) return Status::SystemError("poll: " + net::errnoText(errno));
    if (k > 0 && p[1].revents) {
      Status s = w.notice(0);
      if (w.noticed) return s;
    }
    if (k > 0 && p[0].revents) return Status::Ok();
  }
}

// Reads what is there without waiting: false once the connection is closed or broken.
bool readSome(int fd, std::string& buf, std::size_t want, std::string* error) {
  while (buf.size() < want) {
    char chunk[64 << 10];
    ssize_t k = ::recv(fd, chunk, std::min(sizeof(chunk), want - buf.size()), MSG_DONTWAIT);
    if (k > 0) {
      buf.append(chunk, static_cast<std::size_t>(k));
      continue;
    }
    if (k == 0) *error = "the connection was closed";
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) *error = net::errnoText(errno);
    else return true;
    return false;
  }
  return true;
}

Status recvExact(int fd, std::string& buf, std::size_t n, const Deadline& d, Watch& w, const std::string& what) {
  buf.clear();
  std::string error;
  while (buf.size() < n) {
    if (!readSome(fd, buf, n, &error)) return w.causeOf(Status::RemoteError(what + ": " + error));
    if (buf.size() == n) break;
    Status s = await(fd, POLLIN, d, w, what);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status sendExact(int fd, const std::string& bytes, const Deadline& d, Watch& w, const std::string& what) {
  const char* p = bytes.data();
  std::size_t n = bytes.size();
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return w.causeOf(Status::RemoteError(what + ": " + net::errnoText(errno)));
    Status s = await(fd, POLLOUT, d, w, what);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

std::string lengthPrefixed(const std::string& payload) {
  Writer w;
  w.u32(static_cast<std::uint32_t>(payload.size()));
  return w.data() + payload;
}

Result<std::string> recvFrame(int fd, std::size_t limit, const Deadline& d, Watch& w, const std::string& what) {
  std::string len;
  Status s = recvExact(fd, len, 4, d, w, what);
  if (!s.ok()) return s;
  std::uint32_t n = 0;
  std::memcpy(&n, len.data(), 4);
  if (n > limit) return Status::RemoteError(what + ": a frame of " + std::to_string(n) + " bytes (at most " + std::to_string(limit) + ")");
  std::string payload;
  s = recvExact(fd, payload, n, d, w, what);
  if (!s.ok()) return s;
  return payload;
}

bool inSubtreeOf(int rank, int top) {
  while (rank > top) rank = RosterTree::parentOf(rank);
  return rank == top;
}

std::size_t frameLimit(int nranks) { return static_cast<std::size_t>(nranks) * (kMaxEntryBytes + 8) + 8; }

// Levels of the tree below `rank` (its leftmost path is its deepest).
int heightOf(int rank, int nranks) {
  int h = 0;
  for (long c = rank; c * RosterTree::kFanOut + 1 < nranks; c = c * RosterTree::kFanOut + 1) ++h;
  return h;
}

// The rank nearest a missing one gives up first: a rank at height h (levels below it) waits for
// its children, and tries its parent, until BRAID_TIMEOUT plus h x kLevelGraceSec, and every rank
// waits for the roster from above a level longer than rank 0 would. So a child that cannot reach
// its parent says so before the parent gives up on it, the parent of a rank that never came names
// it, and that notice reaches every other rank before their own waits end (blaming a neighbour).
constexpr double kLevelGraceSec = 1;
Deadline extended(const Deadline& d, int levels) {
  if (levels <= 0) return d;
  return Deadline::after(d.msLeft() / 1000.0 + kLevelGraceSec * levels);
}

}  // namespace

std::vector<int> RosterTree::childrenOf(int rank, int nranks) {
  std::vector<int> out;
  for (long c = static_cast<long>(rank) * kFanOut + 1; c <= static_cast<long>(rank) * kFanOut + kFanOut && c < nranks; ++c)
    out.push_back(static_cast<int>(c));
  return out;
}

Result<std::unique_ptr<RosterTree>> RosterTree::listen(const std::string& bindIp, const std::string& advertisedIp,
                                                       bool hasChildren) {
  std::unique_ptr<RosterTree> t(new RosterTree());
  if (!hasChildren) return t;
  auto fd = net::listenOn(bindIp, 0);
  if (!fd.ok()) return fd.status().withContext("the set-up tree's listener");
  t->listener_ = std::move(fd.value());
  t->address_ = advertisedIp + ":" + std::to_string(net::localPort(t->listener_.get()));
  return t;
}

namespace {

constexpr std::size_t kHelloBytes = 4 + 4 + kChallengeBytes;  // magic, the child's rank, its challenge

// An accepted connection on its way to being a child: its hello, its proof, then its subtree's
// entries (a length, then the bytes). Until it has proved itself it has kStrangerSec.
struct Incoming {
  net::Fd fd;
  enum Stage { kHello, kProof, kLength, kEntries } stage = kHello;
  std::string buf;
  std::size_t want = kHelloBytes;
  int child = -1;
  std::size_t slot = 0;
  std::string challenge;  // this rank's, which the child's proof answers
  Deadline until = Deadline::after(kStrangerSec);
};

Result<std::vector<std::string>> gather(const RosterTree::Job& job, const std::string& mine,
                                        const std::function<Result<std::string>()>& parentAddress, Watch& w,
                                        net::Fd& listenerFd, const std::string& address) {
  const int listener = listenerFd.get();
  const int n = job.nranks, me = job.rank;
  const std::string who = "rank " + std::to_string(me);
  if (mine.empty() || mine.size() > kMaxEntryBytes)
    return Status::Internal(who + "'s roster entry has " + std::to_string(mine.size()) + " bytes");
  std::vector<std::string> roster(static_cast<std::size_t>(n));
  roster[static_cast<std::size_t>(me)] = mine;
  std::size_t have = 1;

  // Up: each child, as it connects with its whole subtree, in whatever order they come. Accepted
  // connections are served side by side, so strangers that connect and stall hold up nobody.
  const std::vector<int> children = RosterTree::childrenOf(me, n);
  std::vector<net::Fd> childFd(children.size());
  std::vector<char> claimed(children.size(), 0);  // proved itself
  std::vector<Incoming> pending;
  std::size_t joined = 0, strangers = 0;
  if (!children.empty()) net::setNonBlocking(listener, true);
  const Deadline childrenBy = extended(job.deadline, heightOf(me, n));  // and the parent, after
  Status early = w.notice(0);  // also one read during an earlier request; later ones wake the poll
  if (w.noticed) return early;
  while (joined < children.size()) {
    if (childrenBy.expired()) {
      std::string missing;
      for (std::size_t i = 0; i < children.size(); ++i)
        if (!childFd[i].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(children[i]);
      return Status::Timeout(who + " waited for rank(s) " + missing + " (its children in the set-up tree) to bring "
                             "their ranks' entries within BRAID_TIMEOUT: are they running, and can they reach " +
                             address + " (BRAID_SOCKET_IFNAME, firewalls)?");
    }
    std::vector<pollfd> pfds{{listener, POLLIN, 0}, {w.store.noticeFd(), POLLIN, 0}};
    for (const Incoming& q : pending) pfds.push_back({q.fd.get(), POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), std::max(0, std::min(childrenBy.msLeft(), 100))) < 0 && errno != EINTR)
      return Status::SystemError(who + "'s set-up tree: poll: " + net::errnoText(errno));
    if (pfds[1].revents) {
      Status s = w.notice(0);
      if (w.noticed) return s;
    }
    std::vector<char> drop(pending.size(), 0);
    for (std::size_t i = 0; i < pending.size(); ++i) {
      Incoming& q = pending[i];
      std::string error;
      const std::string from = who + " reading the entries of rank " + std::to_string(q.child) +
                               "'s subtree (its child in the set-up tree)";
      if (pfds[i + 2].revents && !readSome(q.fd.get(), q.buf, q.want, &error)) {
        if (q.stage >= Incoming::kLength) return w.causeOf(Status::RemoteError(from + ": " + error));
        drop[i] = 1;
        continue;
      }
      while (!drop[i] && q.buf.size() == q.want) {
        if (q.stage == Incoming::kHello) {
          std::uint32_t magic = 0;
          std::memcpy(&magic, q.buf.data(), 4);
          std::memcpy(&q.child, q.buf.data() + 4, 4);
          const auto at = std::find(children.begin(), children.end(), q.child);
          q.slot = static_cast<std::size_t>(at - children.begin());
          if (magic != kMagic || at == children.end() || claimed[q.slot]) { drop[i] = 1; break; }
          q.challenge = auth::randomBytes(kChallengeBytes);
          auth::Digest p = proof(job.secret, "parent", job.commNonce, q.buf.substr(8), q.child, me);
          const std::string answer = q.challenge + std::string(reinterpret_cast<const char*>(p.data()), p.size());
          if (::send(q.fd.get(), answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
              static_cast<ssize_t>(answer.size())) { drop[i] = 1; break; }
          q.stage = Incoming::kProof;
          q.want = 32;
        } else if (q.stage == Incoming::kProof) {
          auth::Digest theirs{};
          std::memcpy(theirs.data(), q.buf.data(), theirs.size());
          if (claimed[q.slot] || !auth::equal(theirs, proof(job.secret, "child", job.commNonce, q.challenge, q.child, me))) {
            drop[i] = 1;
            break;
          }
          claimed[q.slot] = 1;
          q.stage = Incoming::kLength;
          q.want = 4;
          q.until = childrenBy;
        } else if (q.stage == Incoming::kLength) {
          std::uint32_t len = 0;
          std::memcpy(&len, q.buf.data(), 4);
          if (len > frameLimit(n)) return Status::RemoteError(from + ": a frame of " + std::to_string(len) + " bytes");
          q.stage = Incoming::kEntries;
          q.want = len;
        } else {
          Reader r(q.buf);
          std::uint32_t count = 0;
          if (!r.u32(&count) || count > static_cast<std::uint32_t>(n)) return Status::RemoteError(from + ": malformed");
          for (std::uint32_t k = 0; k < count; ++k) {
            std::int32_t rank = -1;
            std::string entry;
            if (!r.i32(&rank) || !r.str(&entry) || rank < 0 || rank >= n || !inSubtreeOf(rank, q.child) ||
                entry.empty() || !roster[static_cast<std::size_t>(rank)].empty())
              return Status::RemoteError(from + ": malformed, or an entry for rank " + std::to_string(rank) +
                                         " that is not in its subtree");
            roster[static_cast<std::size_t>(rank)] = std::move(entry);
            ++have;
          }
          childFd[q.slot] = std::move(q.fd);
          ++joined;
          drop[i] = 1;
          break;
        }
        q.buf.clear();
        if (pfds[i + 2].revents && !readSome(q.fd.get(), q.buf, q.want, &error)) {
          if (q.stage >= Incoming::kLength) return w.causeOf(Status::RemoteError(from + ": " + error));
          drop[i] = 1;
        }
      }
      if (!drop[i] && q.stage < Incoming::kLength && q.until.expired()) drop[i] = 1;  // silent for too long
      if (drop[i] && q.fd.valid() && ++strangers == 1)
        BRAID_LOG(kWarn, kNet, "%s's set-up tree: dropped a connection that did not prove this job's secret", who.c_str());
    }
    for (std::size_t i = pending.size(); i-- > 0;)
      if (drop[i]) {
        pending[i] = std::move(pending.back());
        pending.pop_back();
      }
    if (pfds[0].revents & POLLIN)
      for (int k = 0; k < 4096; ++k) {
        int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && fdlimit::exhausted(errno))
          return Status::SystemError(who + " could not accept its children in the set-up tree: " + fdlimit::exhaustedText(errno));
        if (fd < 0) break;  // nothing more queued
        Incoming q;
        q.fd.reset(fd);
        net::setNoDelay(fd);
        pending.push_back(std::move(q));
      }
  }
  pending.clear();
  listenerFd.reset();  // every child is here: nobody else may connect
  if (strangers > 1)
    BRAID_LOG(kWarn, kNet, "%s's set-up tree dropped %zu connections that did not prove this job's secret", who.c_str(), strangers);

  // To the parent with this subtree; the whole roster back.
  if (me != 0) {
    const int parent = RosterTree::parentOf(me);
    const std::string to = who + " sending its subtree's entries to rank " + std::to_string(parent) +
                           " (its parent in the set-up tree)";
    auto addr = parentAddress();
    if (!addr.ok()) return addr.status();
    const std::size_t colon = addr->rfind(':');
    if (colon == std::string::npos) return Status::Internal(to + ": bad address " + *addr);
    Status noticed = Status::Ok();
    auto fd = net::connectWithRetry(addr->substr(0, colon), std::atoi(addr->c_str() + colon + 1), childrenBy, [&] {
      noticed = w.notice(0);
      return w.noticed;
    });
    if (w.noticed) return noticed;
    if (!fd.ok())
      return Status(fd.status().code(), who + " could not connect to rank " + std::to_string(parent) +
                                            " (its parent in the set-up tree) at " + *addr + ": " + fd.status().message() +
                                            "; check BRAID_SOCKET_IFNAME and firewalls between the hosts");
    net::setNoDelay(fd->get());
    Writer hello;
    hello.u32(kMagic);
    hello.i32(me);
    const std::string challenge = auth::randomBytes(kChallengeBytes);
    Status s = sendExact(fd->get(), hello.data() + challenge, childrenBy, w, to);
    std::string answer;
    if (s.ok()) s = recvExact(fd->get(), answer, kChallengeBytes + 32, childrenBy, w, to);
    if (!s.ok()) return s;
    auth::Digest theirs{};
    std::memcpy(theirs.data(), answer.data() + kChallengeBytes, theirs.size());
    if (!auth::equal(theirs, proof(job.secret, "parent", job.commNonce, challenge, me, parent)))
      return Status::RemoteError(to + " at " + *addr + ": it did not prove this job's secret");
    auth::Digest p = proof(job.secret, "child", job.commNonce, answer.substr(0, kChallengeBytes), me, parent);
    Writer up;
    up.u32(static_cast<std::uint32_t>(have));
    for (int r = 0; r < n; ++r)
      if (!roster[static_cast<std::size_t>(r)].empty()) {
        up.i32(r);
        up.str(roster[static_cast<std::size_t>(r)]);
      }
    s = sendExact(fd->get(), std::string(reinterpret_cast<const char*>(p.data()), p.size()) + lengthPrefixed(up.data()),
                  childrenBy, w, to);
    if (!s.ok()) return s;
    const std::string down = who + " waiting for every rank's entry from rank " + std::to_string(parent) +
                             " (its parent in the set-up tree)";
    auto all = recvFrame(fd->get(), frameLimit(n), extended(job.deadline, heightOf(0, n) + 1), w, down);
    if (!all.ok()) return all.status();
    Reader r(*all);
    std::uint32_t count = 0;
    if (!r.u32(&count) || count != static_cast<std::uint32_t>(n)) return Status::RemoteError(down + ": malformed");
    for (std::string& entry : roster)
      if (!r.str(&entry) || entry.empty()) return Status::RemoteError(down + ": malformed");
  } else if (have != static_cast<std::size_t>(n)) {
    return Status::Internal(who + " gathered " + std::to_string(have) + " of " + std::to_string(n) + " ranks' entries");
  }

  // Down: the whole roster to each child.
  if (!children.empty()) {
    Writer all;
    all.u32(static_cast<std::uint32_t>(n));
    for (const std::string& entry : roster) all.str(entry);
    const std::string frame = lengthPrefixed(all.data());
    for (std::size_t i = 0; i < children.size(); ++i) {
      Status s = sendExact(childFd[i].get(), frame, extended(job.deadline, heightOf(0, n) + 1), w,
                           who + " sending every rank's entry to rank " + std::to_string(children[i]) +
                               " (its child in the set-up tree)");
      if (!s.ok()) return s;
    }
  }
  return roster;
}

}  // namespace

Result<std::vector<std::string>> RosterTree::allGather(const Job& job, const std::string& mine,
                                                       const std::function<Result<std::string>()>& parentAddress,
                                                       StoreClient& store) {
  Watch w{store};
  auto out = gather(job, mine, parentAddress, w, listener_, address_);
  // A failure of this rank's own (not a notice of another's) goes to every rank through the store,
  // so that they stop now, with its words, instead of at BRAID_TIMEOUT.
  if (!out.ok() && !w.noticed) store.report({Notice::kError, job.rank, out.status().code(), out.status().message()});
  listener_.reset();
  return out;
}

}  // namespace braid
