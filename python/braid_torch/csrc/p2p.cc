#include "p2p.h"

#include <pybind11/pybind11.h>  // gil_scoped_release (flush)

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <set>
#include <utility>

#include "tensors.h"

namespace braid::torch_backend {
namespace {

// A manifest is one fixed-size int64 message: [n, more, (tag, count, dtype) x kPerManifest]; a
// flush that sends a peer more messages than that sends several, each but the last with more=1.
constexpr int64_t kPerManifest = 32;
constexpr int64_t kManifestLen = 2 + 3 * kPerManifest;

at::Tensor newManifest() { return at::zeros({kManifestLen}, at::TensorOptions().dtype(at::kLong)); }

braid::PeerOp manifestOp(braid::PeerOp::Kind kind, at::Tensor& m, int peer) {
  return {kind, m.data_ptr(), static_cast<std::size_t>(kManifestLen), braid::DataType::kInt64, peer, kManifestTag};
}

std::string dtypeName(at::ScalarType t) { return c10::toString(t); }

}  // namespace

void P2pQueue::push(bool isSend, at::Tensor buf, int peer, int tag, c10::intrusive_ptr<WorkBraid> work) {
  std::lock_guard<std::mutex> g(mu_);
  entries_.push_back({isSend, std::move(buf), peer, tag, std::move(work)});
}

void P2pQueue::flush() { drain(false); }

void P2pQueue::close() { drain(true); }

void P2pQueue::drain(bool closing) {
  // The manifest exchange waits on this thread. A caller holding the GIL (is_completed() from
  // Python, or torch destroying the group) lets go of it meanwhile: Braid's worker may need it to
  // drop a Python-made tensor.
  std::optional<pybind11::gil_scoped_release> nogil;
  if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
  Outcome out;
  {
    std::lock_guard<std::mutex> one(flushMu_);
    std::vector<Entry> batch;
    {
      std::lock_guard<std::mutex> g(mu_);
      batch.swap(entries_);
    }
    if (!batch.empty()) run(batch, closing, out);
    if (closing) {
      std::lock_guard<std::mutex> g(mu_);
      comm_ = nullptr;
      held_.clear();
    }
  }
  for (auto& [w, work] : out.attach) WorkBraid::attach(w, std::move(work));
  for (auto& [w, s] : out.fail) WorkBraid::fail(w, s);
}

std::string P2pQueue::heldFrom(int peer) const {
  std::string s;
  auto it = held_.find(peer);
  if (it != held_.end())
    for (const auto& [tag, q] : it->second) {
      if (q.empty()) continue;
      s += (s.empty() ? "" : ", ") + std::string("tag ") + std::to_string(tag) + " (" + std::to_string(q.size()) +
           (q.size() == 1 ? " message)" : " messages)");
    }
  return "messages from rank " + std::to_string(peer) + " held here for a receive: " + (s.empty() ? "none" : s);
}

std::string P2pQueue::mismatch(const Entry& r, int64_t count, at::ScalarType type) const {
  return "recv from rank " + std::to_string(r.peer) + " with tag " + std::to_string(r.tag) + " on rank " +
         std::to_string(rank_) + ": rank " + std::to_string(r.peer) + " sent " + std::to_string(count) + " elements of " +
         dtypeName(type) + " with that tag, this receive takes " + std::to_string(r.buf.numel()) + " of " +
         dtypeName(r.buf.scalar_type()) + " (a receive's size and dtype must equal its send's; the message is dropped)";
}

bool P2pQueue::fromHeld(const Entry& r, Outcome& out) {
  auto peer = held_.find(r.peer);
  if (peer == held_.end()) return false;
  auto tag = peer->second.find(r.tag);
  if (tag == peer->second.end() || tag->second.empty()) return false;
  Held h = std::move(tag->second.front());
  tag->second.pop_front();
  if (tag->second.empty()) peer->second.erase(tag);
  if (h.data.numel() != r.buf.numel() || h.data.scalar_type() != r.buf.scalar_type()) {
    out.fail.emplace_back(r.work, braid::Status::InvalidArgument(mismatch(r, h.data.numel(), h.data.scalar_type())));
    return true;
  }
  at::Tensor buf = r.buf, data = h.data;
  r.work->before([buf, data]() mutable { buf.view({-1}).copy_(data); });
  out.attach.emplace_back(r.work, h.filled);
  return true;
}

braid::Status P2pQueue::exchangeManifests(const std::map<int, std::vector<const Entry*>>& sendsTo,
                                          const std::vector<const Entry*>& waiting,
                                          std::map<int, std::vector<Announced>>& announced) {
  std::vector<braid::PeerOp> ops;
  std::vector<at::Tensor> ours;  // alive until the exchange is done
  for (const auto& [peer, sends] : sendsTo)
    for (std::size_t i = 0; i < sends.size(); i += kPerManifest) {
      at::Tensor m = newManifest();
      int64_t* v = m.data_ptr<int64_t>();
      const std::size_t n = std::min<std::size_t>(kPerManifest, sends.size() - i);
      v[0] = static_cast<int64_t>(n);
      v[1] = i + n < sends.size() ? 1 : 0;
      for (std::size_t k = 0; k < n; ++k) {
        const Entry& s = *sends[i + k];
        v[2 + 3 * k] = s.tag;
        v[3 + 3 * k] = s.buf.numel();
        v[4 + 3 * k] = static_cast<int64_t>(s.buf.scalar_type());
      }
      ours.push_back(m);
      ops.push_back(manifestOp(braid::PeerOp::kSend, ours.back(), peer));
    }
  std::map<int, at::Tensor> theirs;
  for (const Entry* r : waiting)
    if (!theirs.count(r->peer)) theirs.emplace(r->peer, newManifest());
  for (auto& [peer, m] : theirs) ops.push_back(manifestOp(braid::PeerOp::kRecv, m, peer));
  while (!ops.empty()) {
    braid::Status s = comm_->sendRecvBatch(ops).wait();
    if (!s.ok()) return s;
    ops.clear();
    for (auto& [peer, m] : theirs) {
      const int64_t* v = m.data_ptr<int64_t>();
      if (v[0] < 0 || v[0] > kPerManifest || (v[1] != 0 && v[1] != 1))
        return braid::Status::Internal("a corrupt manifest of sends from rank " + std::to_string(peer));
      for (int64_t k = 0; k < v[0]; ++k) {
        const int64_t type = v[4 + 3 * k];
        if (v[3 + 3 * k] < 0 || type < 0 || type >= static_cast<int64_t>(at::ScalarType::NumOptions))
          return braid::Status::Internal("a corrupt manifest of sends from rank " + std::to_string(peer));
        announced[peer].push_back({static_cast<int>(v[2 + 3 * k]), v[3 + 3 * k], static_cast<at::ScalarType>(type)});
      }
      if (v[1]) ops.push_back(manifestOp(braid::PeerOp::kRecv, m, peer));  // its next manifest follows
    }
    for (auto it = theirs.begin(); it != theirs.end();)  // keep only the peers with more to read
      it = it->second.data_ptr<int64_t>()[1] ? std::next(it) : theirs.erase(it);
  }
  return braid::Status::Ok();
}

void P2pQueue::runAnySource(const Entry& r, Outcome& out) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSec_);
  const std::size_t before = out.attach.size() + out.fail.size();
  auto metOn = [&](int peer) {
    if (out.attach.size() + out.fail.size() == before) return false;
    r.work->setSource(peer);
    return true;
  };
  for (;;) {
    for (auto& [peer, tags] : held_) {  // a message of the tag that came earlier, from any rank
      auto t = tags.find(r.tag);
      if (t == tags.end() || t->second.empty()) continue;
      Entry e = r;
      e.peer = peer;
      fromHeld(e, out);
      metOn(peer);
      return;
    }
    comm_->finishQueued();  // nothing in flight reads the peers' streams: what waits is a new manifest
    int from = -1;
    for (int k = 1; k < size_ && from < 0; ++k)
      if (comm_->hasIncoming((rank_ + k) % size_)) from = (rank_ + k) % size_;
    if (from < 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        out.fail.emplace_back(r.work, braid::Status::Timeout(
            "recv from any rank with tag " + std::to_string(r.tag) + " on rank " + std::to_string(rank_) +
            ": no rank sent this rank a message within the group's timeout (" + std::to_string(timeoutSec_) + " s)"));
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    std::vector<Entry> one{r};
    one[0].peer = from;
    run(one, false, out, true);
    if (metOn(from)) return;
  }
}

void P2pQueue::run(std::vector<Entry>& batch, bool closing, Outcome& out, bool oneRound) {
  braid::Communicator* c;
  {
    std::lock_guard<std::mutex> g(mu_);
    c = comm_;
  }
  std::map<int, std::vector<const Entry*>> sendsTo;
  std::vector<const Entry*> waiting;
  std::vector<const Entry*> fromAny;
  for (const Entry& e : batch) {
    if (!c) {
      out.fail.emplace_back(e.work, braid::Status::InvalidUsage("the process group was destroyed"));
    } else if (e.isSend) {
      sendsTo[e.peer].push_back(&e);
    } else if (closing) {
      out.fail.emplace_back(e.work, braid::Status::Aborted(
                                        "recv from " + (e.peer == kAnySource ? std::string("any rank") : "rank " + std::to_string(e.peer)) +
                                        " with tag " + std::to_string(e.tag) +
                                        ": the process group was destroyed before it was waited on"));
    } else if (e.peer == kAnySource) {
      fromAny.push_back(&e);
    } else if (!fromHeld(e, out)) {
      waiting.push_back(&e);
    }
  }
  if (!c) return;
  bool first = true;
  // The receives from any rank, which run after these rounds, fail with a failed round's error.
  auto failFromAny = [&](const braid::Status& s) {
    for (const Entry* r : fromAny)
      out.fail.emplace_back(r->work, s.withContext("recv from any rank with tag " + std::to_string(r->tag) + " on rank " +
                                                   std::to_string(rank_)));
  };
  while (first || !waiting.empty()) {
    std::map<int, std::vector<Announced>> announced;
    braid::Status s = exchangeManifests(first ? sendsTo : decltype(sendsTo){}, waiting, announced);
    if (!s.ok()) {
      failFromAny(s);
      if (first)
        for (const auto& [peer, sends] : sendsTo)
          for (const Entry* e : sends)
            out.fail.emplace_back(e->work, s.withContext("send to rank " + std::to_string(peer) + " with tag " +
                                                         std::to_string(e->tag) + " on rank " + std::to_string(rank_)));
      for (const Entry* r : waiting)
        out.fail.emplace_back(r->work, s.withContext("recv from rank " + std::to_string(r->peer) + " with tag " +
                                                     std::to_string(r->tag) + " on rank " + std::to_string(rank_) +
                                                     ", waiting for a message with that tag (" + heldFrom(r->peer) + ")"));
      return;
    }
    std::vector<braid::PeerOp> ops;
    std::vector<const Entry*> met;
    std::vector<Held*> fills;
    std::vector<at::Tensor> dropped;  // messages that failed their receive, alive until received
    if (first)
      for (const auto& [peer, sends] : sendsTo)
        for (const Entry* e : sends)
          ops.push_back({braid::PeerOp::kSend, ptr(e->buf), count(e->buf), braidType(e->buf), peer, e->tag});
    for (const auto& [peer, list] : announced)
      for (const Announced& a : list) {
        auto r = std::find_if(waiting.begin(), waiting.end(),
                              [&](const Entry* w) { return w && w->peer == peer && w->tag == a.tag; });
        if (r != waiting.end() && (*r)->buf.numel() == a.count && (*r)->buf.scalar_type() == a.type) {
          ops.push_back({braid::PeerOp::kRecv, ptr((*r)->buf), count((*r)->buf), braidType((*r)->buf), peer, a.tag});
          met.push_back(*r);
          *r = nullptr;
          continue;
        }
        at::Tensor t = at::empty({a.count}, at::TensorOptions().dtype(a.type));
        ops.push_back({braid::PeerOp::kRecv, ptr(t), count(t), braidType(a.type), peer, a.tag});
        if (r != waiting.end()) {  // the receive it was sent for takes another size or dtype
          out.fail.emplace_back((*r)->work, braid::Status::InvalidArgument(mismatch(**r, a.count, a.type)));
          dropped.push_back(t);
          *r = nullptr;
        } else {
          std::deque<Held>& q = held_[peer][a.tag];
          q.push_back({t, {}});
          fills.push_back(&q.back());  // (a deque's elements stay where they are as it grows)
        }
      }
    waiting.erase(std::remove(waiting.begin(), waiting.end(), nullptr), waiting.end());
    braid::Work w;
    if (!ops.empty()) w = c->sendRecvBatch(ops);
    for (Held* h : fills) h->filled = w;
    if (first)
      for (const auto& [peer, sends] : sendsTo)
        for (const Entry* e : sends) out.attach.emplace_back(e->work, w);
    for (const Entry* r : met) out.attach.emplace_back(r->work, w);
    if (!dropped.empty()) w.onDone([dropped](const braid::Status&) {});
    first = false;
    if (oneRound) break;
    if (waiting.empty() || ops.empty()) continue;
    s = w.wait();  // the peers' next manifests follow this batch's messages
    if (!s.ok()) {
      failFromAny(s);
      for (const Entry* r : waiting)
        out.fail.emplace_back(r->work, s.withContext("recv from rank " + std::to_string(r->peer) + " with tag " +
                                                     std::to_string(r->tag) + " on rank " + std::to_string(rank_)));
      return;
    }
  }
  for (const Entry* r : fromAny) runAnySource(*r, out);
}

}  // namespace braid::torch_backend
