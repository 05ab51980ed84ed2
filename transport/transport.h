// Transports move bytes between this rank and its peers. A Connection reaches one peer and holds
// several Channels; a Channel is one FIFO byte stream in each direction. Collectives never learn
// which transport they run on: they only call the Channel methods below.
//
// Threading: a connection and its channels are driven by one thread at a time (the communicator's
// caller or its progress thread). No method blocks; waiting is the Waiter's job (comm/waiter.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "braid/status.hpp"

namespace braid {

class Channel {
 public:
  virtual ~Channel() = default;
  // Appends up to n bytes to the outgoing stream; returns how many were taken (0 when full).
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
  // Moves up to n received bytes into dst; returns how many.
  virtual Result<std::size_t> tryRecv(void* dst, std::size_t n) = 0;
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

// What one rank publishes about itself through the bootstrap before connections are made.
struct PeerInfo {
  int rank = -1;
  std::string host;       // hostname
  std::string bootId;     // /proc/sys/kernel/random/boot_id: same host means same kernel
  int pid = 0;
  std::string tcpAddr;    // "ip:port" of this rank's tcp listener
  bool shmUsable = true;  // this rank can create and map shared memory
  std::string settings;   // the BRAID_* values every rank must share, e.g. "BRAID_NSOCKS=2 ..."
  std::uint64_t cmaProbe = 0;  // an address in this process that peers may read to probe process_vm_readv
  std::string cpus;       // the CPUs this rank may run on, as Linux lists them ("0-3,8"); "" if unknown
  std::uint64_t tuningL3 = 0;  // the L3 figure this rank tunes with (topology::tuningL3Bytes); 0 if unknown

  bool sameHostAs(const PeerInfo& o) const { return host == o.host && bootId == o.bootId; }
  std::string serialize() const;
  static Result<PeerInfo> parse(const std::string& text);
};

struct Availability {
  bool usable = false;
  std::string reason;  // why not, in words a person can act on
};

}  // namespace braid
