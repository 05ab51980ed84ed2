// Transports move bytes between this rank and its peers. A Connection reaches one peer and holds
// several Channels; a Channel is one FIFO byte stream in each direction. Collectives never learn
// which transport they run on: they only call the Channel methods below.
//
// Threading: a connection and its channels are driven by one thread at a time (the communicator's
// caller or its progress thread). No method blocks; waiting is the Waiter's job (comm/waiter.h).
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/deadline.h"
#include "braid/status.hpp"

namespace braid {

class Channel {
 public:
  virtual ~Channel() = default;
  // Appends up to n bytes to the outgoing stream; returns how many were taken (0 when full).
  // Taken bytes are the transport's: the caller may reuse their memory at once. A transport may
  // also start on bytes it has not reported yet (ib writes large pieces straight from the
  // caller's memory and reports them when the write completes): so after a call that took k < n
  // bytes, the caller leaves data[k, n) unchanged and its next trySend on this channel goes on
  // from data + k with at least n - k bytes, as the engine's sends always do.
  virtual Result<std::size_t> trySend(const void* data, std::size_t n) = 0;
  // Appends up to na + nb bytes, a's first, as trySend(a) then trySend(b) would; a transport with
  // a gather write (tcp: one sendmsg, one segment) does it in one call. Returns how many were taken.
  virtual Result<std::size_t> trySend2(const void* a, std::size_t na, const void* b, std::size_t nb) {
    auto k = trySend(a, na);
    if (!k.ok() || *k < na) return k;
    auto m = trySend(b, nb);
    if (!m.ok()) return m;
    return na + *m;
  }
  // The received bytes that are contiguous and ready to read; may be empty. Reading a span and
  // then calling consume() lets a collective reduce straight out of the transport's buffer.
  virtual Result<std::span<const std::byte>> peek() = 0;
  virtual void consume(std::size_t n) = 0;
  // Moves up to n received bytes into dst; returns how many. A transport may place bytes that
  // arrive after the call into dst (ib advertises a large dst to its sender, which writes there
  // directly): so after a call that returned k < n, the caller's next tryRecv on this channel
  // goes on into dst + k, as the engine's receives always do.
  virtual Result<std::size_t> tryRecv(void* dst, std::size_t n) = 0;
  // The n bytes of the stream that follow its next `after` bytes will be received into dst, by
  // tryRecv calls that go on from dst in order (however small their pieces): a transport may let
  // the sender place them there itself (ib). The engine says so before it reads a message's
  // header (after = the header's size), so that the sender can hear it before it sends the
  // payload. A hint; the default ignores it.
  virtual void expect(void* dst, std::size_t n, std::size_t after) {
    (void)dst;
    (void)n;
    (void)after;
  }
  // The same, for a piece of a message larger than the cache can hold beside everything else
  // (the engine's choice, comm/engine.h largeCopyBytes): a transport that copies out of a buffer
  // of its own may store past the cache (shm); one that receives straight into dst need not care.
  virtual Result<std::size_t> tryRecvLarge(void* dst, std::size_t n) { return tryRecv(dst, n); }
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual int peer() const = 0;
  virtual std::string_view transport() const = 0;
  virtual int numChannels() const = 0;
  virtual Channel& channel(int i) = 0;
};

struct Availability {
  bool usable = false;
  std::string reason;  // why not, in words a person can act on
};

// What one transport of one rank published: its address (opaque bytes only that transport reads),
// or, when it cannot run there, why not (so that a peer can say so in its own log).
struct TransportAddress {
  std::string name;     // "shm", "tcp", ...
  bool usable = false;
  std::string address;  // usable: what the transport's peers need to reach it; else the reason
};

// What one rank publishes about itself through the bootstrap before connections are made.
struct PeerInfo {
  int rank = -1;
  std::string host;       // hostname
  std::string bootId;     // /proc/sys/kernel/random/boot_id: same host means same kernel
  int pid = 0;
  std::vector<TransportAddress> transports;  // one per transport of the registry, in its order
  std::string settings;   // the BRAID_* values every rank must share, e.g. "BRAID_NSOCKS=2 ..."
  std::uint64_t cmaProbe = 0;  // an address in this process that peers may read to probe process_vm_readv
  std::string cpus;       // the CPUs this rank may run on, as Linux lists them ("0-3,8"); "" if unknown
  std::uint64_t tuningL3 = 0;  // the L3 figure this rank tunes with (topology::tuningL3Bytes); 0 if unknown
  std::string boot;       // where its children in the set-up tree connect ("ip:port", comm/bootstrap/roster.h)

  bool sameHostAs(const PeerInfo& o) const { return host == o.host && bootId == o.bootId; }
  // This rank's entry for the transport `name`, or null if it published none.
  const TransportAddress* transport(std::string_view name) const;
  std::string serialize() const;
  static Result<PeerInfo> parse(const std::string& text);
};

// How the tuner weighs the link between two ranks (Transport::linkClass): rough figures for the
// transport's class of link, good enough to place the cost model's crossovers (comm/tuner.cc).
struct LinkClass {
  double latencyUs = 1;              // per message (the model's alpha)
  double bytesPerUs = 6000;          // of one channel (the model's beta)
  std::size_t minPiece = 32u << 10;  // the smallest pipeline piece worth a message
  bool sameHost = true;              // both ranks are on one host
  bool sharedMemory = true;          // both ranks map memory they share (the mailbox, cross-memory attach, zero copy)
  // One channel with pieces as large as the staging ring beats several (tcp on loopback under reno).
  bool oneStreamBest = false;
  // The largest piece worth handing a send/recv's channel at once, where that exceeds what the
  // staging ring takes: a link that writes large pieces straight into the receiver's buffer (ib
  // with zero copy) pays per write, not per byte staged. 0: the ring decides.
  std::size_t maxPiece = 0;

  // The slower of two links, which bounds a collective over both: the one with the larger latency;
  // of equal ones, what both allow.
  static LinkClass slower(const LinkClass& a, const LinkClass& b);
};

struct Doorbell;
class Mailbox;
struct SetupContext;

// What a waiter may sleep on while this transport's channels are quiet: a doorbell in memory the
// peers share, or file descriptors that become readable.
struct WaitSources {
  Doorbell* doorbell = nullptr;
  std::vector<int> fds;
  // Flags the waiter raises just before it sleeps on fds (and lowers once anything moved). A
  // transport whose fds become readable only once asked (ib arms its completion queues) asks at
  // its next poll while its flag is up: the waiter makes one more pass before it sleeps.
  std::vector<std::atomic<bool>*> beforeSleep;
};

// A way to reach peers. The communicator holds one of each kind the registry lists
// (transport/registry.h) and, per peer, uses the first that both ends can use and that reaches
// between them. Lifetime at communicator creation: probe(); if usable, localAddress() (published
// in PeerInfo); connect() to the peers it was chosen for; setupDone() once every rank connected.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  // Whether it can run in this process, and if not why (also shown by `braid info`).
  virtual Availability probe() = 0;
  // Starts what peers need to reach this rank (a listener, ...) and returns the bytes to publish.
  // `rendezvousIp`: the bootstrap store's address (an interface toward it is one toward the job).
  virtual Result<std::string> localAddress(const std::string& rendezvousIp) = 0;
  // Whether ranks `a` and `b`, both usable for this transport, reach each other over it. A pure
  // function of their PeerInfos and the settings every rank shares, whichever of them asks: so
  // both ends of every pair, and every other rank, see the same choice.
  virtual Availability canReach(const PeerInfo& a, const PeerInfo& b) const = 0;
  // The link this transport gives `a` and `b` (the same for either order).
  virtual LinkClass linkClass(const PeerInfo& a, const PeerInfo& b) const = 0;
  // What of a rank's usable address canReach and linkClass read beside whether the two ranks share
  // a host: ranks whose keys agree for every transport reach every peer alike, which lets
  // slowestLink look at one pair of each kind instead of every pair. "" when only the hosts matter.
  virtual std::string reachKey(const std::string& address) const {
    (void)address;
    return "";
  }
  // Connections to `peers` (ranks of ctx.peers, all of which chose this transport with this rank).
  virtual Result<std::vector<std::unique_ptr<Connection>>> connect(const SetupContext& ctx,
                                                                    const std::vector<int>& peers) = 0;
  // Whether connect() may be given only some of the peers that chose this transport, the others
  // reached by connectOnUse() when a call first needs them.
  virtual bool connectsOnUse() const { return false; }
  // After connect(): connections to `peers` (none connected yet), made when a call first reaches
  // them; each of them makes the same call for this rank (their call reaches it too). May also
  // return connections to other peers that connected first (a peer a call ahead of this rank).
  // `stop` is asked between waits: once it says true (the communicator failed), Aborted.
  virtual Result<std::vector<std::unique_ptr<Connection>>> connectOnUse(const std::vector<int>& peers,
                                                                        const Deadline& deadline,
                                                                        const std::function<bool()>& stop) {
    (void)peers;
    (void)deadline;
    (void)stop;
    return Status::Internal(std::string(name()) + " connects every peer at set-up");
  }
  // File descriptors each peer's connection keeps open (the communicator makes room for them
  // before connecting: base/fdlimit.h).
  virtual long descriptorsPerPeer() const { return 0; }
  // After connect(): what the communicator's waiter sleeps on for these connections.
  virtual WaitSources waitSources() const { return {}; }
  // After connect(): a mailbox for small messages among every rank of this host, if this transport
  // has one (shm); the communicator's one-shot paths use it when every pair shares memory.
  virtual Mailbox* mailbox() { return nullptr; }
  // Every rank has connected (also called at shutdown): drop what only the setup needed, such as
  // names in /dev/shm that others could still open. Idempotent.
  virtual void setupDone() {}
};

}  // namespace braid
