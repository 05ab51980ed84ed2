// The rendezvous store: a small key-value server (c10d's vocabulary: set, get, add, wait) that runs
// in rank 0, in braid run's launcher on node 0, or in the process that called braidGetUniqueId, and doubles as the control plane after
// setup: a rank reports a failure once and the store tells every other rank, and a rank whose
// connection drops without saying goodbye is announced as gone. Frames are length-prefixed and
// bounded (kMaxFrame); anything malformed drops that connection only.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "braid/status.hpp"
#include "base/deadline.h"
#include "base/exchange.h"
#include "base/socket.h"

namespace braid {

inline constexpr std::uint32_t kMaxFrame = 1 << 20;

// A failure notice pushed by the store to every rank.
struct Notice {
  // kTimedOut: the rank gave up waiting (not a failure of its own; see Comm::explainTimeout).
  // kStatusQuery: an observer (braid status) asks every rank what it is doing; the message is the
  // query's id. kStatusAnswer: a rank's answer (the message is its record), which the store
  // passes to the observers only. Neither is a failure, and the store keeps neither.
  // kStoreLost: the watcher's own word that the store's connection broke (never on the wire).
  enum Kind : int { kPeerGone = 1, kError = 2, kTimedOut = 3, kStatusQuery = 4, kStatusAnswer = 5, kStoreLost = 6 } kind = kError;
  int rank = -1;       // the rank that is gone, or that reported the error
  Code code = Code::kRemoteError;
  std::string message;
};

class StoreServer {
 public:
  // Listens on ip:port (port 0 picks one). Only clients that prove they know `secret` (HMAC-SHA-256
  // over a fresh challenge, base/auth.h) are admitted; the secret never crosses the wire.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& ip, int port, const std::string& secret);
  ~StoreServer();
  int port() const { return port_; }
  bool finished() const { return finished_; }  // every rank left (or stop): no longer serving
  // Requests served so far (every frame a client sent: hello, set, get, multi-get, add, ...).
  std::int64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  // Ranks that have said hello so far (observers aside).
  int ranksJoined() const { return joined_.load(std::memory_order_relaxed); }
  // Bytes of those frames and of every answer and notice it sent.
  std::int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  // The same for this process's detached store of `nonce` (unique-id mode); -1 if there is none.
  static std::int64_t requestsOfDetached(const std::string& nonce);
  static std::int64_t bytesOfDetached(const std::string& nonce);
  // Serves until every rank that said hello has left, or the deadline passes, then stops.
  void waitUntilAllLeft(const Deadline& d);
  // Lets the server thread run on its own and end when every rank has left (unique-id mode).
  void detach();
  // Unique-id mode: if this process runs the detached store for `nonce`, waits (bounded) until
  // every rank has left it, so that exiting does not pull the store from under ranks that are
  // still finishing their last collective. Returns at once otherwise.
  static void waitForDetached(const std::string& nonce, const Deadline& d);

 private:
  StoreServer() = default;
  void serve(int listenFd);  // the fd is passed in: detach() may release listen_ meanwhile
  net::Fd listen_;
  int port_ = 0;
  std::string nonce_;  // the job's secret
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::atomic<std::int64_t> requests_{0};
  std::atomic<std::int64_t> bytes_{0};
  std::atomic<int> joined_{0};
  // Who closes the listener: the object (listen_, kOwned), the detached thread (kDetached), or
  // nobody yet because the thread ended first (kThreadDone: detach() closes it). Changed only by
  // exchange, so the thread never reads listen_ while detach() releases it.
  enum : int { kOwned, kDetached, kThreadDone };
  std::atomic<int> listener_{kOwned};
  std::thread thread_;
};

// What an observer's status query found (StoreClient::queryStatus).
struct StatusReply {
  enum RankState : std::uint8_t { kNeverJoined = 0, kConnected = 1, kLeft = 2, kGone = 3 };
  std::vector<RankState> ranks;         // per rank, as the store sees its connection
  std::vector<std::string> answers;     // per rank, its record ("" if it did not answer in time)
};

class StoreClient final : public Exchange {
 public:
  // An observer (braid status): proves the job's secret like a rank but is no rank. It may read
  // keys and query the ranks' status; the store announces nothing of it.
  static Result<std::unique_ptr<StoreClient>> observe(const std::string& ip, int port, const std::string& secret, const Deadline& d);
  // Observer only: asks every connected rank for its record and collects the answers that come
  // before the deadline (a rank answers from its watcher thread, or, still in set-up, says so; one
  // that is stopped or hung does not, and is not asked again until it has answered).
  Result<StatusReply> queryStatus(const Deadline& d);
  // Connects (retrying until the deadline) and introduces itself as `rank` of `nranks`.
  static Result<std::unique_ptr<StoreClient>> connect(const std::string& ip, int port, const std::string& secret,
                                                      int rank, int nranks, const Deadline& d);
  ~StoreClient();

  Status set(const std::string& key, const std::string& value, const Deadline& d) override;
  Result<std::string> get(const std::string& key, const Deadline& d) override;        // waits for the key
  // Waits for every key and returns their values in order: one request per 1,024 keys.
  Result<std::vector<std::string>> getMany(const std::vector<std::string>& keys, const Deadline& d);
  Result<std::int64_t> add(const std::string& key, std::int64_t delta, const Deadline& d);
  Status waitAtLeast(const std::string& key, std::int64_t n, const Deadline& d);
  // Every rank adds itself to `name` and waits for all nranks.
  Status barrier(const std::string& name, int nranks, const Deadline& d);

  // After setup: a thread reads notices and hands each to `onNotice` until close(). Notices that
  // arrived during a set or add (another rank failed right after setup) are handed over first.
  // Requests still work (a transport connecting peers on first use trades names through the
  // store): the thread hands their answers over, one request at a time.
  void startWatching(std::function<void(const Notice&)> onNotice);
  // Before startWatching: the watcher also waits on `fd` and calls `onReadable` when it turns
  // readable (a rank's metrics listener: served from this thread, which is otherwise idle).
  void serveAlso(int fd, std::function<void()> onReadable) {
    extraFd_ = fd;
    onExtra_ = std::move(onReadable);
  }
  // During set-up, between requests: the descriptor that turns readable when the store sends a
  // notice (another rank failed or left), and reading it. A wait elsewhere (the set-up tree) polls
  // it so that it ends with the cause at once. True, with the failure the notice names (kept for
  // the watcher too), once a notice has come, also during an earlier request, or the store went
  // away; false if nothing came before the deadline (an expired one: only notices read earlier).
  int noticeFd() const { return fd_.get(); }
  bool readNotice(const Deadline& d, Status* failure);
  // Tells the store (and through it every rank) about a failure. Thread-safe; never blocks long.
  void report(const Notice& n);
  // A status query that came while this rank is still in set-up: answered "in set-up".
  void answerInSetup(const Notice& query);
  // Clean goodbye: the store will not announce this rank as gone.
  void close();

 private:
  StoreClient() = default;
  Result<std::string> request(std::uint8_t type, const std::string& payload, const Deadline& d);
  // The next frame for a request: read here during set-up, handed over by the watcher after.
  Status nextFrame(std::uint8_t* type, std::string* payload, const Deadline& d);
  net::Fd fd_;
  std::atomic<bool> watching_{false};
  std::mutex requestMu_;  // after set-up: one request at a time
  std::mutex replyMu_;
  std::condition_variable replyCv_;
  std::deque<std::pair<std::uint8_t, std::string>> replies_;  // frames for the request waiting
  bool awaiting_ = false;  // a request waits for its answer (under replyMu_)
  std::string gone_;       // the watcher's connection ended: why (under replyMu_)
  std::vector<Notice> early_;  // notices that arrived while a set/add waited for its reply
  std::mutex writeMu_;
  std::thread watcher_;
  int extraFd_ = -1;
  std::function<void()> onExtra_;
  std::atomic<bool> closing_{false};
  std::string endpoint_;
};

}  // namespace braid
