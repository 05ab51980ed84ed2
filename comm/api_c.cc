// braid.h on top of the internal Comm. Every entry point converts a Status into a braidResult_t
// and remembers its message for braidGetLastError.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "comm/c_handle.h"
#include "comm/communicator.h"
#include "comm/cuda/cuda_path.h"
#include "comm/bootstrap/init.h"
#include "comm/memory.h"


namespace {
thread_local std::string tLastError;

// braidGroupStart/End: the calls of this thread's open group, in call order.
struct GroupCall {
  std::shared_ptr<braid::Comm> comm;
  braid::CollArgs args;
};
thread_local int tGroupDepth = 0;
thread_local std::vector<GroupCall> tGroup;

braidResult_t toResult(const braid::Status& s, braid::Comm* comm = nullptr) {
  if (!s.ok()) {
    tLastError = s.toString();
    if (comm) comm->setLastError(s);
  }
  return static_cast<braidResult_t>(s.code());
}

braidResult_t run(braidComm_t comm, const braid::CollArgs& a, void* stream) {
  if (!comm || !comm->impl) return toResult(braid::Status::InvalidArgument("communicator is NULL"));
  // Hold the communicator for the whole call: braidCommAbort on another thread may free `comm`.
  std::shared_ptr<braid::Comm> impl = comm->impl;
  if (tGroupDepth > 0) {
    braid::Status s = braid::cuda::admitToGroup(*impl, a, stream);
    if (s.ok()) tGroup.push_back({impl, a});
    return toResult(s, impl.get());
  }
  return toResult(braid::cuda::run(*impl, a, stream), impl.get());
}

// braid.h: after destroy or abort, any later call on the handle returns invalid usage.
braid::Status kAlreadyClosed() { return braid::Status::InvalidUsage("the communicator was destroyed or aborted already"); }

braid::DataType dt(braidDataType_t t) { return static_cast<braid::DataType>(t); }
braid::ReduceOp rop(braidRedOp_t o) { return static_cast<braid::ReduceOp>(o); }

braidResult_t adopt(braidComm_t* out, braid::Result<std::shared_ptr<braid::Comm>> r) {
  if (!r.ok()) return toResult(r.status());
  *out = new braidComm{*r};
  return braidSuccess;
}
}  // namespace

extern "C" {

braidResult_t braidGetUniqueId(braidUniqueId* id) {
  if (!id) return toResult(braid::Status::InvalidArgument("uniqueId is NULL"));
  return toResult(braid::makeUniqueId(id));
}

braidResult_t braidUniqueIdToString(const braidUniqueId* id, char* buf, size_t size) {
  if (!id || !buf) return toResult(braid::Status::InvalidArgument("NULL argument"));
  std::string s = braid::uniqueIdToString(*id);
  if (s.empty()) return toResult(braid::Status::InvalidArgument("not a unique id made by braidGetUniqueId"));
  if (s.size() + 1 > size) return toResult(braid::Status::InvalidArgument("buffer too small: need " + std::to_string(s.size() + 1)));
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return braidSuccess;
}

braidResult_t braidUniqueIdFromString(const char* text, braidUniqueId* id) {
  if (!text || !id) return toResult(braid::Status::InvalidArgument("NULL argument"));
  auto r = braid::uniqueIdFromString(text);
  if (!r.ok()) return toResult(r.status());
  *id = *r;
  return braidSuccess;
}

braidResult_t braidCommInitRank(braidComm_t* comm, int nranks, braidUniqueId commId, int rank) {
  if (!comm) return toResult(braid::Status::InvalidArgument("comm is NULL"));
  return adopt(comm, braid::initFromUniqueId(commId, nranks, rank));
}

braidResult_t braidCommInitFromEnv(braidComm_t* comm) {
  if (!comm) return toResult(braid::Status::InvalidArgument("comm is NULL"));
  return adopt(comm, braid::initFromEnv());
}

braidResult_t braidCommDestroy(braidComm_t comm) {
  if (!comm) return toResult(braid::Status::InvalidArgument("communicator is NULL"));
  // The handle stays allocated (a few bytes) so that a late call on it gets invalid usage
  // instead of touching freed memory; everything the communicator held is released now.
  if (comm->impl->closed()) return toResult(kAlreadyClosed(), comm->impl.get());
  return toResult(comm->impl->destroy(), comm->impl.get());
}

braidResult_t braidCommAbort(braidComm_t comm) {
  if (!comm) return toResult(braid::Status::InvalidArgument("communicator is NULL"));
  if (comm->impl->closed()) return toResult(kAlreadyClosed(), comm->impl.get());
  comm->impl->abort();  // the handle stays allocated, as with braidCommDestroy
  return braidSuccess;
}

braidResult_t braidCommCount(const braidComm_t comm, int* count) {
  if (!comm || !count) return toResult(braid::Status::InvalidArgument("NULL argument"));
  *count = comm->impl->nranks();
  return braidSuccess;
}

braidResult_t braidCommUserRank(const braidComm_t comm, int* rank) {
  if (!comm || !rank) return toResult(braid::Status::InvalidArgument("NULL argument"));
  *rank = comm->impl->rank();
  return braidSuccess;
}

braidResult_t braidCommGetAsyncError(braidComm_t comm, braidResult_t* asyncError) {
  if (!comm || !asyncError) return toResult(braid::Status::InvalidArgument("NULL argument"));
  *asyncError = static_cast<braidResult_t>(comm->impl->failure().code());
  return braidSuccess;
}

braidResult_t braidCommSplit(braidComm_t comm, int color, int key, braidComm_t* newcomm) {
  if (!comm || !comm->impl) return toResult(braid::Status::InvalidArgument("communicator is NULL"));
  std::shared_ptr<braid::Comm> impl = comm->impl;
  if (impl->closed()) return toResult(kAlreadyClosed(), impl.get());
  if (tGroupDepth > 0)
    return toResult(braid::Status::InvalidUsage("braidCommSplit between braidGroupStart and braidGroupEnd: call it "
                                                "outside the group"), impl.get());
  if (newcomm) *newcomm = nullptr;
  auto r = braid::splitComm(*impl, color, key, {}, newcomm ? "" : "braidCommSplit: newcomm is NULL");
  if (!r.ok()) return toResult(r.status(), impl.get());
  if (*r) *newcomm = new braidComm{*r};
  return braidSuccess;
}

braidResult_t braidAllReduce(const void* s, void* r, size_t count, braidDataType_t t, braidRedOp_t op, braidComm_t comm,
                             void* stream) {
  return run(comm, {braid::CollKind::kAllReduce, s, r, count, dt(t), rop(op)}, stream);
}

braidResult_t braidAllGather(const void* s, void* r, size_t sendcount, braidDataType_t t, braidComm_t comm, void* stream) {
  return run(comm, {braid::CollKind::kAllGather, s, r, sendcount, dt(t), braid::ReduceOp::kSum}, stream);
}

braidResult_t braidReduceScatter(const void* s, void* r, size_t recvcount, braidDataType_t t, braidRedOp_t op,
                                 braidComm_t comm, void* stream) {
  return run(comm, {braid::CollKind::kReduceScatter, s, r, recvcount, dt(t), rop(op)}, stream);
}

braidResult_t braidBroadcast(const void* s, void* r, size_t count, braidDataType_t t, int root, braidComm_t comm,
                             void* stream) {
  return run(comm, {braid::CollKind::kBroadcast, s, r, count, dt(t), braid::ReduceOp::kSum, root}, stream);
}

braidResult_t braidReduce(const void* s, void* r, size_t count, braidDataType_t t, braidRedOp_t op, int root,
                          braidComm_t comm, void* stream) {
  return run(comm, {braid::CollKind::kReduce, s, r, count, dt(t), rop(op), root}, stream);
}

braidResult_t braidSend(const void* s, size_t count, braidDataType_t t, int peer, braidComm_t comm, void* stream) {
  return run(comm, {braid::CollKind::kSendRecv, s, nullptr, count, dt(t), braid::ReduceOp::kSum, -1, peer, true}, stream);
}

braidResult_t braidRecv(void* r, size_t count, braidDataType_t t, int peer, braidComm_t comm, void* stream) {
  return run(comm, {braid::CollKind::kSendRecv, nullptr, r, count, dt(t), braid::ReduceOp::kSum, -1, peer, false}, stream);
}

braidResult_t braidBarrier(braidComm_t comm) {
  return run(comm, {braid::CollKind::kBarrier, nullptr, nullptr, 0, braid::DataType::kInt8, braid::ReduceOp::kSum}, nullptr);
}

braidResult_t braidAllToAll(const void* s, void* r, size_t count, braidDataType_t t, braidComm_t comm, void* stream) {
  return run(comm, {braid::CollKind::kAllToAll, s, r, count, dt(t), braid::ReduceOp::kSum}, stream);
}

braidResult_t braidAllToAllv(const void* s, const size_t* sendcounts, const size_t* sdispls, void* r,
                             const size_t* recvcounts, const size_t* rdispls, braidDataType_t t, braidComm_t comm,
                             void* stream) {
  if (!comm || !comm->impl) return toResult(braid::Status::InvalidArgument("communicator is NULL"));
  if (!sendcounts || !sdispls || !recvcounts || !rdispls)
    return toResult(braid::Status::InvalidArgument("alltoallv: sendcounts, sdispls, recvcounts and rdispls must not be NULL"),
                    comm->impl.get());
  const std::size_t n = static_cast<std::size_t>(comm->impl->nranks());
  auto v = std::make_shared<braid::AllToAllvCounts>();
  v->sendCounts.assign(sendcounts, sendcounts + n);
  v->sendDispls.assign(sdispls, sdispls + n);
  v->recvCounts.assign(recvcounts, recvcounts + n);
  v->recvDispls.assign(rdispls, rdispls + n);
  braid::CollArgs a{braid::CollKind::kAllToAllv, s, r, 0, dt(t), braid::ReduceOp::kSum};
  a.v = std::move(v);
  return run(comm, a, stream);
}

braidResult_t braidGroupStart(void) {
  ++tGroupDepth;
  return braidSuccess;
}

braidResult_t braidGroupEnd(void) {
  if (tGroupDepth == 0)
    return toResult(braid::Status::InvalidUsage("braidGroupEnd without a braidGroupStart on this thread"));
  if (--tGroupDepth > 0) return braidSuccess;
  std::vector<GroupCall> calls = std::move(tGroup);
  tGroup.clear();
  braidResult_t first = braidSuccess;
  std::vector<bool> done(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (done[i]) continue;
    std::vector<braid::CollArgs> mine;  // this communicator's calls, in call order
    for (std::size_t j = i; j < calls.size(); ++j)
      if (!done[j] && calls[j].comm == calls[i].comm) {
        mine.push_back(calls[j].args);
        done[j] = true;
      }
    // Every communicator's calls run, even after another's failed: its peers wait for them.
    const braidResult_t r = toResult(calls[i].comm->runGroup(mine), calls[i].comm.get());
    if (first == braidSuccess) first = r;
  }
  return first;
}

braidResult_t braidMemAlloc(void** ptr, size_t bytes) { return toResult(braid::mem::allocate(ptr, bytes)); }

braidResult_t braidMemFree(void* ptr) { return toResult(braid::mem::release(ptr)); }

const char* braidGetErrorString(braidResult_t r) {
  if (r < braidSuccess || r >= braidNumResults) return "unknown result code";
  return braid::codeName(static_cast<braid::Code>(r));
}

const char* braidGetLastError(braidComm_t comm) {
  if (!comm) return tLastError.c_str();
  thread_local std::string copy;
  copy = comm->impl->lastError();
  return copy.c_str();
}

}  // extern "C"
