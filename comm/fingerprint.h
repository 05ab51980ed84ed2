// What identifies one collective call on one rank: the kind, its arguments that every rank must
// agree on, and its sequence number. Every message starts with a WireHeader carrying the sender's
// fingerprint, so a receiver notices at the first byte when ranks called different things.
#pragma once
#include <cstdint>
#include <string>

#include "braid/types.hpp"

namespace braid {

enum class CollKind : std::int32_t {
  kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kReduce, kSendRecv, kBarrier, kAllToAll, kAllToAllv,
};
const char* collName(CollKind k);

struct Fingerprint {
  CollKind kind = CollKind::kBarrier;
  DataType dtype = DataType::kInt8;
  ReduceOp op = ReduceOp::kSum;
  std::int32_t root = -1;     // rooted collectives; for send/recv the receiving rank
  std::uint64_t count = 0;    // the user's count (per-rank count for all-gather/reduce-scatter and
                              // the per-peer block of all-to-all; 0 for all-to-allv, whose counts
                              // are per pair and checked message by message)
  std::uint64_t seq = 0;      // collectives: per communicator; send/recv: per ordered pair
  std::int32_t sender = -1;   // send/recv: the sending rank
  std::int32_t tag = 0;       // send/recv: the user's tag (on the wire in the op field)

  // "allreduce(count=1024, float32, sum)", "broadcast(count=8, int32, root=2)", "send(count=4, float32) 1->3"
  std::string describe() const;
  bool sameCall(const Fingerprint& o) const {
    return kind == o.kind && dtype == o.dtype && op == o.op && root == o.root && count == o.count && seq == o.seq &&
           sender == o.sender && tag == o.tag;
  }
};

// The words every mismatch error uses, with the lower rank first: "rank A called CALL_A but rank B
// called CALL_B: every rank must issue the same collectives in the same order", where a call reads
// "allreduce(count=8, float32, sum) as #3" (callAs below).
std::string callAs(const Fingerprint& f);
std::string mismatchText(int rank1, const std::string& call1, int rank2, const std::string& call2);

inline constexpr std::uint32_t kWireMagic = 0x31445242;  // "BRD1"

// 64 bytes before every message on every channel.
struct WireHeader {
  std::uint32_t magic;
  std::int32_t kind;
  std::uint64_t commTag;
  std::uint64_t seq;
  std::uint64_t count;
  std::int32_t dtype;
  std::int32_t op;         // the reduction; send/recv: the tag
  std::int32_t root;
  std::int32_t sender;     // the rank that sent this message
  std::uint64_t bytes;     // payload bytes that follow (then zero padding to a multiple of 8)
  std::int32_t p2pSender;  // Fingerprint::sender
  std::uint32_t step;
};
static_assert(sizeof(WireHeader) == 64);

// "allreduce(count=8, float32, sum) #3 failed on rank 1": the context every failed call's error gets.
std::string failedOn(const Fingerprint& f, int rank);

// A header with this step and no payload is a farewell (Comm::destroy): the sender's last
// collective, sent once on channel 0 of every connection after its last call.
inline constexpr std::uint32_t kFarewellStep = 0xffffffffu;
bool isFarewell(const WireHeader& h);
// A call of this rank (`mine`) that peer's farewell (its last call: `theirs`) says it never made.
std::string farewellMismatch(int rank, const Fingerprint& mine, int peer, const Fingerprint& theirs);
// callAs(f), or "no collective" for the empty fingerprint of a rank that made none.
std::string lastCallAs(const Fingerprint& f);

WireHeader makeHeader(const Fingerprint& f, std::uint64_t commTag, int sender, std::uint64_t bytes, std::uint32_t step);
Fingerprint fingerprintOf(const WireHeader& h);

}  // namespace braid
