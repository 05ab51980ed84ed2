#include "transport/ib/ib_channel.h"

#include "base/deadline.h"
#include "base/owned_memory.h"

#include <arpa/inet.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

namespace braid {
namespace {

constexpr int kRecvDepth = 128;      // receives posted per QP
constexpr int kSqDepth = 128;        // send work requests in flight per QP
constexpr int kRepostBatch = 16;
constexpr std::uint32_t kCreditImm = 0xffffffffu;
constexpr std::uint64_t kCreditWr = 1ull << 63;
constexpr std::uint32_t kWantInline = 64;
constexpr std::uint32_t kDirectImm = 1u << 31;     // flags a write into an advertised buffer
constexpr std::uint64_t kMaxDirect = 1u << 30;     // the most one such write (or advert) covers
// How long a sender holds a large piece back for an advert, when the peer has read (nearly)
// everything: a few round trips, far less than the piece takes to copy.
constexpr std::int64_t kAdvertWaitUs = 100;
constexpr std::uint64_t kWaitUnread = 4096;
constexpr std::uint64_t kNone = ~std::uint64_t{0};

constexpr std::uint64_t kCheck = 0x9e3779b97f4a7c15ull;

void* pageAlloc(std::size_t n) {
  void* p = std::aligned_alloc(4096, (n + 4095) & ~std::size_t{4095});
  if (p) std::memset(p, 0, n);
  return p;
}

std::string memlockText() {
  rlimit r{};
  ::getrlimit(RLIMIT_MEMLOCK, &r);
  if (r.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(r.rlim_cur >> 10) + " KiB";
}

}  // namespace

// Written by the peer in one inline RDMA write; `check` tells a whole write from a torn one.
struct IbChannel::Credit {
  volatile std::uint64_t head;    // bytes of this side's stream the peer has read
  volatile std::uint64_t posted;  // receives the peer has posted in all
  volatile std::uint64_t advPos, advAddr, advLen, advKey;  // the peer's latest advert (Advert)
  volatile std::uint64_t check;
  static std::uint64_t sum(std::uint64_t h, std::uint64_t p, std::uint64_t ap, std::uint64_t aa, std::uint64_t al,
                           std::uint64_t ak) {
    std::uint64_t x = kCheck;
    for (std::uint64_t v : {h, p, ap, aa, al, ak}) x = (x ^ v) * kCheck + 1;
    return x;
  }
  void fill(std::uint64_t h, std::uint64_t p, const Advert& a) {
    head = h;
    posted = p;
    advPos = a.pos;
    advAddr = a.addr;
    advLen = a.len;
    advKey = a.key;
    check = sum(h, p, a.pos, a.addr, a.len, a.key);
  }
};

IbDevice::~IbDevice() {
  if (listenToken_) owned::unlisten(listenToken_);
  for (auto& [id, mr] : owned_) verbs->deregMr(mr);
  for (auto& r : odp_) verbs->deregMr(r.mr);
  if (odpAll_) verbs->deregMr(odpAll_);
  if (pd) verbs->deallocPd(pd);
  if (channel) verbs->destroyCompChannel(channel);
  if (ctx) verbs->closeDevice(ctx);
}

void IbDevice::keepOwnedRegistrations() {
  listenToken_ = owned::listen([this](std::uint64_t id) {
    std::lock_guard<std::mutex> g(ownedMu_);
    refusedOwned_.erase(id);
    auto it = owned_.find(id);
    if (it == owned_.end()) return;
    verbs->deregMr(it->second);
    owned_.erase(it);
  });
}

ibv_mr* IbDevice::ownedMr(const void* p, std::size_t n) {
  if (!listenToken_) return nullptr;  // nothing would drop them: register per use
  auto range = owned::find(p, n);
  if (!range) return nullptr;
  std::lock_guard<std::mutex> g(ownedMu_);
  if (auto it = owned_.find(range->id); it != owned_.end()) return it->second;
  if (refusedOwned_.count(range->id)) return nullptr;
  ibv_mr* mr = verbs->regMr(pd, const_cast<void*>(range->base), range->bytes,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) {
    refusedOwned_.insert(range->id);
    return nullptr;
  }
  owned_[range->id] = mr;
  return mr;
}

std::string IbDevice::useOnDemandPaging() {
  ibv_device_attr_ex a{};
  if (verbs->queryDeviceEx(ctx, &a) != 0) return "no on-demand paging (the device has no extended query)";
  const ibv_odp_caps& odp = a.odp_caps;
  if (!(odp.general_caps & IBV_ODP_SUPPORT) || !(odp.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_WRITE))
    return "no on-demand paging for RC writes on " + port.device + ": other memory than braidMemAlloc's is registered per message";
  odpRangesOn_ = true;
  if (odp.general_caps & IBV_ODP_SUPPORT_IMPLICIT)
    odpAll_ = verbs->regMr(pd, nullptr, SIZE_MAX, IBV_ACCESS_ON_DEMAND);
  return std::string("on-demand paging: ") +
         (odpAll_ ? "implicit (one registration for every zero-copy source)" : "per range") +
         ", receive buffers cached by range";
}

ibv_mr* IbDevice::keptMr(const void* p, std::size_t n, bool remote) {
  if (ibv_mr* mr = ownedMr(p, n)) return mr;
  if (odpAll_ && !remote) return odpAll_;
  if (!odpRangesOn_) return nullptr;
  // Whole pages, so that a buffer used again at a small offset still hits.
  const std::uint64_t page = 4096;
  const std::uint64_t begin = reinterpret_cast<std::uint64_t>(p) & ~(page - 1);
  const std::uint64_t end = (reinterpret_cast<std::uint64_t>(p) + n + page - 1) & ~(page - 1);
  std::lock_guard<std::mutex> g(ownedMu_);
  for (auto& r : odp_)
    if (r.begin <= begin && end <= r.end && (r.remote || !remote)) {
      ++r.uses;
      r.lastUse = ++odpClock_;
      return r.mr;
    }
  if (odp_.size() >= kOdpRanges) {  // make room: the least recently used range no one uses now
    auto victim = odp_.end();
    for (auto it = odp_.begin(); it != odp_.end(); ++it)
      if (it->uses == 0 && (victim == odp_.end() || it->lastUse < victim->lastUse)) victim = it;
    if (victim == odp_.end()) return nullptr;
    verbs->deregMr(victim->mr);
    odp_.erase(victim);
  }
  // Remote write only for buffers peers write into (adverts), not for sources.
  ibv_mr* mr = verbs->regMr(pd, reinterpret_cast<void*>(begin), end - begin,
                            IBV_ACCESS_ON_DEMAND | (remote ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0));
  if (!mr) return nullptr;
  odp_.push_back({begin, end, mr, remote, 1, ++odpClock_});
  return mr;
}

void IbDevice::releaseKept(ibv_mr* mr) {
  std::lock_guard<std::mutex> g(ownedMu_);
  for (auto& r : odp_)
    if (r.mr == mr) --r.uses;
}

std::uint64_t IbDevice::odpRanges() const {
  std::lock_guard<std::mutex> g(ownedMu_);
  return odp_.size();
}

std::uint64_t IbDevice::ownedRegistrations() const {
  std::lock_guard<std::mutex> g(ownedMu_);
  return owned_.size();
}

void IbDevice::drainEvents() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  for (int i = 0; i < 1 << 16 && verbs->getCqEvent(channel, &cq, &context) == 0; ++i) {
    verbs->ackCqEvents(cq, 1);
    // The event used up that CQ's arming: its channel arms it again when a poll finds nothing.
    if (context) static_cast<IbChannel*>(context)->disarm();
  }
}

IbChannel::IbChannel(std::shared_ptr<IbDevice> dev, int peer, std::size_t cap)
    : dev_(std::move(dev)), peer_(peer), cap_(cap) {}

Result<std::unique_ptr<IbChannel>> IbChannel::create(std::shared_ptr<IbDevice> dev, int peer, std::size_t cap) {
  std::unique_ptr<IbChannel> c(new IbChannel(std::move(dev), peer, cap));
  Status s = c->setup();
  if (!s.ok()) return s;
  return c;
}

Status IbChannel::setup() {
  const Verbs& v = *dev_->verbs;
  const std::string where = this->where();
  cq_ = v.createCq(dev_->ctx, kRecvDepth + kSqDepth + 16, this, dev_->channel, 0);
  if (!cq_) return Status::SystemError(where + ": ibv_create_cq failed: " + std::strerror(errno));
  ibv_qp_init_attr a{};
  a.send_cq = cq_;
  a.recv_cq = cq_;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = kSqDepth;
  a.cap.max_recv_wr = kRecvDepth;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = kWantInline;
  qp_ = v.createQp(dev_->pd, &a);
  if (!qp_) {  // a device without inline sends
    a.cap.max_inline_data = 0;
    qp_ = v.createQp(dev_->pd, &a);
  }
  if (!qp_) return Status::SystemError(where + ": ibv_create_qp failed: " + std::strerror(errno));
  maxInline_ = a.cap.max_inline_data;
  inbox_ = static_cast<std::byte*>(pageAlloc(cap_));
  outbox_ = static_cast<std::byte*>(pageAlloc(cap_));
  ctl_ = static_cast<Credit*>(pageAlloc(2 * sizeof(Credit)));  // [0]: the peer's credits; [1]: ours, to send
  if (!inbox_ || !outbox_ || !ctl_) return Status::SystemError(where + ": out of memory for the rings");
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  inboxMr_ = v.regMr(dev_->pd, inbox_, cap_, remote);
  outboxMr_ = inboxMr_ ? v.regMr(dev_->pd, outbox_, cap_, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  ctlMr_ = outboxMr_ ? v.regMr(dev_->pd, ctl_, 2 * sizeof(Credit), remote) : nullptr;
  if (!ctlMr_) {
    const int err = errno;
    return Status::SystemError(where + ": cannot register " + std::to_string((2 * cap_) >> 10) + " KiB of rings (" +
                               std::strerror(err) + "; ulimit -l is " + memlockText() +
                               "): raise the memlock limit (ulimit -l unlimited; docker --ulimit memlock=-1; "
                               "systemd LimitMEMLOCK=infinity), or lower BRAID_BUFFSIZE");
  }
  // The peer starts with kRecvDepth receives posted, as this side does.
  ctl_->fill(0, kRecvDepth, Advert{});
  peerPosted_ = kRecvDepth;
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.pkey_index = 0;
  init.port_num = static_cast<std::uint8_t>(dev_->port.port);
  init.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (int e = v.modifyQp(qp_, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return Status::SystemError(where + ": ibv_modify_qp to INIT failed: " + std::strerror(e));
  std::vector<ibv_recv_wr> wrs(kRecvDepth);
  for (int i = 0; i < kRecvDepth; ++i) wrs[static_cast<std::size_t>(i)].next = i + 1 < kRecvDepth ? &wrs[static_cast<std::size_t>(i) + 1] : nullptr;
  ibv_recv_wr* bad = nullptr;
  if (int e = qp_->context->ops.post_recv(qp_, wrs.data(), &bad))
    return Status::SystemError(where + ": ibv_post_recv failed: " + std::strerror(e));
  posted_ = kRecvDepth;
  return Status::Ok();
}

IbChannel::~IbChannel() {
  const Verbs& v = *dev_->verbs;
  if (qp_) v.destroyQp(qp_);
  dropZeroCopyMr();  // after the QP: nothing reads or writes them any more
  if (advMr_) endAdvert();
  if (ctlMr_) v.deregMr(ctlMr_);
  if (outboxMr_) v.deregMr(outboxMr_);
  if (inboxMr_) v.deregMr(inboxMr_);
  if (cq_) {
    dev_->drainEvents();
    v.destroyCq(cq_);
  }
  std::free(inbox_);
  std::free(outbox_);
  std::free(ctl_);
}

std::size_t IbChannel::zeroCopyFrom(const Config& config, std::size_t cap) {
  // auto: more than half the inbox. The tuner hands collectives pieces of at most half of it
  // (comm/tuner.cc), so only send/recv's larger pieces go zero copy: the rings' receivers copy
  // on (reduce, forward), and on a busy host the sender's wait for their adverts cost more than
  // the copy saved (docs/PERFORMANCE.md).
  return config.ibZcopyBytes == Config::kZcopyAuto ? cap / 2 + 1 : config.ibZcopyBytes;
}

IbEndpoint IbChannel::endpoint() const {
  IbEndpoint e;
  e.qpn = qp_->qp_num;
  e.psn = 0;
  e.inbox = reinterpret_cast<std::uint64_t>(inbox_);
  e.inboxKey = inboxMr_->rkey;
  e.ctl = reinterpret_cast<std::uint64_t>(ctl_);
  e.ctlKey = ctlMr_->rkey;
  return e;
}

Status IbChannel::connect(const IbEndpoint& remote, const IbRemotePort& port, const Config& config) {
  remote_ = remote;
  zcopyBytes_ = zeroCopyFrom(config, cap_);
  const Verbs& v = *dev_->verbs;
  const IbPort& me = dev_->port;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(me.attr.active_mtu, port.mtu));  // the smaller of both ends
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;  // 0.64 ms
  a.ah_attr.port_num = static_cast<std::uint8_t>(me.port);
  if (me.ethernet()) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = port.gid;
    a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(me.gidIndex);
    a.ah_attr.grh.hop_limit = 64;
  } else {
    a.ah_attr.dlid = port.lid;
  }
  const std::string where = this->where();
  if (int e = v.modifyQp(qp_, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return Status::SystemError(where + ": ibv_modify_qp to RTR failed: " + std::strerror(e));
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.sq_psn = 0;
  r.timeout = static_cast<std::uint8_t>(config.ibTimeout);
  r.retry_cnt = static_cast<std::uint8_t>(config.ibRetryCnt);
  r.rnr_retry = 7;  // receives are accounted for: an RNR NAK is only ever transient
  r.max_rd_atomic = 1;
  if (int e = v.modifyQp(qp_, &r, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                      IBV_QP_MAX_QP_RD_ATOMIC))
    return Status::SystemError(where + ": ibv_modify_qp to RTS failed: " + std::strerror(e));
  return Status::Ok();
}

Status IbChannel::fail(const ibv_wc& wc) {
  const Verbs& v = *dev_->verbs;
  const std::string words = v.wcStatusStr(wc.status);
  const std::string name = wcStatusName(wc.status);
  const std::string who = "rank " + std::to_string(peer_);
  const std::string via = "ib (" + dev_->port.name() + ")";
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
      return Status::RemoteError(who + " unreachable over " + via + ": " + words + " (" + name +
                                 "); it exited, or the fabric between the hosts is down: check the fabric, or "
                                 "BRAID_IB_TIMEOUT and BRAID_IB_RETRY_CNT");
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
      return Status::RemoteError(who + " refused a write over " + via + ": " + words + " (" + name +
                                 "); it ended its communicator, or the two ends disagree on their rings "
                                 "(BRAID_BUFFSIZE must match)");
    case IBV_WC_WR_FLUSH_ERR:
      return Status::RemoteError(via + " failed toward " + who + ": " + words + " (" + name +
                                 "): the queue pair had already failed; the first error, on this rank or on " + who +
                                 ", names the cause");
    default:
      return Status::RemoteError(via + " failed toward " + who + ": " + words + " (" + name + ", vendor error " +
                                 std::to_string(wc.vendor_err) + ")");
  }
}

bool IbChannel::readCredit() {
  const std::uint64_t h = ctl_->head, p = ctl_->posted, ap = ctl_->advPos, aa = ctl_->advAddr, al = ctl_->advLen,
                      ak = ctl_->advKey, c = ctl_->check;
  if (c != Credit::sum(h, p, ap, aa, al, ak)) return false;  // a write in progress: read it next time
  peerHead_ = std::max(peerHead_, h);
  peerPosted_ = std::max(peerPosted_, p);
  peerAdv_ = {ap, aa, al, static_cast<std::uint32_t>(ak)};
  return true;
}

std::string IbChannel::where() const {
  return "ib (" + dev_->port.name() + ") toward rank " + std::to_string(peer_);
}

Status IbChannel::protocolError(const std::string& what) const { return Status::Internal(where() + ": " + what); }

void IbChannel::poll() {
  if (!error_.ok()) return;
  ibv_wc wcs[32];
  int n = cq_->context->ops.poll_cq(cq_, 32, wcs);
  if (n == 0 && !armed_ && dev_->sleepSoon.load(std::memory_order_relaxed)) {
    // The waiter is about to sleep on the channel: arm the CQ so that the next completion wakes
    // it, then look once more (one may have come in between). Only then: an armed CQ costs an
    // event per completion (on the emulation, a system call on each end), and between the pieces
    // of a stream the waiter spins and yields instead of sleeping.
    cq_->context->ops.req_notify_cq(cq_, 0);
    armed_ = true;
    n = cq_->context->ops.poll_cq(cq_, 32, wcs);
  }
  if (n > 0 && armed_) {
    armed_ = false;
    dev_->drainEvents();
  }
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[i];
    if (wc.status != IBV_WC_SUCCESS) {
      if (error_.ok()) error_ = fail(wc);
      return;
    }
    if (wc.opcode & IBV_WC_RECV) {
      ++processed_;
      const std::uint32_t imm = ntohl(wc.imm_data);
      if (imm == kCreditImm) continue;
      if (imm & kDirectImm) {  // into the advertised buffer, at position tail_
        const std::uint64_t k = imm & ~kDirectImm;
        if (!advMr_ || tail_ < myAdv_.pos || tail_ + k > myAdv_.pos + myAdv_.len) {
          error_ = protocolError("a direct write of " + std::to_string(k) + " bytes at stream position " +
                                 std::to_string(tail_) + " that no advert covers (a bug in Braid)");
          return;
        }
        tail_ += k;
        direct_ += k;
        directTotal_ += k;
        if (tail_ == myAdv_.pos + myAdv_.len) endAdvert();
      } else {
        // Eager bytes before the advertised position (a header) leave the advert be; past it, the
        // sender went on eagerly and the advert is void.
        if (advMr_ && tail_ + imm > myAdv_.pos) endAdvert();
        tail_ += imm;
      }
    } else {
      --sqOutstanding_;
      if (!(wc.wr_id & kCreditWr)) acked_ = std::max(acked_, wc.wr_id);
    }
  }
  // Give back what was completed, a batch at a time.
  const std::uint64_t free = processed_ + kRecvDepth - posted_;
  if (free >= kRepostBatch) {
    ibv_recv_wr wrs[kRecvDepth];
    for (std::uint64_t i = 0; i < free; ++i) {
      wrs[i] = ibv_recv_wr{};
      wrs[i].next = i + 1 < free ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    if (int e = qp_->context->ops.post_recv(qp_, wrs, &bad)) {
      error_ = Status::SystemError(where() +
                                   ": ibv_post_recv failed: " + std::strerror(e));
      return;
    }
    posted_ += free;
  }
  maybeCredit();
}

void IbChannel::maybeCredit() {
  if (advUnsent_ || head_ - creditedHead_ >= cap_ / 4 || posted_ - creditedPosted_ >= kRecvDepth / 4) sendCredit();
}

Status IbChannel::post(ibv_send_wr& wr) {
  ibv_send_wr* bad = nullptr;
  if (int e = qp_->context->ops.post_send(qp_, &wr, &bad))
    return Status::SystemError(where() +
                               ": ibv_post_send failed: " + std::strerror(e));
  ++sqOutstanding_;
  if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) ++immSent_;
  return Status::Ok();
}

void IbChannel::sendCredit() {
  if (sqOutstanding_ >= kSqDepth || !error_.ok()) return;  // the next poll tries again
  // Inline, the bytes are taken at the post; otherwise from ctl_[1], which a later credit may
  // overwrite while the NIC reads it: the check word makes the peer ignore such a mix.
  Credit local;
  Credit& c = maxInline_ >= sizeof(Credit) ? local : ctl_[1];
  c.fill(head_, posted_, myAdv_);
  ibv_sge sge{reinterpret_cast<std::uint64_t>(&c), sizeof(Credit), ctlMr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kCreditWr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  // With an immediate (a completion that wakes the peer) when one of its receives is to spare;
  // the data path keeps the last one for this.
  const bool wake = immSent_ < peerPosted_;
  wr.opcode = wake ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.imm_data = htonl(kCreditImm);
  wr.send_flags = IBV_SEND_SIGNALED | (maxInline_ >= sizeof(Credit) ? IBV_SEND_INLINE : 0);
  wr.wr.rdma.remote_addr = remote_.ctl;
  wr.wr.rdma.rkey = remote_.ctlKey;
  Status s = post(wr);
  if (!s.ok()) {
    error_ = s;
    return;
  }
  creditedHead_ = head_;
  creditedPosted_ = posted_;
  advUnsent_ = false;
}

Result<std::size_t> IbChannel::trySend(const void* data, std::size_t n) {
  poll();
  if (!error_.ok()) return error_;
  if (zc_.data) return finishZeroCopy(data, n);
  if (n == 0) return std::size_t{0};
  readCredit();
  // A receive of the peer for each write, keeping one for a credit.
  if (immSent_ + 1 >= peerPosted_ || sqOutstanding_ >= kSqDepth - 1) return std::size_t{0};
  if (zeroCopy(n)) {
    const Advert& a = peerAdv_;
    if (a.len > 0 && a.pos <= sent_ && sent_ < a.pos + a.len && eagerEnd_ <= a.pos) {
      const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(n, a.pos + a.len - sent_));
      auto posted = postZeroCopy(data, k, a.addr + (sent_ - a.pos), a.key, kDirectImm | static_cast<std::uint32_t>(k));
      if (!posted.ok()) return posted.status();
      if (*posted) {
        directEnd_ = sent_;
        return finishZeroCopy(data, n);
      }
    } else if (awaitAdvert()) {
      return std::size_t{0};
    }
  }
  // Direct writes take no room in the inbox but do advance the stream: its ring skips them.
  const std::uint64_t inFlight = sent_ - std::min(peerHead_, acked_);
  if (inFlight >= cap_) return std::size_t{0};
  const std::size_t at = static_cast<std::size_t>(sent_ % cap_);
  std::size_t k = std::min({n, cap_ - static_cast<std::size_t>(inFlight), cap_ - at});
  // An advert for a position ahead (the payload after a header): eager bytes stop short of it.
  const Advert& a = peerAdv_;
  if (a.len > 0 && sent_ < a.pos && eagerEnd_ <= a.pos) k = std::min<std::size_t>(k, a.pos - sent_);
  if (zeroCopy(k)) {
    auto posted = postZeroCopy(data, k, remote_.inbox + at, remote_.inboxKey, static_cast<std::uint32_t>(k));
    if (!posted.ok()) return posted.status();
    if (*posted) {
      eagerEnd_ = sent_;
      return finishZeroCopy(data, n);
    }
  }
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(static_cast<std::uint32_t>(k));
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_.inbox + at;
  wr.wr.rdma.rkey = remote_.inboxKey;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (k <= maxInline_) {
    sge = {reinterpret_cast<std::uint64_t>(data), static_cast<std::uint32_t>(k), 0};
    wr.send_flags |= IBV_SEND_INLINE;
  } else {
    std::memcpy(outbox_ + at, data, k);
    sge = {reinterpret_cast<std::uint64_t>(outbox_ + at), static_cast<std::uint32_t>(k), outboxMr_->lkey};
  }
  wr.wr_id = sent_ + k;
  Status s = post(wr);
  if (!s.ok()) return error_ = s;
  sent_ += k;
  eagerEnd_ = sent_;
  return k;
}

bool IbChannel::awaitAdvert() {
  // The peer reads its inbox (it said so last): nothing to wait for.
  if (peerAdv_.pos != kNone && peerAdv_.len == 0) return false;
  // Its advert is for a position ahead: eager bytes go up to it.
  if (peerAdv_.pos != kNone && peerAdv_.pos > sent_ && eagerEnd_ <= peerAdv_.pos) return false;
  // It has eager bytes to read first: it advertises only once its inbox is empty.
  if (sent_ - std::max(peerHead_, directEnd_) > kWaitUnread) return false;
  const std::int64_t now = nowUs();
  if (waitPos_ != sent_) {
    waitPos_ = sent_;
    waitSinceUs_ = now;
    ++heldBack_;
  }
  return now - waitSinceUs_ < kAdvertWaitUs;
}

Result<bool> IbChannel::postZeroCopy(const void* data, std::size_t k, std::uint64_t remote, std::uint32_t rkey,
                                     std::uint32_t imm) {
  // braidMemAlloc memory has a registration kept for it, and with on-demand paging all memory
  // has; other memory is registered for this write, local access only (the NIC reads these
  // bytes). A registration refused (the memlock limit, or memory the device cannot take) is no
  // error: the piece goes through the outbox.
  ibv_mr* kept = dev_->keptMr(data, k, false);
  ibv_mr* mr = kept ? kept : dev_->verbs->regMr(dev_->pd, const_cast<void*>(data), k, 0);
  if (!mr) return false;
  ibv_sge sge{reinterpret_cast<std::uint64_t>(data), static_cast<std::uint32_t>(k), mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(imm);
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr_id = sent_ + k;
  Status s = post(wr);
  if (!s.ok()) {
    kept ? dev_->releaseKept(kept) : void(dev_->verbs->deregMr(mr));
    return error_ = s;
  }
  sent_ += k;
  zc_ = {data, k, sent_, kept ? nullptr : mr, kept};
  poll();  // an emulated (or very fast) write may have completed already
  return true;
}

// The bytes of a zero-copy write count as taken only once it completed: until then the caller
// keeps its memory as it is and calls again from the same place (the contract in transport.h).
Result<std::size_t> IbChannel::finishZeroCopy(const void* data, std::size_t n) {
  if (!error_.ok()) return error_;
  if (data != zc_.data || n < zc_.bytes)
    return error_ = protocolError("trySend went on from other bytes while a zero-copy write of " +
                                  std::to_string(zc_.bytes) + " bytes from the last ones was in flight");
  if (acked_ < zc_.end) return std::size_t{0};
  dropZeroCopyMr();
  const std::size_t k = zc_.bytes;
  zc_ = {};
  return k;
}

void IbChannel::dropZeroCopyMr() {
  if (zc_.mr) dev_->verbs->deregMr(zc_.mr);
  if (zc_.kept) dev_->releaseKept(zc_.kept);
  zc_.mr = zc_.kept = nullptr;
}

std::span<const std::byte> IbChannel::inboxView() const {
  // Direct bytes start at the advert's position; what comes before it (a header) is here.
  if (atDirect()) return {};  // the next bytes are in the caller's buffer, not here
  const std::uint64_t end = direct_ > 0 ? myAdv_.pos : tail_;
  const std::size_t at = static_cast<std::size_t>(head_ % cap_);
  const std::size_t k = std::min(static_cast<std::size_t>(end - head_), cap_ - at);
  return std::span<const std::byte>(inbox_ + at, k);
}

Result<std::span<const std::byte>> IbChannel::peek() {
  poll();
  if (!error_.ok()) return error_;
  auto view = inboxView();
  if (view.empty() && direct_ == 0 && !advMr_) advertiseEager();
  return view;
}

void IbChannel::consume(std::size_t n) {
  head_ += n;
  maybeCredit();
}

Result<std::size_t> IbChannel::tryRecv(void* dst, std::size_t n) {
  poll();
  if (!error_.ok()) return error_;
  if (n == 0) return std::size_t{0};
  const auto want = reinterpret_cast<std::uint64_t>(dst);
  if (atDirect() || (advMr_ && head_ >= myAdv_.pos)) {
    // An advert is out for this position: its buffer is where the caller goes on (transport.h).
    if (want != myAdv_.addr + (head_ - myAdv_.pos))
      return error_ = protocolError("tryRecv went on into other memory than the buffer it advertised");
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(direct_, n));
    direct_ -= k;
    head_ += k;
    if (k) maybeCredit();
    if (k || advMr_) return k;
  }
  std::size_t got = 0;
  for (int i = 0; i < 64 && got < n; ++i) {
    auto s = inboxView();
    if (s.empty()) {
      poll();
      if (!error_.ok()) return error_;
      s = inboxView();
      if (s.empty()) break;
    }
    const std::size_t k = std::min(n - got, s.size());
    std::memcpy(static_cast<std::byte*>(dst) + got, s.data(), k);
    consume(k);
    got += k;
  }
  if (zcopyBytes_ && !advMr_ && direct_ == 0) {
    // Advertise where the rest goes, once the inbox is empty: what expect() announced, else this
    // call's remainder. A reader that asks for less than the threshold reads eagerly, and says so:
    // a large sender would otherwise hold its pieces back for an advert that never comes.
    const std::uint64_t at = want + got;
    const bool announced = head_ >= wantPos_ && head_ < wantEnd_ && at == wantAddr_ + (head_ - wantPos_);
    const std::uint64_t len = announced ? wantEnd_ - head_ : n - got;
    // Bytes before an announced payload (its header): expect() chose already for what follows.
    const bool before = !announced && head_ <= wantPos_ && wantPos_ < wantEnd_;
    if (before) {
    } else if (!zeroCopy(len)) {
      advertiseEager();
    } else {
      advertiseAhead(head_, at, len);
    }
  }
  return got;
}

void IbChannel::expect(void* dst, std::size_t n, std::size_t after) {
  if (!zcopyBytes_ || direct_ > 0 || advMr_) return;  // off, or an advert is out already
  wantPos_ = head_ + after;
  wantEnd_ = wantPos_ + n;
  wantAddr_ = reinterpret_cast<std::uint64_t>(dst);
  poll();
  if (error_.ok() && zeroCopy(n)) advertiseAhead(wantPos_, wantAddr_, n);
}

void IbChannel::advertiseAhead(std::uint64_t pos, std::uint64_t addr, std::uint64_t n) {
  // From the first of these positions the sender cannot have passed: where they start while none
  // of them has come; else one ring past what this side has read, as a sender never has more
  // than a ring unread (it writes eagerly up to there, then into the buffer).
  const std::uint64_t start = std::max(head_, pos);
  const std::uint64_t from = tail_ <= start ? start : std::max(pos, head_ + cap_);
  if (from >= pos + n || !zeroCopy(pos + n - from)) return;
  advertise(from, reinterpret_cast<void*>(addr + (from - pos)), static_cast<std::size_t>(pos + n - from));
}

void IbChannel::advertise(std::uint64_t pos, void* dst, std::size_t n) {
  // A registration refused (the memlock limit, memory the device cannot take) only means eager,
  // for the rest of that buffer: it is not asked again at each poll.
  if (pos < refusedEnd_) return advertiseEager();
  const std::uint64_t len = std::min<std::uint64_t>(n, kMaxDirect);
  ibv_mr* kept = dev_->keptMr(dst, len, true);
  ibv_mr* mr = kept ? kept : dev_->verbs->regMr(dev_->pd, dst, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) {
    ++refused_;
    refusedEnd_ = pos + len;
    return advertiseEager();
  }
  advMr_ = mr;
  advKept_ = kept != nullptr;
  myAdv_ = {pos, reinterpret_cast<std::uint64_t>(dst), len, mr->rkey};
  advUnsent_ = true;
  sendCredit();
}

void IbChannel::advertiseEager() {
  // Only a sender that may be waiting needs to hear it: before any advert, and after one for a
  // buffer. A reader that never advertises buffers (small messages) thus never sends one.
  if (myAdv_.pos != kNone && myAdv_.len == 0) return;
  myAdv_ = {head_, 0, 0, 0};
  advUnsent_ = true;
  sendCredit();
}

void IbChannel::endAdvert() {
  advKept_ ? dev_->releaseKept(advMr_) : void(dev_->verbs->deregMr(advMr_));  // a kept one stays
  advMr_ = nullptr;
}

}  // namespace braid
