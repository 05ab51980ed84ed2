// fakeibv: a user-space emulation of libibverbs for tests (never installed). This header holds the
// state that processes share: files under one directory (FAKEIBV_DIR, default /tmp/fakeibv-UID),
// which every test host of tools/testhosts sees (they have their own network namespace and their
// own /dev/shm, but one /tmp and one PID namespace). Payload bytes move between processes with
// process_vm_writev / process_vm_readv, as a NIC's DMA would: the target's CPU does nothing.
//
//   ids         counters for QP numbers and CQ / SRQ / channel ids
//   mrs         the table of memory regions (key -> owner pid, range, access)
//   qp.N        one queue pair: its owner, state, address and receive queue
//   cq.N        one completion queue: a ring of work completions that peers append to
//   srq.N       one shared receive queue
//   ch.PID.N    a completion channel of process PID: a FIFO; a notifier writes the CQ's id
//   down.LID    present while the port with that LID is DOWN (tests create it to cut a port)
#pragma once
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <string>

#include <infiniband/verbs.h>

namespace fakeibv {

constexpr std::uint32_t kMagic = 0x46494256;  // "FIBV"
constexpr int kMaxSge = 4;
constexpr std::uint32_t kMrSlots = 1u << 16;

// The emulation's own variables (FAKEIBV_*), read here only; null when unset.
const char* setting(const char* name);

const std::string& dir();
// Maps the file `name` under dir() (created with `bytes` when `create`, exclusively); null if absent.
void* mapShared(const std::string& name, std::size_t bytes, bool create);
void unmapShared(void* p, std::size_t bytes);
void removeShared(const std::string& name);
std::size_t sharedSize(const std::string& name);  // 0 if absent

// getpid(), without a system call each time (once per process; a fork's child asks again).
int selfPid();

// A process-shared robust mutex (survives an owner that died holding it).
void initMutex(pthread_mutex_t* m);
void lock(pthread_mutex_t* m);
inline void unlock(pthread_mutex_t* m) { pthread_mutex_unlock(m); }

struct Ids {
  std::atomic<std::uint32_t> qpn, cq, srq, channel;
};
Ids& ids();

struct MrSlot {
  std::atomic<std::uint32_t> key;  // 0: free
  std::int32_t pid;
  std::uint64_t addr, length;  // addr: the I/O virtual address peers name (ibv_reg_mr_iova2)
  std::uint32_t access;
  std::uint32_t pd;
  std::uint64_t base;          // where addr is in the owner's memory
};
MrSlot* mrTable();
// The slot of `key` if it is live and `pid`'s, else null.
MrSlot* findMr(std::uint32_t key, int pid);

struct RecvEntry {
  std::uint64_t wrId;
  std::uint32_t numSge;
  std::uint32_t qpn;  // for an SRQ entry: filled in when consumed
  ibv_sge sge[kMaxSge];
};

struct RecvQueue {
  pthread_mutex_t mu;
  std::uint32_t cap;
  std::uint64_t head, tail;  // consumed, posted
  RecvEntry e[1];
  static std::size_t bytes(std::uint32_t cap) { return sizeof(RecvQueue) + sizeof(RecvEntry) * cap; }
};

struct SharedQp {
  std::uint32_t magic;
  std::int32_t pid;
  std::atomic<int> state;  // enum ibv_qp_state
  std::uint32_t qpn;
  std::uint16_t lid;
  std::uint8_t gid[16];
  std::uint8_t linkLayer;
  std::uint8_t gidType;   // enum ibv_gid_type of the GID it sends from (RoCE v1 and v2 do not meet)
  std::uint8_t minRnrTimer;
  std::uint8_t port;
  std::atomic<int> rnrInject;  // FAKEIBV_FAULT=rnr:N of the owner: the next N arrivals see no receive
  std::atomic<int> accessAfter;  // FAKEIBV_FAULT=access:N: the Nth RDMA on is refused (0: never; -1: refusing)
  std::uint32_t access;  // qp_access_flags
  std::uint32_t cq;      // receive CQ id
  std::uint32_t srq;     // SRQ id, 0 when none
  std::uint32_t pd;
  std::uint32_t mtu;     // bytes
  RecvQueue rq;          // cap 0 with an SRQ
  static std::size_t bytes(std::uint32_t cap) { return offsetof(SharedQp, rq) + RecvQueue::bytes(cap); }
};

struct CqSlot {
  ibv_wc wc;
};

struct SharedCq {
  std::uint32_t magic;
  std::int32_t pid;
  pthread_mutex_t mu;
  std::uint32_t cap;
  std::uint32_t channel;  // 0: none
  std::uint32_t id;       // what a notifier writes into the channel
  std::atomic<std::uint64_t> head, tail;  // polled, written
  std::atomic<int> armed;
  std::atomic<int> overrun;
  CqSlot e[1];
  static std::size_t bytes(std::uint32_t cap) { return sizeof(SharedCq) + sizeof(CqSlot) * cap; }
};

// Appends a completion to `cq` (any process may); false if it was full (the CQ overran).
bool pushCompletion(SharedCq* cq, const ibv_wc& wc);
// Wakes the channel of `cq` if it was armed.
void notify(SharedCq* cq);

std::string qpName(std::uint32_t qpn);
std::string cqName(std::uint32_t id);
std::string srqName(std::uint32_t id);
std::string channelName(std::uint32_t id, int ownerPid);
// Removes what processes that died left under dir(): QP, CQ and channel files, MR slots.
void sweepDead();
bool portDown(std::uint16_t lid);

}  // namespace fakeibv
