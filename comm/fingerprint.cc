#include "comm/fingerprint.h"

namespace braid {

const char* collName(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return "allreduce";
    case CollKind::kAllGather: return "allgather";
    case CollKind::kReduceScatter: return "reducescatter";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kReduce: return "reduce";
    case CollKind::kSendRecv: return "send/recv";
    case CollKind::kBarrier: return "barrier";
    case CollKind::kAllToAll: return "alltoall";
    case CollKind::kAllToAllv: return "alltoallv";
  }
  return "unknown";
}

std::string callAs(const Fingerprint& f) { return f.describe() + " as #" + std::to_string(f.seq); }

std::string lastCallAs(const Fingerprint& f) { return f.seq ? callAs(f) : "no collective"; }

std::string failedOn(const Fingerprint& f, int rank) {
  return f.describe() + " #" + std::to_string(f.seq) + " failed on rank " + std::to_string(rank);
}

bool isFarewell(const WireHeader& h) { return h.step == kFarewellStep && h.bytes == 0; }

std::string farewellMismatch(int rank, const Fingerprint& mine, int peer, const Fingerprint& theirs) {
  return mismatchText(rank, callAs(mine), peer, lastCallAs(theirs)) + " (rank " + std::to_string(peer) +
         " has finished its calls and called destroy)";
}

std::string mismatchText(int rank1, const std::string& call1, int rank2, const std::string& call2) {
  const bool firstIsLower = rank1 <= rank2;
  return "rank " + std::to_string(firstIsLower ? rank1 : rank2) + " called " + (firstIsLower ? call1 : call2) +
         " but rank " + std::to_string(firstIsLower ? rank2 : rank1) + " called " + (firstIsLower ? call2 : call1) +
         ": every rank must issue the same collectives in the same order";
}

std::string Fingerprint::describe() const {
  std::string s;
  if (kind == CollKind::kSendRecv) {
    s = "send/recv(count=" + std::to_string(count) + ", " + dataTypeName(dtype);
    if (tag != 0) s += ", tag=" + std::to_string(tag);
    return s + ") rank " + std::to_string(sender) + "->" + std::to_string(root);
  }
  if (kind == CollKind::kBarrier) return "barrier()";
  if (kind == CollKind::kAllToAllv) return std::string("alltoallv(") + dataTypeName(dtype) + ")";
  s = std::string(collName(kind)) + "(count=" + std::to_string(count) + ", " + dataTypeName(dtype);
  if (kind == CollKind::kAllReduce || kind == CollKind::kReduceScatter || kind == CollKind::kReduce)
    s += std::string(", ") + reduceOpName(op);
  if (kind == CollKind::kBroadcast || kind == CollKind::kReduce) s += ", root=" + std::to_string(root);
  return s + ")";
}

WireHeader makeHeader(const Fingerprint& f, std::uint64_t commTag, int sender, std::uint64_t bytes, std::uint32_t step) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.kind = static_cast<std::int32_t>(f.kind);
  h.commTag = commTag;
  h.seq = f.seq;
  h.count = f.count;
  h.dtype = static_cast<std::int32_t>(f.dtype);
  h.op = f.kind == CollKind::kSendRecv ? f.tag : static_cast<std::int32_t>(f.op);
  h.root = f.root;
  h.sender = sender;
  h.bytes = bytes;
  h.p2pSender = f.sender;
  h.step = step;
  return h;
}

Fingerprint fingerprintOf(const WireHeader& h) {
  Fingerprint f;
  f.kind = static_cast<CollKind>(h.kind);
  f.dtype = static_cast<DataType>(h.dtype);
  if (f.kind == CollKind::kSendRecv) {
    f.tag = h.op;
  } else {
    f.op = static_cast<ReduceOp>(h.op);
  }
  f.root = h.root;
  f.count = h.count;
  f.seq = h.seq;
  f.sender = h.p2pSender;
  return f;
}

}  // namespace braid
