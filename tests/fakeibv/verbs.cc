// fakeibv's exported verbs: devices, contexts, protection domains, memory regions, completion
// channels and queues, shared receive queues and queue pairs (the control path). The data path
// (posting, polling) is engine.cc. Version nodes: libibverbs.map.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <csignal>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include "base/capability.h"
#include "tests/fakeibv/objects.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define FIBV_EXPORT extern "C" __attribute__((visibility("default")))

namespace fakeibv {

Counts& counts() {
  static Counts c;
  return c;
}

namespace {

std::mutex registry;
// The device's largest region (ibv_device_attr::max_mr_size): FAKEIBV_MAX_MR_SIZE bytes, read at
// each call so that a test can change it; 1 TiB without it.
std::uint64_t maxMrSize() {
  const char* m = setting("FAKEIBV_MAX_MR_SIZE");
  return m && *m ? std::strtoull(m, nullptr, 10) : 1ull << 40;
}
std::uint64_t registeredBytes = 0;  // this process's memory regions, against RLIMIT_MEMLOCK

template <typename T>
T fail(int err, T value) {
  errno = err;
  return value;
}

std::uint32_t randomKey() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::lock_guard<std::mutex> g(registry);
  return rng() | 1u;
}

Context* ctxOf(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}

int queryPortEx(ibv_context* c, std::uint8_t portNum, ibv_port_attr* a, std::size_t len) {
  const Port* p = portOf(ctxOf(c), portNum);
  if (!p) return EINVAL;
  ibv_port_attr out{};
  out.state = portDown(p->lid) ? IBV_PORT_DOWN : p->state;
  out.max_mtu = p->mtu;
  out.active_mtu = p->mtu;
  out.gid_tbl_len = static_cast<int>(p->gids.size());
  out.port_cap_flags = 0;
  out.max_msg_sz = 1u << 31;
  out.pkey_tbl_len = 1;
  out.lid = p->linkLayer == IBV_LINK_LAYER_INFINIBAND ? p->lid : 0;
  out.sm_lid = p->linkLayer == IBV_LINK_LAYER_INFINIBAND ? 1 : 0;
  out.max_vl_num = 1;
  out.active_width = 2;   // 4x
  out.active_speed = 32;  // EDR
  out.phys_state = out.state == IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp / Disabled
  out.link_layer = p->linkLayer;
  std::memcpy(a, &out, std::min(len, sizeof(out)));
  return 0;
}

int queryDeviceEx(ibv_context* c, const ibv_query_device_ex_input*, ibv_device_attr_ex* a, std::size_t size);

}  // namespace

std::size_t mtuBytes(ibv_mtu m) { return 128u << static_cast<int>(m); }

}  // namespace fakeibv

using namespace fakeibv;

// ---- devices and contexts

FIBV_EXPORT ibv_device** ibv_get_device_list(int* num) {
  const auto& all = devices();
  auto** list = static_cast<ibv_device**>(std::calloc(all.size() + 1, sizeof(ibv_device*)));
  for (std::size_t i = 0; i < all.size(); ++i) list[i] = &all[i]->dev;
  if (num) *num = static_cast<int>(all.size());
  return list;
}

FIBV_EXPORT void ibv_free_device_list(ibv_device** list) { std::free(list); }
FIBV_EXPORT const char* ibv_get_device_name(ibv_device* d) { return d->name; }
FIBV_EXPORT __be64 ibv_get_device_guid(ibv_device* d) { return htobe64(reinterpret_cast<Device*>(d)->guid); }
FIBV_EXPORT int ibv_get_device_index(ibv_device* d) { return reinterpret_cast<Device*>(d)->index; }

FIBV_EXPORT ibv_context* ibv_open_device(ibv_device* d) {
  static std::once_flag swept;
  std::call_once(swept, sweepDead);
  auto* c = new Context();
  c->device = reinterpret_cast<Device*>(d);
  verbs_context& v = c->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = queryPortEx;
  v.query_device_ex = queryDeviceEx;
  v.create_qp_ex = createQpEx;
  ibv_context& ctx = v.context;
  ctx.device = d;
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  ctx.ops.poll_cq = pollCq;
  ctx.ops.req_notify_cq = reqNotifyCq;
  ctx.ops.post_send = postSend;
  ctx.ops.post_recv = postRecv;
  ctx.ops.post_srq_recv = postSrqRecv;
  ctx.async_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);  // pollable; no async event is ever raised
  ctx.cmd_fd = -1;
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  counts().ctx++;
  counts().fd++;
  return &ctx;
}

FIBV_EXPORT int ibv_close_device(ibv_context* c) {
  ::close(c->async_fd);
  counts().fd--;
  counts().ctx--;
  delete ctxOf(c);
  return 0;
}

FIBV_EXPORT int ibv_query_device(ibv_context* c, ibv_device_attr* a) {
  Device* d = ctxOf(c)->device;
  std::memset(a, 0, sizeof(*a));
  std::snprintf(a->fw_ver, sizeof(a->fw_ver), "fakeibv 1.0");
  a->node_guid = htobe64(d->guid);
  a->sys_image_guid = htobe64(d->guid);
  a->max_mr_size = maxMrSize();
  a->page_size_cap = 4096;
  a->vendor_id = 0;
  a->vendor_part_id = 0;
  a->max_qp = 1 << 16;
  a->max_qp_wr = 1 << 15;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a->max_sge = kMaxSge;
  a->max_sge_rd = kMaxSge;
  a->max_cq = 1 << 16;
  a->max_cqe = 1 << 20;
  a->max_mr = static_cast<int>(kMrSlots);
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = 16;
  a->max_res_rd_atom = 1 << 16;
  a->max_qp_init_rd_atom = 16;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_srq = 1 << 10;
  a->max_srq_wr = 1 << 15;
  a->max_srq_sge = kMaxSge;
  a->max_pkeys = 1;
  a->phys_port_cnt = static_cast<std::uint8_t>(d->ports.size());
  return 0;
}

namespace fakeibv {
namespace {
int queryDeviceEx(ibv_context* c, const ibv_query_device_ex_input*, ibv_device_attr_ex* a, std::size_t size) {
  ibv_device_attr_ex out{};
  ibv_query_device(c, &out.orig_attr);
  if (const int odp = ctxOf(c)->device->odp) {  // RC only, as mlx5 reports it
    out.odp_caps.general_caps = IBV_ODP_SUPPORT | (odp > 1 ? IBV_ODP_SUPPORT_IMPLICIT : 0);
    out.odp_caps.per_transport_caps.rc_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
  }
  std::memcpy(a, &out, std::min(size, sizeof(out)));
  return 0;
}
}  // namespace
}  // namespace fakeibv

// Programs reach this only through verbs_context's query_port (the header's inline call); the
// exported one takes the same struct under its old name.
FIBV_EXPORT int ibv_query_port(ibv_context* c, std::uint8_t port, _compat_ibv_port_attr* a) {
  return queryPortEx(c, port, reinterpret_cast<ibv_port_attr*>(a), sizeof(ibv_port_attr));
}

FIBV_EXPORT int ibv_query_gid(ibv_context* c, std::uint8_t port, int index, ibv_gid* gid) {
  const Port* p = portOf(ctxOf(c), port);
  if (!p || index < 0 || index >= static_cast<int>(p->gids.size())) return fail(EINVAL, -1);
  *gid = p->gids[static_cast<std::size_t>(index)].gid;
  return 0;
}

static void fillGidEntry(const Port& p, int port, int index, ibv_gid_entry* e) {
  std::memset(e, 0, sizeof(*e));
  e->gid = p.gids[static_cast<std::size_t>(index)].gid;
  e->gid_index = static_cast<std::uint32_t>(index);
  e->port_num = static_cast<std::uint32_t>(port);
  e->gid_type = p.gids[static_cast<std::size_t>(index)].type;
  e->ndev_ifindex = 0;
}

FIBV_EXPORT int _ibv_query_gid_ex(ibv_context* c, std::uint32_t port, std::uint32_t index, ibv_gid_entry* entry,
                                  std::uint32_t flags, std::size_t entrySize) {
  const Port* p = portOf(ctxOf(c), static_cast<int>(port));
  if (flags || entrySize < sizeof(ibv_gid_entry)) return EINVAL;
  if (!p || index >= p->gids.size()) return ENODATA;
  fillGidEntry(*p, static_cast<int>(port), static_cast<int>(index), entry);
  return 0;
}

FIBV_EXPORT ssize_t _ibv_query_gid_table(ibv_context* c, ibv_gid_entry* entries, std::size_t max, std::uint32_t flags,
                                         std::size_t entrySize) {
  if (flags || entrySize < sizeof(ibv_gid_entry)) return -EINVAL;
  Context* ctx = ctxOf(c);
  std::size_t n = 0;
  for (std::size_t port = 1; port <= ctx->device->ports.size(); ++port) {
    const Port& p = ctx->device->ports[port - 1];
    for (std::size_t i = 0; i < p.gids.size(); ++i) {
      if (n == max) return -EINVAL;
      fillGidEntry(p, static_cast<int>(port), static_cast<int>(i), &entries[n++]);
    }
  }
  return static_cast<ssize_t>(n);
}

FIBV_EXPORT int ibv_query_pkey(ibv_context*, std::uint8_t, int index, __be16* pkey) {
  if (index != 0) return fail(EINVAL, -1);
  *pkey = htobe16(0xffff);
  return 0;
}

FIBV_EXPORT int ibv_get_pkey_index(ibv_context*, std::uint8_t, __be16 pkey) { return be16toh(pkey) == 0xffff ? 0 : -1; }

// ---- protection domains and memory regions

FIBV_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* c) {
  auto* p = new Pd();
  p->pd.context = c;
  p->key = randomKey();
  p->pd.handle = p->key;
  counts().pd++;
  return &p->pd;
}

FIBV_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  delete reinterpret_cast<Pd*>(pd);
  counts().pd--;
  return 0;
}

FIBV_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, unsigned access) {
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return fail<ibv_mr*>(EINVAL, nullptr);
  // On-demand paging: nothing is pinned, and the device follows the page tables at each access
  // (a write to memory unmapped since fails, as a page fault the kernel cannot resolve). Implicit:
  // NULL and SIZE_MAX register the whole address space.
  const bool onDemand = access & IBV_ACCESS_ON_DEMAND;
  const int odp = ctxOf(pd->context)->device->odp;
  const bool implicit = onDemand && addr == nullptr && length == SIZE_MAX;
  if (onDemand && (odp == 0 || (implicit && odp < 2))) return fail<ibv_mr*>(EINVAL, nullptr);
  if (!implicit && length > maxMrSize()) return fail<ibv_mr*>(EINVAL, nullptr);  // as a device refuses past max_mr_size
  if (implicit) iova = 0;
  // The kernel pins registered pages against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK;
  // so does the emulation (tests drop the capability with setpriv to see a low `ulimit -l`).
  if (!onDemand) {
    rlimit lim{};
    ::getrlimit(RLIMIT_MEMLOCK, &lim);
    static const bool ipcLock = braid::hasCapability(braid::kCapIpcLock);
    std::lock_guard<std::mutex> g(registry);
    if (!ipcLock && lim.rlim_cur != RLIM_INFINITY && registeredBytes + length > lim.rlim_cur)
      return fail<ibv_mr*>(ENOMEM, nullptr);
    registeredBytes += length;
  }
  MrSlot* table = mrTable();
  std::uint32_t start = randomKey() % kMrSlots;
  for (std::uint32_t k = 0; k < kMrSlots; ++k) {
    std::uint32_t i = (start + k) % kMrSlots;
    if (i == 0) continue;  // key 0 means free
    std::uint32_t expected = 0;
    const std::uint32_t busy = 0xffu;  // a key no lookup matches (generation 0xff is never issued)
    if (!table[i].key.compare_exchange_strong(expected, (i << 8) | busy)) continue;
    std::uint32_t key = (i << 8) | (1 + randomKey() % 0xfe);
    table[i].pid = selfPid();
    table[i].addr = iova;
    table[i].length = length;
    table[i].access = access;
    table[i].pd = reinterpret_cast<Pd*>(pd)->key;
    // the real address: iova's offset 0
    table[i].base = reinterpret_cast<std::uint64_t>(addr);
    table[i].key.store(key, std::memory_order_release);
    auto* m = new Mr();
    m->onDemand = onDemand;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->mr.handle = i;
    m->mr.lkey = key;
    m->mr.rkey = key;
    counts().mr++;
    counts().registrations++;
    return &m->mr;
  }
  std::lock_guard<std::mutex> g(registry);
  if (!onDemand) registeredBytes -= length;
  return fail<ibv_mr*>(ENOMEM, nullptr);
}

FIBV_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, std::size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<std::uint64_t>(addr), static_cast<unsigned>(access));
}

FIBV_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

FIBV_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  mrTable()[mr->handle].key.store(0, std::memory_order_release);
  if (!reinterpret_cast<Mr*>(mr)->onDemand) {
    std::lock_guard<std::mutex> g(registry);
    registeredBytes -= mr->length;
  }
  delete reinterpret_cast<Mr*>(mr);
  counts().mr--;
  return 0;
}

FIBV_EXPORT int ibv_rereg_mr(ibv_mr*, int, ibv_pd*, void*, std::size_t, int) { return EOPNOTSUPP; }
FIBV_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, std::uint64_t, std::size_t, std::uint64_t, int, int) {
  return fail<ibv_mr*>(EOPNOTSUPP, nullptr);
}

// ---- completion channels and queues

FIBV_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* c) {
  std::uint32_t id = ++ids().channel;
  std::string path = dir() + "/" + channelName(id, selfPid());
  ::unlink(path.c_str());
  if (::mkfifo(path.c_str(), 0600) != 0) return nullptr;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);  // read end; O_RDWR so it never sees EOF
  if (fd < 0) return nullptr;
  auto* ch = new Channel();
  ch->ch.context = c;
  ch->ch.fd = fd;
  ch->ch.refcnt = 0;
  ch->id = id;
  counts().channel++;
  counts().fd++;
  return &ch->ch;
}

FIBV_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* ch) {
  auto* c = reinterpret_cast<Channel*>(ch);
  if (ch->refcnt) return EBUSY;
  removeShared(channelName(c->id, selfPid()));
  ::close(ch->fd);
  delete c;
  counts().channel--;
  counts().fd--;
  return 0;
}

FIBV_EXPORT ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void* cqContext, ibv_comp_channel* channel, int) {
  if (cqe < 1 || cqe > (1 << 20)) return fail<ibv_cq*>(EINVAL, nullptr);
  auto* q = new Cq();
  std::uint32_t cap = static_cast<std::uint32_t>(cqe) + 1;
  q->bytes = SharedCq::bytes(cap);
  for (int tries = 0; tries < 64 && !q->sh; ++tries) {
    q->id = ++ids().cq;
    q->sh = static_cast<SharedCq*>(mapShared(cqName(q->id), q->bytes, true));
  }
  if (!q->sh) {
    delete q;
    return fail<ibv_cq*>(ENOMEM, nullptr);
  }
  initMutex(&q->sh->mu);
  q->sh->pid = selfPid();
  q->sh->cap = cap;
  q->sh->channel = channel ? reinterpret_cast<Channel*>(channel)->id : 0;
  q->sh->magic = kMagic;
  q->cq.context = c;
  q->cq.channel = channel;
  q->cq.cq_context = cqContext;
  q->cq.handle = q->id;
  q->cq.cqe = cqe;
  pthread_mutex_init(&q->cq.mutex, nullptr);
  pthread_cond_init(&q->cq.cond, nullptr);
  if (channel) ++channel->refcnt;
  registerCq(q);
  counts().cq++;
  return &q->cq;
}

FIBV_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  auto* q = reinterpret_cast<Cq*>(cq);
  unregisterCq(q);
  if (cq->channel) --cq->channel->refcnt;
  q->sh->magic = 0;
  removeShared(cqName(q->id));
  unmapShared(q->sh, q->bytes);
  delete q;
  counts().cq--;
  return 0;
}

FIBV_EXPORT int ibv_resize_cq(ibv_cq*, int) { return EOPNOTSUPP; }

FIBV_EXPORT int ibv_get_cq_event(ibv_comp_channel* ch, ibv_cq** cq, void** cqContext) {
  std::uint32_t id = 0;
  while (true) {
    ssize_t k = ::read(ch->fd, &id, sizeof(id));
    if (k == static_cast<ssize_t>(sizeof(id))) break;
    if (k < 0 && errno == EINTR) continue;
    return -1;  // EAGAIN when the program made the fd nonblocking
  }
  Cq* q = cqById(id);
  if (!q) return fail(EINVAL, -1);
  *cq = &q->cq;
  *cqContext = q->cq.cq_context;
  return 0;
}

FIBV_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned n) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += n;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

FIBV_EXPORT int ibv_get_async_event(ibv_context*, ibv_async_event*) { return fail(EAGAIN, -1); }
FIBV_EXPORT void ibv_ack_async_event(ibv_async_event*) {}

// ---- shared receive queues

FIBV_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (attr->attr.max_wr < 1 || attr->attr.max_wr > (1u << 15) || attr->attr.max_sge > kMaxSge)
    return fail<ibv_srq*>(EINVAL, nullptr);
  auto* s = new Srq();
  std::uint32_t cap = attr->attr.max_wr;
  s->bytes = RecvQueue::bytes(cap);
  for (int tries = 0; tries < 64 && !s->sh; ++tries) {
    s->id = ++ids().srq;
    s->sh = static_cast<RecvQueue*>(mapShared(srqName(s->id), s->bytes, true));
  }
  if (!s->sh) {
    delete s;
    return fail<ibv_srq*>(ENOMEM, nullptr);
  }
  initMutex(&s->sh->mu);
  s->sh->cap = cap;
  s->maxSge = attr->attr.max_sge ? attr->attr.max_sge : 1;
  s->srq.context = pd->context;
  s->srq.srq_context = attr->srq_context;
  s->srq.pd = pd;
  s->srq.handle = s->id;
  pthread_mutex_init(&s->srq.mutex, nullptr);
  pthread_cond_init(&s->srq.cond, nullptr);
  counts().srq++;
  return &s->srq;
}

FIBV_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  auto* s = reinterpret_cast<Srq*>(srq);
  removeShared(srqName(s->id));
  unmapShared(s->sh, s->bytes);
  delete s;
  counts().srq--;
  return 0;
}

FIBV_EXPORT int ibv_modify_srq(ibv_srq*, ibv_srq_attr*, int) { return EOPNOTSUPP; }

FIBV_EXPORT int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* a) {
  auto* s = reinterpret_cast<Srq*>(srq);
  a->max_wr = s->sh->cap;
  a->max_sge = s->maxSge;
  a->srq_limit = 0;
  return 0;
}
