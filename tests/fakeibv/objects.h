// fakeibv's objects inside one process: each verbs struct a program sees is the first member of
// one of these, so the pointer it hands back leads to the rest.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "tests/fakeibv/shared.h"

namespace fakeibv {

struct Port {
  ibv_port_state state = IBV_PORT_ACTIVE;
  std::uint8_t linkLayer = IBV_LINK_LAYER_INFINIBAND;
  ibv_mtu mtu = IBV_MTU_4096;
  std::uint16_t lid = 0;   // InfiniBand: the port's LID; also names its down.LID file on Ethernet
  struct Gid {
    ibv_gid gid;
    ibv_gid_type type;
  };
  std::vector<Gid> gids;
};

struct Device {
  ibv_device dev;  // first: programs hold &dev
  int index = 0;
  int numa = -1;
  int odp = 2;  // on-demand paging: 0 none, 1 explicit (per range), 2 implicit too
  std::uint64_t guid = 0;
  std::vector<Port> ports;
};

struct Context {
  verbs_context vctx;  // ibv_context at its end
  Device* device;
};

struct Pd {
  ibv_pd pd;
  std::uint32_t key;
};

struct Mr {
  ibv_mr mr;
  bool onDemand = false;  // not pinned: not counted against RLIMIT_MEMLOCK
};

struct Channel {
  ibv_comp_channel ch;
  std::uint32_t id;
};

struct Cq {
  ibv_cq cq;
  std::uint32_t id;
  SharedCq* sh;
  std::size_t bytes;
};

struct Srq {
  ibv_srq srq;
  std::uint32_t id;
  RecvQueue* sh;
  std::size_t bytes;
  std::uint32_t maxSge;
};

// One send work request as the emulated NIC holds it until it completes.
struct SendWr {
  std::uint64_t wrId = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  std::uint32_t imm = 0;
  std::uint64_t remoteAddr = 0;
  std::uint32_t rkey = 0;
  std::vector<ibv_sge> sge;
  std::string inlineData;  // IBV_SEND_INLINE: the bytes, copied at post time
  bool isInline = false;
  std::chrono::steady_clock::time_point giveUpAt{};   // no response by then: retries exceeded
  std::chrono::steady_clock::time_point nextTry{};    // after an RNR NAK
  int rnrTries = 0;
  bool waiting = false;
};

struct Qp {
  ibv_qp_ex qpx;  // first: ibv_qp is its first member
  Context* ctx;
  SharedQp* sh;
  std::size_t bytes;
  Cq* scq;
  Cq* rcq;
  Srq* srq;
  ibv_qp_cap cap;
  bool sigAll;
  ibv_qp_attr attr{};  // what modify_qp set
  // The peer, once RTR gave its number.
  SharedQp* peer = nullptr;
  std::size_t peerBytes = 0;
  SharedCq* peerCq = nullptr;
  std::size_t peerCqBytes = 0;
  RecvQueue* peerSrq = nullptr;
  std::size_t peerSrqBytes = 0;
  std::recursive_mutex mu;
  std::deque<SendWr> sq;       // posted, not yet complete
  std::vector<SendWr> building;  // ibv_wr_start .. ibv_wr_complete
  bool recvFlushed = false;
};

// Live objects of this process, for leak checks (fakeibv_live).
struct Counts {
  std::atomic<int> ctx{0}, pd{0}, mr{0}, cq{0}, qp{0}, srq{0}, channel{0}, ah{0}, fd{0};
  // What the NIC met as a requester (fakeibv_stats): RNR NAKs, requests that got no response
  // (each counted once), remote access errors.
  std::atomic<int> rnrNaks{0}, noResponse{0}, accessErrors{0};
  std::atomic<int> registrations{0};  // memory regions registered in all (mr counts the live ones)
};
Counts& counts();

// engine.cc
int pollCq(ibv_cq* cq, int n, ibv_wc* wc);
int reqNotifyCq(ibv_cq* cq, int solicitedOnly);
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int postSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
void installQpEx(Qp* q);
void registerQp(Qp* q);
void unregisterQp(Qp* q);
void flushQp(Qp* q);          // the QP went to ERR: complete what it holds with IBV_WC_WR_FLUSH_ERR
void mapPeer(Qp* q);          // after RTR: the peer's shared state
void unmapPeer(Qp* q);
Cq* cqById(std::uint32_t id);  // this process's CQ, or null
void registerCq(Cq* cq);
void unregisterCq(Cq* cq);

// qp.cc
ibv_qp* createQpEx(ibv_context* c, ibv_qp_init_attr_ex* init);

// devices.cc
const std::vector<Device*>& devices();
const Port* portOf(const Context* c, int port);
std::size_t mtuBytes(ibv_mtu m);

}  // namespace fakeibv
