// The ib data path: one RC queue pair per channel. Each side owns an inbox ring that the peer
// writes into with RDMA WRITE WITH IMMEDIATE (the immediate is the length; the receiver learns
// what arrived from its completions, in order), and a small control block where the peer writes
// its credits: how far it has read this side's writes, and how many receives it has posted (a
// write with immediate consumes one). Credits go back as an inline RDMA write into the control
// block, with an immediate (so that a sleeping peer wakes) when the peer has a receive to spare.
// The sender stages its bytes in an outbox that mirrors the peer's inbox, or sends them inline
// when they are few.
//
// Zero copy, for pieces of BRAID_IB_ZCOPY_BYTES and more (by default those of more than half the
// inbox, which only send/recv hands a channel: on the verbs emulation zero copy made 4-rank
// all-reduce slower, docs/PERFORMANCE.md, and 2-process streaming twice as fast). Such a piece is written straight from
// the caller's memory (registered for that write), and trySend reports it taken once the write
// has completed. Rendezvous (zero copy on both sides): a receiver that is told where a large
// payload goes (expect, which the engine calls before it reads the message's header) or asks for
// a large piece (tryRecv) registers the destination and advertises it with its credits (the
// stream position it is for, address, length, rkey). The position is the first one the sender
// cannot have passed: the payload's start while none of it has come, else one ring past what
// the receiver has read (a sender never has more than a ring unread). A sender before that
// position writes eagerly up to it; at it, it writes the caller's bytes straight into the
// advertised buffer (the immediate flags such a write), so the bytes cross once. A sender that
// finds the peer has read (nearly) everything but no advert for its position waits for one a
// short bounded time (kAdvertWaitUs), then sends eagerly; it does not wait once the peer said
// "eager", which a reader that peeks (reduce on receive) says when its inbox is empty and its
// last advert was for a buffer (or it made none yet). An eager write past an advert's position
// voids it on both ends (the stream is in order, so both see the same), which is what keeps a
// late advert harmless. braidMemAlloc memory is registered once per allocation and kept until its
// free (IbDevice::ownedMr). Other memory, on a device with on-demand paging, goes through ODP
// registrations the device keeps (IbDevice::keptMr: nothing pinned, so they stay right across a
// free); without it, it is registered per message and dropped at its completion, so nothing can
// outlive the memory it describes. Completions are polled by the progress
// path; a waiter sleeps on the completion channel (IbDevice::channel), armed on the pass before
// it sleeps (IbDevice::sleepSoon).
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/config.h"
#include "transport/ib/ib_port.h"
#include "transport/transport.h"

namespace braid {

// One opened port with the objects every channel on it shares.
struct IbDevice {
  IbDevice() = default;
  IbDevice(const IbDevice&) = delete;
  IbDevice& operator=(const IbDevice&) = delete;
  std::shared_ptr<const Verbs> verbs;
  IbPort port;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;  // nonblocking; every CQ's events
  // Raised by the waiter before it sleeps on `channel`: a channel's poll that finds nothing arms
  // its CQ then (WaitSources::beforeSleep). Not before: an armed CQ costs an event per completion.
  std::atomic<bool> sleepSoon{false};
  ~IbDevice();
  // braidMemAlloc memory's registrations: one per allocation (local and remote write, over all of
  // it), made at its first use and kept until braidMemFree, which drops it (owned::listen). Null
  // if [p, p + n) is not such memory or the device refused it; the caller then registers per use.
  ibv_mr* ownedMr(const void* p, std::size_t n);
  void keepOwnedRegistrations();  // once the PD exists: listens for frees
  std::uint64_t ownedRegistrations() const;  // how many are kept now
  // On-demand paging (BRAID_IB_ODP), once the PD exists, where the device offers it for RC
  // writes: the device then follows the process's page tables instead of pinning pages, so a
  // registration stays right when its memory is freed and the addresses are used again. With
  // implicit ODP, one registration of the whole address space, local access only, serves every
  // zero-copy write's source; buffers peers write into (adverts) get one per range, kept in a
  // small cache (kOdpRanges, least recently used out). Returns what it set up, in words.
  std::string useOnDemandPaging();
  // A registration kept for [p, p + n), with remote write if `remote`: braidMemAlloc memory's,
  // else an on-demand one; null: register for this use. Each non-null one is given back with
  // releaseKept when its use ends.
  ibv_mr* keptMr(const void* p, std::size_t n, bool remote);
  void releaseKept(ibv_mr* mr);
  std::uint64_t odpRanges() const;  // how many range registrations the cache holds now
  static constexpr std::size_t kOdpRanges = 16;
  // Takes and acknowledges every event queued on the channel.
  void drainEvents();

 private:
  mutable std::mutex ownedMu_;
  std::map<std::uint64_t, ibv_mr*> owned_;  // by allocation id
  std::set<std::uint64_t> refusedOwned_;  // ids the device refused: not asked again
  std::uint64_t listenToken_ = 0;
  ibv_mr* odpAll_ = nullptr;  // implicit ODP: the whole address space, local access
  bool odpRangesOn_ = false;
  struct OdpRange {
    std::uint64_t begin, end;
    ibv_mr* mr;
    bool remote;  // registered for the peer's writes too
    int uses;
    std::uint64_t lastUse;
  };
  std::vector<OdpRange> odp_;  // under ownedMu_
  std::uint64_t odpClock_ = 0;
};

// What the peer's channel needs to reach this one.
struct IbEndpoint {
  std::uint32_t qpn = 0, psn = 0;
  std::uint64_t inbox = 0, ctl = 0;
  std::uint32_t inboxKey = 0, ctlKey = 0;
};

// The peer's port, from its published address.
struct IbRemotePort {
  std::uint16_t lid = 0;
  ibv_gid gid{};
  int mtu = IBV_MTU_1024;  // enum ibv_mtu
  bool ethernet = false;
};

class IbChannel final : public Channel {
 public:
  static Result<std::unique_ptr<IbChannel>> create(std::shared_ptr<IbDevice> dev, int peer, std::size_t cap);
  // The smallest piece that goes zero copy on a channel with a `cap`-byte inbox (0: none does).
  static std::size_t zeroCopyFrom(const Config& config, std::size_t cap);
  ~IbChannel() override;
  IbEndpoint endpoint() const;
  // INIT -> RTR -> RTS toward the peer's channel.
  Status connect(const IbEndpoint& remote, const IbRemotePort& port, const Config& config);

  Result<std::size_t> trySend(const void* data, std::size_t n) override;
  Result<std::span<const std::byte>> peek() override;
  void consume(std::size_t n) override;
  Result<std::size_t> tryRecv(void* dst, std::size_t n) override;
  void expect(void* dst, std::size_t n, std::size_t after) override;
  // Its CQ's event was taken (IbDevice::drainEvents): the CQ is no longer armed.
  void disarm() { armed_ = false; }
  // Bytes received straight into the reader's buffers (rendezvous), of all received so far.
  std::uint64_t directBytes() const { return directTotal_; }
  // How often this sender held a large piece back for the peer's advert (at most kAdvertWaitUs).
  std::uint64_t heldBack() const { return heldBack_; }
  // How many braidMemAlloc registrations this channel's device keeps (IbDevice::ownedMr).
  std::uint64_t ownedRegistrations() const { return dev_->ownedRegistrations(); }
  // How many range registrations this channel's device caches (on-demand paging).
  std::uint64_t odpRanges() const { return dev_->odpRanges(); }
  // How many of this reader's adverts the device refused to register.
  std::uint64_t refusedAdverts() const { return refused_; }

 private:
  struct Credit;  // the control block's layout
  IbChannel(std::shared_ptr<IbDevice> dev, int peer, std::size_t cap);
  Status setup();
  void poll();
  Status post(ibv_send_wr& wr);
  void sendCredit();
  void maybeCredit();  // when enough was read or reposted since the last credit
  Status fail(const ibv_wc& wc);
  bool readCredit();
  // A write straight from `data` (k bytes at inbox offset `at`); false if its memory could not be
  // registered (the caller then stages it in the outbox).
  // into the peer's memory at `remote` (its inbox, or the buffer it advertised).
  Result<bool> postZeroCopy(const void* data, std::size_t k, std::uint64_t remote, std::uint32_t rkey,
                            std::uint32_t imm);
  Result<std::size_t> finishZeroCopy(const void* data, std::size_t n);
  void dropZeroCopyMr();  // the in-flight write's registration: deregistered, or given back to the device
  // Sending: whether to hold a large piece back a little for the peer's advert.
  bool awaitAdvert();
  // Receiving: advertise `dst` for the n bytes from stream position `pos` on (head_, or further
  // on: the payload after a header), or, for a refused buffer, that this side reads its inbox.
  void advertise(std::uint64_t pos, void* dst, std::size_t n);
  void advertiseEager();
  // Advertise the part of [pos, pos + n) (at addr on) that the sender cannot have written eagerly
  // yet, if that part is worth it (BRAID_IB_ZCOPY_BYTES).
  void advertiseAhead(std::uint64_t pos, std::uint64_t addr, std::uint64_t n);
  void endAdvert();  // the peer will write no more into the advertised buffer
  std::string where() const;  // "ib (DEV:PORT) toward rank R", the start of every error it reports
  Status protocolError(const std::string& what) const;
  std::span<const std::byte> inboxView() const;  // what the inbox holds from head_ on
  // Whether the bytes at head_ were written into the advertised buffer.
  bool atDirect() const { return direct_ > 0 && head_ >= myAdv_.pos; }

  struct Advert {
    std::uint64_t pos = ~std::uint64_t{0};  // the stream position it is for; ~0: none
    std::uint64_t addr = 0, len = 0;        // len 0: eager (the reader reads its inbox)
    std::uint32_t key = 0;
  };

  // Whether a piece of n bytes goes zero copy (BRAID_IB_ZCOPY_BYTES; 0: never).
  bool zeroCopy(std::uint64_t n) const { return zcopyBytes_ > 0 && n >= zcopyBytes_; }

  std::shared_ptr<IbDevice> dev_;
  int peer_;
  std::size_t cap_;
  std::size_t zcopyBytes_ = 0;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::byte* inbox_ = nullptr;
  std::byte* outbox_ = nullptr;
  Credit* ctl_ = nullptr;      // the peer writes here
  ibv_mr* inboxMr_ = nullptr;
  ibv_mr* outboxMr_ = nullptr;
  ibv_mr* ctlMr_ = nullptr;
  IbEndpoint remote_{};
  std::uint32_t maxInline_ = 0;
  bool armed_ = false;
  Status error_;

  // Sending: positions in the byte stream (the peer's inbox holds sent_ - peerHead_ of them).
  std::uint64_t sent_ = 0, acked_ = 0, peerHead_ = 0;
  std::uint64_t immSent_ = 0, peerPosted_ = 0;  // receives of the peer this side used / it posted
  int sqOutstanding_ = 0;
  struct ZeroCopy {
    const void* data = nullptr;  // the caller's bytes being written; null when none
    std::size_t bytes = 0;
    std::uint64_t end = 0;       // the stream position after them (complete once acked_ reaches it)
    ibv_mr* mr = nullptr;        // its registration for this write (null: the device keeps one)
    ibv_mr* kept = nullptr;      // the device's, given back when the write is done
  } zc_;
  Advert peerAdv_;                         // the peer's latest advert
  std::uint64_t eagerEnd_ = 0, directEnd_ = 0;  // where this side's last eager / direct write ended
  std::uint64_t heldBack_ = 0;
  std::uint64_t refused_ = 0;
  std::uint64_t refusedEnd_ = 0;  // no advert before this stream position: its buffer was refused
  std::uint64_t waitPos_ = ~std::uint64_t{0};   // the position awaitAdvert() has been waiting at
  std::int64_t waitSinceUs_ = 0;
  // Receiving.
  std::uint64_t head_ = 0, tail_ = 0;
  std::uint64_t posted_ = 0, processed_ = 0;  // receives posted / completed
  std::uint64_t creditedHead_ = 0, creditedPosted_ = 0;
  Advert myAdv_;             // the last advert this side made
  ibv_mr* advMr_ = nullptr;  // its buffer's registration, while the peer may still write there
  bool advKept_ = false;     // that registration is one the device keeps (IbDevice::keptMr)
  bool advUnsent_ = false;   // made but not sent yet (the send queue was full)
  std::uint64_t direct_ = 0; // bytes written into the advertised buffer and not read yet (from myAdv_.pos or head_ on)
  std::uint64_t directTotal_ = 0;
  // From expect(): stream positions [wantPos_, wantEnd_) go to wantAddr_ on.
  std::uint64_t wantPos_ = 0, wantEnd_ = 0, wantAddr_ = 0;
};

class IbConnection final : public Connection {
 public:
  IbConnection(int peer, std::vector<std::unique_ptr<IbChannel>> channels)
      : peer_(peer), channels_(std::move(channels)) {}
  int peer() const override { return peer_; }
  std::string_view transport() const override { return "ib"; }
  int numChannels() const override { return static_cast<int>(channels_.size()); }
  Channel& channel(int i) override { return *channels_[static_cast<std::size_t>(i)]; }

 private:
  int peer_;
  std::vector<std::unique_ptr<IbChannel>> channels_;
};

}  // namespace braid
