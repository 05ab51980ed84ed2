// fakeibv's queue pairs (RC only) and their state machine, address handles, and the remaining
// exported calls that real programs and librdmacm link against.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/fakeibv/objects.h"

#define FIBV_EXPORT extern "C" __attribute__((visibility("default")))

using namespace fakeibv;

namespace {

template <typename T>
T fail(int err, T value) {
  errno = err;
  return value;
}

// FAKEIBV_FAULT (comma-separated faults), read when a QP is made, for what arrives at it:
//   rnr:N     the next N arrivals that need a receive find none (an RNR NAK each)
//   access:N  the Nth RDMA write or read to arrive, and every later one, fails its key check
int faultValue(const char* name) {
  const char* f = setting("FAKEIBV_FAULT");
  if (!f) return 0;
  std::string s = f, key = std::string(name) + ":";
  std::size_t k = s.find(key);
  return k == std::string::npos ? 0 : std::atoi(s.c_str() + k + key.size());
}

ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr_ex* a) {
  if (a->qp_type != IBV_QPT_RC) return fail<ibv_qp*>(EOPNOTSUPP, nullptr);
  ibv_qp_cap& c = a->cap;
  if (!a->send_cq || !a->recv_cq || c.max_send_wr > (1u << 15) || c.max_recv_wr > (1u << 15) ||
      c.max_send_sge > kMaxSge || c.max_recv_sge > kMaxSge || c.max_inline_data > 1024)
    return fail<ibv_qp*>(EINVAL, nullptr);
  auto* q = new Qp();
  q->ctx = reinterpret_cast<Context*>(reinterpret_cast<char*>(pd->context) - offsetof(verbs_context, context));
  q->scq = reinterpret_cast<Cq*>(a->send_cq);
  q->rcq = reinterpret_cast<Cq*>(a->recv_cq);
  q->srq = reinterpret_cast<Srq*>(a->srq);
  q->cap = c;
  if (q->cap.max_send_sge == 0) q->cap.max_send_sge = 1;
  if (q->cap.max_recv_sge == 0) q->cap.max_recv_sge = 1;
  q->sigAll = a->sq_sig_all != 0;
  std::uint32_t cap = q->srq ? 0 : std::max(c.max_recv_wr, 1u);
  q->bytes = SharedQp::bytes(cap);
  std::uint32_t qpn = 0;
  for (int tries = 0; tries < 64 && !q->sh; ++tries) {
    qpn = (++ids().qpn % 0xfffff0u) + 8;  // 24 bits; 0 and 1 are the special QPs
    q->sh = static_cast<SharedQp*>(mapShared(qpName(qpn), q->bytes, true));
  }
  if (!q->sh) {
    delete q;
    return fail<ibv_qp*>(ENOMEM, nullptr);
  }
  SharedQp& s = *q->sh;
  s.pid = selfPid();
  s.state.store(IBV_QPS_RESET);
  s.qpn = qpn;
  s.cq = q->rcq->id;
  s.srq = q->srq ? q->srq->id : 0;
  s.pd = reinterpret_cast<Pd*>(pd)->key;
  s.rnrInject.store(faultValue("rnr"));
  s.accessAfter.store(faultValue("access"));
  initMutex(&s.rq.mu);
  s.rq.cap = cap;
  s.magic = kMagic;
  ibv_qp& qp = q->qpx.qp_base;
  qp.context = pd->context;
  qp.qp_context = a->qp_context;
  qp.pd = pd;
  qp.send_cq = a->send_cq;
  qp.recv_cq = a->recv_cq;
  qp.srq = a->srq;
  qp.handle = qpn;
  qp.qp_num = qpn;
  qp.state = IBV_QPS_RESET;
  qp.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&qp.mutex, nullptr);
  pthread_cond_init(&qp.cond, nullptr);
  installQpEx(q);
  registerQp(q);
  counts().qp++;
  return &qp;
}

// ibv_modify_qp's attribute rules for RC (IB spec, table "QP state transition properties").
struct Transition {
  ibv_qp_state from, to;
  int required, optional;
};
const Transition kTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER},
};

bool allowed(ibv_qp_state from, ibv_qp_state to, int mask) {
  int attrs = mask & ~IBV_QP_STATE;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return attrs == 0 && (mask & IBV_QP_STATE);
  for (const Transition& t : kTransitions)
    if (t.from == from && t.to == to) return (attrs & t.required) == t.required && (attrs & ~(t.required | t.optional)) == 0;
  return false;
}

}  // namespace

namespace fakeibv {
ibv_qp* createQpEx(ibv_context*, ibv_qp_init_attr_ex* a) {
  if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD)) return fail<ibv_qp*>(EINVAL, nullptr);
  return createQp(a->pd, a);
}
}  // namespace fakeibv

FIBV_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  ibv_qp_init_attr_ex a{};
  a.qp_context = attr->qp_context;
  a.send_cq = attr->send_cq;
  a.recv_cq = attr->recv_cq;
  a.srq = attr->srq;
  a.cap = attr->cap;
  a.qp_type = attr->qp_type;
  a.sq_sig_all = attr->sq_sig_all;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  ibv_qp* qp = createQp(pd, &a);
  if (qp) attr->cap = reinterpret_cast<Qp*>(qp)->cap;
  return qp;
}

FIBV_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) { return &reinterpret_cast<Qp*>(qp)->qpx; }

FIBV_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  auto* q = reinterpret_cast<Qp*>(qp);
  std::lock_guard<std::recursive_mutex> g(q->mu);
  const auto cur = static_cast<ibv_qp_state>(q->sh->state.load());
  const ibv_qp_state to = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if (!allowed(cur, to, mask)) return EINVAL;
  if (mask & IBV_QP_PORT) {
    if (!portOf(q->ctx, attr->port_num)) return EINVAL;
    q->attr.port_num = attr->port_num;
  }
  const Port* port = portOf(q->ctx, q->attr.port_num ? q->attr.port_num : 1);
  if (mask & IBV_QP_PATH_MTU) {
    if (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > port->mtu) return EINVAL;
    q->attr.path_mtu = attr->path_mtu;
  }
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = attr->ah_attr;
    if (port->linkLayer == IBV_LINK_LAYER_ETHERNET) {
      if (!ah.is_global || ah.grh.sgid_index >= port->gids.size()) return EINVAL;
    } else if (ah.dlid == 0 && !ah.is_global) {
      return EINVAL;
    }
    if (ah.is_global && ah.grh.sgid_index >= port->gids.size()) return EINVAL;
    q->attr.ah_attr = ah;
  }
  if (mask & IBV_QP_ACCESS_FLAGS) q->attr.qp_access_flags = attr->qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) q->attr.pkey_index = attr->pkey_index;
  if (mask & IBV_QP_DEST_QPN) q->attr.dest_qp_num = attr->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) q->attr.rq_psn = attr->rq_psn;
  if (mask & IBV_QP_SQ_PSN) q->attr.sq_psn = attr->sq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q->attr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q->attr.max_rd_atomic = attr->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) q->attr.min_rnr_timer = attr->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) q->attr.timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) q->attr.retry_cnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) q->attr.rnr_retry = attr->rnr_retry;
  SharedQp& s = *q->sh;
  s.access = q->attr.qp_access_flags;
  s.minRnrTimer = q->attr.min_rnr_timer;
  s.port = q->attr.port_num;
  s.lid = port->lid;
  s.linkLayer = port->linkLayer;
  s.mtu = static_cast<std::uint32_t>(mtuBytes(port->mtu));
  const int sgid = q->attr.ah_attr.is_global ? q->attr.ah_attr.grh.sgid_index : 0;
  if (sgid < static_cast<int>(port->gids.size())) {
    std::memcpy(s.gid, port->gids[static_cast<std::size_t>(sgid)].gid.raw, 16);
    s.gidType = static_cast<std::uint8_t>(port->gids[static_cast<std::size_t>(sgid)].type);
  }
  if (to == IBV_QPS_RTR && cur != IBV_QPS_RTR) mapPeer(q);
  if (to == IBV_QPS_RESET) {
    unmapPeer(q);
    q->sq.clear();
    lock(&s.rq.mu);
    s.rq.head = s.rq.tail = 0;
    unlock(&s.rq.mu);
    q->recvFlushed = false;
  }
  s.state.store(to);
  qp->state = to;
  if (to == IBV_QPS_ERR) flushQp(q);
  return 0;
}

FIBV_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  auto* q = reinterpret_cast<Qp*>(qp);
  std::lock_guard<std::recursive_mutex> g(q->mu);
  *attr = q->attr;
  attr->qp_state = static_cast<ibv_qp_state>(q->sh->state.load());
  attr->cur_qp_state = attr->qp_state;
  attr->cap = q->cap;
  qp->state = attr->qp_state;
  if (init) {
    std::memset(init, 0, sizeof(*init));
    init->qp_context = qp->qp_context;
    init->send_cq = qp->send_cq;
    init->recv_cq = qp->recv_cq;
    init->srq = qp->srq;
    init->cap = q->cap;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = q->sigAll;
  }
  return 0;
}

FIBV_EXPORT int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, std::uint32_t) { return 1; }

FIBV_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  auto* q = reinterpret_cast<Qp*>(qp);
  unregisterQp(q);
  {
    std::lock_guard<std::recursive_mutex> g(q->mu);
    unmapPeer(q);
    q->sh->state.store(IBV_QPS_RESET);
    q->sh->magic = 0;
    removeShared(qpName(qp->qp_num));
    unmapShared(q->sh, q->bytes);
  }
  delete q;
  counts().qp--;
  return 0;
}

// ---- address handles (UD only; RC programs such as perftest create none, but link the calls)

FIBV_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr*) {
  auto* ah = new ibv_ah();
  ah->context = pd->context;
  ah->pd = pd;
  counts().ah++;
  return ah;
}

FIBV_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  delete ah;
  counts().ah--;
  return 0;
}

FIBV_EXPORT int ibv_init_ah_from_wc(ibv_context*, std::uint8_t, ibv_wc*, ibv_grh*, ibv_ah_attr*) { return EOPNOTSUPP; }
FIBV_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd*, ibv_wc*, ibv_grh*, std::uint8_t) {
  return fail<ibv_ah*>(EOPNOTSUPP, nullptr);
}

// ---- the rest: multicast, fork, sysfs, strings, kernel-ABI copies (librdmacm links them; the
// emulation has no rdma_cm, so it never gets far enough to call them), ECE, imports.

FIBV_EXPORT int ibv_attach_mcast(ibv_qp*, const ibv_gid*, std::uint16_t) { return EOPNOTSUPP; }
FIBV_EXPORT int ibv_detach_mcast(ibv_qp*, const ibv_gid*, std::uint16_t) { return EOPNOTSUPP; }
FIBV_EXPORT int ibv_fork_init() { return 0; }
FIBV_EXPORT ibv_fork_status ibv_is_fork_initialized() { return IBV_FORK_UNNEEDED; }
FIBV_EXPORT int ibv_dontfork_range(void*, std::size_t) { return 0; }
FIBV_EXPORT int ibv_dofork_range(void*, std::size_t) { return 0; }
FIBV_EXPORT const char* ibv_get_sysfs_path() { return "/sys"; }

FIBV_EXPORT int ibv_read_sysfs_file(const char* d, const char* file, char* buf, std::size_t size) {
  std::string path = std::string(d) + "/" + file;
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return -1;
  std::size_t n = std::fread(buf, 1, size ? size - 1 : 0, f);
  std::fclose(f);
  if (size) buf[n] = 0;
  if (n && buf[n - 1] == '\n') buf[--n] = 0;
  return static_cast<int>(n);
}

FIBV_EXPORT const char* ibv_node_type_str(ibv_node_type t) {
  return t == IBV_NODE_CA ? "InfiniBand channel adapter" : t == IBV_NODE_RNIC ? "iWARP NIC" : "unknown";
}

FIBV_EXPORT const char* ibv_port_state_str(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "PORT_DOWN";
    case IBV_PORT_INIT: return "PORT_INIT";
    case IBV_PORT_ARMED: return "PORT_ARMED";
    case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
    default: return "PORT_NOP";
  }
}

FIBV_EXPORT const char* ibv_event_type_str(ibv_event_type) { return "async event"; }

// In our own words, what each completion status means to the person reading the log.
FIBV_EXPORT const char* ibv_wc_status_str(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "work request flushed";
    case IBV_WC_MW_BIND_ERR: return "memory window bind error";
    case IBV_WC_BAD_RESP_ERR: return "bad response";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "remote aborted";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout";
    case IBV_WC_GENERAL_ERR: return "general error";
    default: return "unknown";
  }
}

FIBV_EXPORT int ibv_rate_to_mult(ibv_rate r) { return static_cast<int>(r); }
FIBV_EXPORT int ibv_rate_to_mbps(ibv_rate r) { return static_cast<int>(r) * 2500; }
FIBV_EXPORT void ibv_copy_qp_attr_from_kern(void* dst, const void*) { std::memset(dst, 0, sizeof(ibv_qp_attr)); }
FIBV_EXPORT void ibv_copy_ah_attr_from_kern(void* dst, const void*) { std::memset(dst, 0, sizeof(ibv_ah_attr)); }
FIBV_EXPORT void ibv_copy_path_rec_from_kern(void*, const void*) {}
FIBV_EXPORT void ibv_copy_path_rec_to_kern(void*, const void*) {}
FIBV_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, std::uint8_t*, std::uint16_t*) { return EOPNOTSUPP; }
FIBV_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
FIBV_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
FIBV_EXPORT ibv_context* ibv_import_device(int) { return fail<ibv_context*>(EOPNOTSUPP, nullptr); }
FIBV_EXPORT ibv_pd* ibv_import_pd(ibv_context*, std::uint32_t) { return fail<ibv_pd*>(EOPNOTSUPP, nullptr); }
FIBV_EXPORT ibv_mr* ibv_import_mr(ibv_pd*, std::uint32_t) { return fail<ibv_mr*>(EOPNOTSUPP, nullptr); }
FIBV_EXPORT ibv_dm* ibv_import_dm(ibv_context*, std::uint32_t) { return fail<ibv_dm*>(EOPNOTSUPP, nullptr); }
FIBV_EXPORT void ibv_unimport_pd(ibv_pd*) {}
FIBV_EXPORT void ibv_unimport_mr(ibv_mr*) {}
FIBV_EXPORT void ibv_unimport_dm(ibv_dm*) {}
FIBV_EXPORT int ibv_register_driver(const char*, void*) { return 0; }

// Not a verbs call: what this process holds, for leak checks ("ctx=1 pd=1 mr=2 ...").
FIBV_EXPORT int fakeibv_live(char* out, std::size_t n) {
  Counts& c = counts();
  return std::snprintf(out, n, "ctx=%d pd=%d mr=%d cq=%d qp=%d srq=%d channel=%d ah=%d fd=%d", c.ctx.load(), c.pd.load(),
                       c.mr.load(), c.cq.load(), c.qp.load(), c.srq.load(), c.channel.load(), c.ah.load(), c.fd.load());
}

// Not a verbs call either: what the emulated NIC of this process met ("rnr_naks=2 ..."), so that
// tests can tell that an injected fault happened.
FIBV_EXPORT int fakeibv_stats(char* out, std::size_t n) {
  Counts& c = counts();
  return std::snprintf(out, n, "rnr_naks=%d no_response=%d access_errors=%d registrations=%d", c.rnrNaks.load(),
                       c.noResponse.load(), c.accessErrors.load(), c.registrations.load());
}

// FAKEIBV_REPORT=FILE: at exit, append "PID live ..." to FILE, so a test can check that a program
// it ran released everything.
__attribute__((destructor)) static void reportAtExit() {
  const char* path = setting("FAKEIBV_REPORT");
  if (!path || !*path) return;
  char buf[256];
  fakeibv_live(buf, sizeof(buf));
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%d live %s\n", getpid(), buf);
    std::fclose(f);
  }
}
