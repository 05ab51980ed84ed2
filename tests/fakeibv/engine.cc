// fakeibv's data path: the emulated NIC. A send work request is carried out by the process that
// posts it, at once: it checks the route, the keys and the bounds against the peer's shared state,
// moves the bytes with process_vm_writev / process_vm_readv, takes a receive from the peer's queue
// when the operation consumes one, and appends the completions (the peer's in its CQ file). What
// cannot finish yet (the peer has no receive posted: an RNR NAK; the peer does not answer: a dead
// process, a port DOWN, a wrong address) stays queued and is retried by later calls of this
// process and by its NIC thread, until the QP's retry budget runs out; then the request completes
// with the status real hardware gives, the QP goes to ERR and what it still holds is flushed.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "tests/fakeibv/objects.h"

namespace fakeibv {
namespace {

using Clock = std::chrono::steady_clock;

// The NIC thread may still run while the process exits: what it touches is never destroyed (a
// condition variable destroyed under a waiter blocks exit).
std::mutex& registryMu = *new std::mutex;
std::vector<Qp*>& qps = *new std::vector<Qp*>;
std::map<std::uint32_t, Cq*>& cqs = *new std::map<std::uint32_t, Cq*>;

std::mutex& nicMu = *new std::mutex;
std::condition_variable& nicCv = *new std::condition_variable;
std::atomic<int> waitingQps{0};  // QPs with queued requests that could not finish yet
bool nicStarted = false;

void progressAll();

void nicLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> l(nicMu);
      nicCv.wait(l, [] { return waitingQps.load() > 0; });
    }
    progressAll();
    ::usleep(50);
  }
}

void kickNic() {
  std::lock_guard<std::mutex> g(nicMu);
  if (!nicStarted) {
    nicStarted = true;
    std::thread(nicLoop).detach();
  }
  nicCv.notify_one();
}

// The transport timer: 4.096 us x 2^timeout per try, retry_cnt retries after the first (0: wait forever).
Clock::duration noResponseBudget(const ibv_qp_attr& a) {
  if (a.timeout == 0) return Clock::duration::max();
  double us = 4.096 * static_cast<double>(1ull << std::min<int>(a.timeout, 31)) * (a.retry_cnt + 1);
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(us));
}

// The IB spec's RNR NAK timer values, in microseconds (index 0 is 655.36 ms).
Clock::duration rnrDelay(std::uint8_t code) {
  static const double kUs[32] = {655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
                                 480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
                                 20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(kUs[code & 31]));
}

template <typename T>
T* mapByName(const std::string& name, std::size_t* bytes) {
  std::size_t n = sharedSize(name);
  if (n == 0) return nullptr;
  T* p = static_cast<T*>(mapShared(name, n, false));
  if (p) *bytes = n;
  return p;
}

void complete(Cq* cq, const ibv_wc& wc) {
  if (!pushCompletion(cq->sh, wc)) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) std::fprintf(stderr, "fakeibv: CQ %u overran: a completion was lost\n", cq->id);
  }
  notify(cq->sh);
}

ibv_wc_opcode wcOpcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    default: return IBV_WC_SEND;
  }
}

void completeSend(Qp* q, const SendWr& w, ibv_wc_status st, std::uint32_t bytes) {
  if (st == IBV_WC_SUCCESS && !(w.flags & IBV_SEND_SIGNALED) && !q->sigAll) return;
  ibv_wc wc{};
  wc.wr_id = w.wrId;
  wc.status = st;
  wc.opcode = wcOpcode(w.opcode);
  wc.byte_len = bytes;
  wc.qp_num = q->qpx.qp_base.qp_num;
  complete(q->scq, wc);
}

void setError(Qp* q) {
  q->sh->state.store(IBV_QPS_ERR);
  q->qpx.qp_base.state = IBV_QPS_ERR;
  flushQp(q);
}

// Moves `local` to or from `pid`'s `remote`; 0 or an errno.
int copyRemote(int pid, const std::vector<iovec>& local, const std::vector<iovec>& remote, bool write) {
  std::size_t total = 0;
  for (const iovec& v : local) total += v.iov_len;
  if (total == 0) return 0;
  if (pid == selfPid()) {  // a loopback QP: plain copies, in order
    std::size_t li = 0, lo = 0;
    for (const iovec& r : remote) {
      std::size_t ro = 0;
      while (ro < r.iov_len && li < local.size()) {
        std::size_t k = std::min(r.iov_len - ro, local[li].iov_len - lo);
        char* rp = static_cast<char*>(r.iov_base) + ro;
        char* lp = static_cast<char*>(local[li].iov_base) + lo;
        if (write) std::memcpy(rp, lp, k);
        else std::memcpy(lp, rp, k);
        ro += k;
        lo += k;
        if (lo == local[li].iov_len) ++li, lo = 0;
      }
    }
    return 0;
  }
  ssize_t k = write ? ::process_vm_writev(pid, local.data(), local.size(), remote.data(), remote.size(), 0)
                    : ::process_vm_readv(pid, local.data(), local.size(), remote.data(), remote.size(), 0);
  if (k < 0) return errno;
  return static_cast<std::size_t>(k) == total ? 0 : EFAULT;
}

enum class Outcome { kDone, kNoResponse, kRnr, kError };
struct Step {
  Outcome outcome;
  ibv_wc_status status = IBV_WC_SUCCESS;
  std::uint32_t bytes = 0;
};

bool routeOk(const Qp* q, const SharedQp* p, const Port* port) {
  if (p->linkLayer != port->linkLayer) return false;
  const ibv_ah_attr& ah = q->attr.ah_attr;
  if (port->linkLayer == IBV_LINK_LAYER_INFINIBAND) return ah.is_global ? std::memcmp(ah.grh.dgid.raw, p->gid, 16) == 0
                                                                        : ah.dlid == p->lid;
  const int sgid = ah.grh.sgid_index;
  return std::memcmp(ah.grh.dgid.raw, p->gid, 16) == 0 && port->gids[static_cast<std::size_t>(sgid)].type == p->gidType;
}

Step execute(Qp* q, SendWr& w) {
  if (!q->peer) mapPeer(q);
  SharedQp* p = q->peer;
  const Port* port = portOf(q->ctx, q->attr.port_num ? q->attr.port_num : 1);
  if (!p || p->magic != kMagic || p->qpn != q->attr.dest_qp_num) return {Outcome::kNoResponse};
  const int ps = p->state.load();
  if ((ps != IBV_QPS_RTR && ps != IBV_QPS_RTS) || portDown(port->lid) || portDown(p->lid) || !routeOk(q, p, port) ||
      mtuBytes(q->attr.path_mtu) > p->mtu)
    return {Outcome::kNoResponse};
  const int pid = p->pid;

  // The local side of the request.
  const bool read = w.opcode == IBV_WR_RDMA_READ;
  const auto* pd = reinterpret_cast<const Pd*>(q->qpx.qp_base.pd);
  std::vector<iovec> local;
  std::size_t total = 0;
  if (w.isInline) {
    local.push_back({w.inlineData.data(), w.inlineData.size()});
    total = w.inlineData.size();
  } else {
    for (const ibv_sge& s : w.sge) {
      const MrSlot* m = findMr(s.lkey, selfPid());
      if (!m || m->pd != pd->key || s.addr < m->addr || s.addr + s.length > m->addr + m->length ||
          (read && !(m->access & IBV_ACCESS_LOCAL_WRITE)))
        return {Outcome::kError, IBV_WC_LOC_PROT_ERR};
      if (s.length) local.push_back({reinterpret_cast<void*>(m->base + (s.addr - m->addr)), s.length});
      total += s.length;
    }
  }

  // A peer that is gone: process_vm_writev says so (ESRCH) when there are bytes to move.
  if (total == 0 && ::kill(pid, 0) != 0 && errno == ESRCH) return {Outcome::kNoResponse};

  const bool rdma = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || read;
  const bool consumes = w.opcode != IBV_WR_RDMA_WRITE && !read;
  std::vector<iovec> remote;
  if (rdma) {
    const unsigned need = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
    const MrSlot* r = findMr(w.rkey, pid);
    int after = p->accessAfter.load();
    const bool injected = after > 0 && (after == 1 ? p->accessAfter.compare_exchange_strong(after, -1)
                                                   : (p->accessAfter.compare_exchange_strong(after, after - 1), false));
    if (injected || p->accessAfter.load() < 0 || !r || r->pd != p->pd || !(r->access & need) || !(p->access & need) || w.remoteAddr < r->addr ||
        w.remoteAddr + total > r->addr + r->length) {
      p->state.store(IBV_QPS_ERR);  // the responder's QP fails too
      counts().accessErrors++;
      return {Outcome::kError, IBV_WC_REM_ACCESS_ERR};
    }
    char* base = reinterpret_cast<char*>(r->base + (w.remoteAddr - r->addr));
    // The last bytes land last, as a NIC's in-order writes do: a reader may spin on them.
    const std::size_t tail = total > 8 ? 8 : 0;
    if (total - tail) remote.push_back({base, total - tail});
    if (tail) remote.push_back({base + total - tail, tail});
  }

  RecvQueue* rq = nullptr;
  if (consumes) {
    if (p->srq && !q->peerSrq) return {Outcome::kNoResponse};
    rq = p->srq ? q->peerSrq : &p->rq;
    if (!q->peerCq) return {Outcome::kNoResponse};
    lock(&rq->mu);
    int inject = p->rnrInject.load();
    if (rq->head == rq->tail || (inject > 0 && p->rnrInject.compare_exchange_strong(inject, inject - 1))) {
      unlock(&rq->mu);
      return {Outcome::kRnr};
    }
  }
  Step step{Outcome::kDone, IBV_WC_SUCCESS, static_cast<std::uint32_t>(total)};
  RecvEntry e{};
  ibv_wc_status recvStatus = IBV_WC_SUCCESS;
  if (consumes) {
    e = rq->e[rq->head % rq->cap];
    if (!rdma) {  // a send scatters into the receive's buffers
      std::size_t room = 0;
      for (std::uint32_t i = 0; i < e.numSge && room < total; ++i) {
        const ibv_sge& s = e.sge[i];
        const MrSlot* m = findMr(s.lkey, pid);
        if (!m || m->pd != p->pd || !(m->access & IBV_ACCESS_LOCAL_WRITE) || s.addr < m->addr ||
            s.addr + s.length > m->addr + m->length) {
          recvStatus = IBV_WC_LOC_PROT_ERR;
          break;
        }
        std::size_t k = std::min<std::size_t>(s.length, total - room);
        if (k) remote.push_back({reinterpret_cast<void*>(m->base + (s.addr - m->addr)), k});
        room += k;
      }
      if (recvStatus == IBV_WC_SUCCESS && room < total) recvStatus = IBV_WC_LOC_LEN_ERR;
    }
  }
  if (recvStatus == IBV_WC_SUCCESS) {
    int err = copyRemote(pid, local, remote, !read);
    if (err == ESRCH) {
      if (rq) unlock(&rq->mu);
      return {Outcome::kNoResponse};
    }
    if (err) step = {Outcome::kError, IBV_WC_REM_ACCESS_ERR};
  } else {
    step = {Outcome::kError, recvStatus == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR};
  }
  if (consumes) {
    ++rq->head;
    unlock(&rq->mu);
    ibv_wc wc{};
    wc.wr_id = e.wrId;
    wc.status = recvStatus == IBV_WC_SUCCESS && step.outcome == Outcome::kDone ? IBV_WC_SUCCESS
                                                                             : (recvStatus ? recvStatus : IBV_WC_REM_ACCESS_ERR);
    wc.opcode = rdma ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    wc.byte_len = static_cast<std::uint32_t>(total);
    wc.qp_num = p->qpn;
    wc.src_qp = q->qpx.qp_base.qp_num;
    if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w.opcode == IBV_WR_SEND_WITH_IMM) {
      wc.imm_data = w.imm;
      wc.wc_flags = IBV_WC_WITH_IMM;
    }
    pushCompletion(q->peerCq, wc);
    notify(q->peerCq);
    if (wc.status != IBV_WC_SUCCESS) p->state.store(IBV_QPS_ERR);
  }
  return step;
}

void fail(Qp* q, ibv_wc_status st) {
  SendWr w = std::move(q->sq.front());
  q->sq.pop_front();
  completeSend(q, w, st, 0);
  setError(q);
}

// Carries out q's queued requests in order until one must wait. Called with q->mu held.
void progress(Qp* q) {
  const auto now = Clock::now();
  while (!q->sq.empty()) {
    SendWr& w = q->sq.front();
    if (w.nextTry > now) break;  // an RNR NAK's timer
    Step s = execute(q, w);
    if (s.outcome == Outcome::kDone) {
      SendWr done = std::move(w);
      q->sq.pop_front();
      completeSend(q, done, IBV_WC_SUCCESS, s.bytes);
      continue;
    }
    if (s.outcome == Outcome::kError) {
      fail(q, s.status);
      break;
    }
    if (s.outcome == Outcome::kRnr) {
      counts().rnrNaks++;
      w.waiting = false;  // the peer answered
      ++w.rnrTries;
      if (q->attr.rnr_retry != 7 && w.rnrTries > q->attr.rnr_retry) {
        fail(q, IBV_WC_RNR_RETRY_EXC_ERR);
        break;
      }
      w.nextTry = now + rnrDelay(q->peer ? q->peer->minRnrTimer : 0);
      break;
    }
    // No response.
    if (!w.waiting) {
      counts().noResponse++;
      w.waiting = true;
      const auto budget = noResponseBudget(q->attr);
      w.giveUpAt = budget == Clock::duration::max() ? Clock::time_point::max() : now + budget;
    } else if (now >= w.giveUpAt) {
      fail(q, IBV_WC_RETRY_EXC_ERR);
    }
    break;
  }
}

// QPs whose requests wait: counted once each, so the NIC thread runs while any waits.
void account(Qp* q, bool& counted) {
  const bool waiting = !q->sq.empty();
  if (waiting && !counted) {
    counted = true;
    waitingQps++;
    kickNic();
  } else if (!waiting && counted) {
    counted = false;
    waitingQps--;
  }
}

std::map<Qp*, bool>& counted = *new std::map<Qp*, bool>;  // guarded by registryMu

void progressAll() {
  std::lock_guard<std::mutex> g(registryMu);
  for (Qp* q : qps) {
    std::unique_lock<std::recursive_mutex> l(q->mu, std::try_to_lock);
    if (!l.owns_lock()) continue;
    if (!q->sq.empty()) progress(q);
    if (q->sh->state.load() == IBV_QPS_ERR && !q->recvFlushed) flushQp(q);  // a peer failed it
    account(q, counted[q]);
  }
}

int writerFor(std::uint32_t channel, int ownerPid) {
  static std::mutex& mu = *new std::mutex;
  static std::map<std::uint32_t, int>& fds = *new std::map<std::uint32_t, int>;
  std::lock_guard<std::mutex> g(mu);
  auto it = fds.find(channel);
  if (it != fds.end()) return it->second;
  int fd = ::open((dir() + "/" + channelName(channel, ownerPid)).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) fds[channel] = fd;
  return fd;
}

int queueSend(Qp* q, SendWr&& w) {
  const int state = q->sh->state.load();
  if (state == IBV_QPS_ERR) {  // accepted and flushed, as hardware does
    completeSend(q, w, IBV_WC_WR_FLUSH_ERR, 0);
    return 0;
  }
  if (state != IBV_QPS_RTS) return EINVAL;
  if (w.sge.size() > q->cap.max_send_sge) return EINVAL;
  if (w.isInline && w.inlineData.size() > q->cap.max_inline_data) return EINVAL;
  switch (w.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_READ: break;
    default: return EINVAL;  // atomics and the rest: the device reports IBV_ATOMIC_NONE
  }
  if (q->sq.size() >= std::max(q->cap.max_send_wr, 1u)) return ENOMEM;
  q->sq.push_back(std::move(w));
  return 0;
}

void afterPost(Qp* q) {
  progress(q);
  if (!q->sq.empty()) {
    std::lock_guard<std::mutex> g(registryMu);
    account(q, counted[q]);
  }
}

// ---- ibv_qp_ex's builder calls

Qp* of(ibv_qp_ex* x) { return reinterpret_cast<Qp*>(x); }

SendWr& begin(ibv_qp_ex* x, ibv_wr_opcode op) {
  Qp* q = of(x);
  q->building.emplace_back();
  SendWr& w = q->building.back();
  w.wrId = x->wr_id;
  w.flags = x->wr_flags;
  w.opcode = op;
  return w;
}

void wrStart(ibv_qp_ex* x) {
  of(x)->mu.lock();
  of(x)->building.clear();
}
int wrComplete(ibv_qp_ex* x) {
  Qp* q = of(x);
  int err = 0;
  for (SendWr& w : q->building)
    if (!err) err = queueSend(q, std::move(w));
  q->building.clear();
  afterPost(q);
  q->mu.unlock();
  return err;
}
void wrAbort(ibv_qp_ex* x) {
  of(x)->building.clear();
  of(x)->mu.unlock();
}
void wrRdmaWrite(ibv_qp_ex* x, std::uint32_t rkey, std::uint64_t addr) {
  SendWr& w = begin(x, IBV_WR_RDMA_WRITE);
  w.rkey = rkey;
  w.remoteAddr = addr;
}
void wrRdmaWriteImm(ibv_qp_ex* x, std::uint32_t rkey, std::uint64_t addr, __be32 imm) {
  SendWr& w = begin(x, IBV_WR_RDMA_WRITE_WITH_IMM);
  w.rkey = rkey;
  w.remoteAddr = addr;
  w.imm = imm;
}
void wrRdmaRead(ibv_qp_ex* x, std::uint32_t rkey, std::uint64_t addr) {
  SendWr& w = begin(x, IBV_WR_RDMA_READ);
  w.rkey = rkey;
  w.remoteAddr = addr;
}
void wrSend(ibv_qp_ex* x) { begin(x, IBV_WR_SEND); }
void wrSendImm(ibv_qp_ex* x, __be32 imm) { begin(x, IBV_WR_SEND_WITH_IMM).imm = imm; }
void wrSetSge(ibv_qp_ex* x, std::uint32_t lkey, std::uint64_t addr, std::uint32_t len) {
  if (!of(x)->building.empty()) of(x)->building.back().sge = {ibv_sge{addr, len, lkey}};
}
void wrSetSgeList(ibv_qp_ex* x, std::size_t n, const ibv_sge* list) {
  if (!of(x)->building.empty()) of(x)->building.back().sge.assign(list, list + n);
}
void wrSetInline(ibv_qp_ex* x, void* addr, std::size_t len) {
  if (of(x)->building.empty()) return;
  SendWr& w = of(x)->building.back();
  w.isInline = true;
  w.inlineData.assign(static_cast<const char*>(addr), len);
}
void wrSetInlineList(ibv_qp_ex* x, std::size_t n, const ibv_data_buf* bufs) {
  if (of(x)->building.empty()) return;
  SendWr& w = of(x)->building.back();
  w.isInline = true;
  w.inlineData.clear();
  for (std::size_t i = 0; i < n; ++i) w.inlineData.append(static_cast<const char*>(bufs[i].addr), bufs[i].length);
}
void wrUnsupported(ibv_qp_ex* x) { begin(x, static_cast<ibv_wr_opcode>(-1)); }
void wrCmpSwp(ibv_qp_ex* x, std::uint32_t, std::uint64_t, std::uint64_t, std::uint64_t) { wrUnsupported(x); }
void wrFetchAdd(ibv_qp_ex* x, std::uint32_t, std::uint64_t, std::uint64_t) { wrUnsupported(x); }
void wrBindMw(ibv_qp_ex* x, ibv_mw*, std::uint32_t, const ibv_mw_bind_info*) { wrUnsupported(x); }
void wrLocalInv(ibv_qp_ex* x, std::uint32_t) { wrUnsupported(x); }
void wrSendInv(ibv_qp_ex* x, std::uint32_t) { wrUnsupported(x); }
void wrSendTso(ibv_qp_ex* x, void*, std::uint16_t, std::uint16_t) { wrUnsupported(x); }
void wrSetUdAddr(ibv_qp_ex*, ibv_ah*, std::uint32_t, std::uint32_t) {}
void wrSetXrcSrqn(ibv_qp_ex*, std::uint32_t) {}
void wrAtomicWrite(ibv_qp_ex* x, std::uint32_t, std::uint64_t, const void*) { wrUnsupported(x); }

}  // namespace

void notify(SharedCq* cq) {
  if (!cq->channel || !cq->armed.exchange(0)) return;
  int fd = writerFor(cq->channel, cq->pid);
  const std::uint32_t id = cq->id;
  if (fd >= 0) (void)!::write(fd, &id, sizeof(id));
}

void installQpEx(Qp* q) {
  ibv_qp_ex& x = q->qpx;
  x.wr_atomic_cmp_swp = wrCmpSwp;
  x.wr_atomic_fetch_add = wrFetchAdd;
  x.wr_bind_mw = wrBindMw;
  x.wr_local_inv = wrLocalInv;
  x.wr_rdma_read = wrRdmaRead;
  x.wr_rdma_write = wrRdmaWrite;
  x.wr_rdma_write_imm = wrRdmaWriteImm;
  x.wr_send = wrSend;
  x.wr_send_imm = wrSendImm;
  x.wr_send_inv = wrSendInv;
  x.wr_send_tso = wrSendTso;
  x.wr_set_ud_addr = wrSetUdAddr;
  x.wr_set_xrc_srqn = wrSetXrcSrqn;
  x.wr_set_inline_data = wrSetInline;
  x.wr_set_inline_data_list = wrSetInlineList;
  x.wr_set_sge = wrSetSge;
  x.wr_set_sge_list = wrSetSgeList;
  x.wr_start = wrStart;
  x.wr_complete = wrComplete;
  x.wr_abort = wrAbort;
  x.wr_atomic_write = wrAtomicWrite;
}

void registerQp(Qp* q) {
  std::lock_guard<std::mutex> g(registryMu);
  qps.push_back(q);
}

void unregisterQp(Qp* q) {
  std::lock_guard<std::mutex> g(registryMu);
  qps.erase(std::remove(qps.begin(), qps.end(), q), qps.end());
  auto it = counted.find(q);
  if (it != counted.end()) {
    if (it->second) waitingQps--;
    counted.erase(it);
  }
}

void registerCq(Cq* cq) {
  cq->sh->id = cq->id;
  std::lock_guard<std::mutex> g(registryMu);
  cqs[cq->id] = cq;
}

void unregisterCq(Cq* cq) {
  std::lock_guard<std::mutex> g(registryMu);
  cqs.erase(cq->id);
}

Cq* cqById(std::uint32_t id) {
  std::lock_guard<std::mutex> g(registryMu);
  auto it = cqs.find(id);
  return it == cqs.end() ? nullptr : it->second;
}

void mapPeer(Qp* q) {
  if (q->peer) return;
  q->peer = mapByName<SharedQp>(qpName(q->attr.dest_qp_num), &q->peerBytes);
  if (!q->peer) return;
  q->peerCq = mapByName<SharedCq>(cqName(q->peer->cq), &q->peerCqBytes);
  if (q->peer->srq) q->peerSrq = mapByName<RecvQueue>(srqName(q->peer->srq), &q->peerSrqBytes);
}

void unmapPeer(Qp* q) {
  unmapShared(q->peer, q->peerBytes);
  unmapShared(q->peerCq, q->peerCqBytes);
  unmapShared(q->peerSrq, q->peerSrqBytes);
  q->peer = nullptr;
  q->peerCq = nullptr;
  q->peerSrq = nullptr;
}

void flushQp(Qp* q) {
  std::lock_guard<std::recursive_mutex> g(q->mu);
  while (!q->sq.empty()) {
    completeSend(q, q->sq.front(), IBV_WC_WR_FLUSH_ERR, 0);
    q->sq.pop_front();
  }
  if (q->srq) {
    q->recvFlushed = true;
    return;
  }
  RecvQueue& rq = q->sh->rq;
  lock(&rq.mu);
  while (rq.head != rq.tail) {
    ibv_wc wc{};
    wc.wr_id = rq.e[rq.head % rq.cap].wrId;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qpx.qp_base.qp_num;
    ++rq.head;
    complete(q->rcq, wc);
  }
  unlock(&rq.mu);
  q->recvFlushed = true;
}

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Qp* q = reinterpret_cast<Qp*>(qp);
  std::lock_guard<std::recursive_mutex> g(q->mu);
  int err = 0;
  for (; wr; wr = wr->next) {
    SendWr w;
    w.wrId = wr->wr_id;
    w.opcode = wr->opcode;
    w.flags = wr->send_flags;
    w.imm = wr->imm_data;
    w.remoteAddr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    if ((wr->send_flags & IBV_SEND_INLINE) && wr->opcode != IBV_WR_RDMA_READ) {
      w.isInline = true;
      for (int i = 0; i < wr->num_sge; ++i)
        w.inlineData.append(reinterpret_cast<const char*>(wr->sg_list[i].addr), wr->sg_list[i].length);
    } else {
      w.sge.assign(wr->sg_list, wr->sg_list + std::max(wr->num_sge, 0));
    }
    if (static_cast<std::uint32_t>(std::max(wr->num_sge, 0)) > q->cap.max_send_sge) err = EINVAL;
    else err = queueSend(q, std::move(w));
    if (err) break;
  }
  if (err && bad) *bad = wr;
  afterPost(q);
  return err;
}

static int postTo(RecvQueue* rq, std::uint32_t maxSge, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  lock(&rq->mu);
  int err = 0;
  for (; wr; wr = wr->next) {
    if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > maxSge) err = EINVAL;
    else if (rq->tail - rq->head >= rq->cap) err = ENOMEM;
    if (err) break;
    RecvEntry& e = rq->e[rq->tail % rq->cap];
    e.wrId = wr->wr_id;
    e.numSge = static_cast<std::uint32_t>(wr->num_sge);
    std::copy(wr->sg_list, wr->sg_list + wr->num_sge, e.sge);
    ++rq->tail;
  }
  unlock(&rq->mu);
  if (err && bad) *bad = wr;
  return err;
}

int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Qp* q = reinterpret_cast<Qp*>(qp);
  if (q->srq || q->sh->state.load() == IBV_QPS_RESET) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  int err = postTo(&q->sh->rq, q->cap.max_recv_sge, wr, bad);
  if (q->sh->state.load() == IBV_QPS_ERR) flushQp(q);
  return err;
}

int postSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Srq* s = reinterpret_cast<Srq*>(srq);
  return postTo(s->sh, s->maxSge, wr, bad);
}

int pollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  Cq* c = reinterpret_cast<Cq*>(cq);
  if (waitingQps.load(std::memory_order_relaxed) > 0) progressAll();
  SharedCq* s = c->sh;
  std::uint64_t h = s->head.load(std::memory_order_relaxed);
  std::uint64_t t = s->tail.load(std::memory_order_acquire);
  if (h == t) {  // nothing: has a peer failed one of our QPs? Complete its receives as flushed.
    static thread_local unsigned every = 0;
    if ((++every & 1023) == 0) progressAll();
    return 0;
  }
  int k = 0;
  for (; k < n && h != t; ++k, ++h) wc[k] = s->e[h % s->cap].wc;
  s->head.store(h, std::memory_order_release);
  return k;
}

int reqNotifyCq(ibv_cq* cq, int) {
  reinterpret_cast<Cq*>(cq)->sh->armed.store(1);
  return 0;
}

}  // namespace fakeibv
