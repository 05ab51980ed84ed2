// braid.hpp on top of the internal Comm.
#include <chrono>

#include "braid/braid.hpp"
#include "comm/communicator.h"
#include "comm/cuda/cuda_path.h"
#include "comm/bootstrap/init.h"
#include "comm/memory.h"

namespace braid {

Status Work::wait(double timeoutSec) {
  if (!state_) return Status::InvalidUsage("wait() on an empty Work");
  // Not started yet: run it here (and, without a timeout, what was queued before it) rather than
  // wait for the worker. (With a timeout, only when it is next: the calls before it are not this
  // wait's to run past its time.)
  if (auto owner = state_->owner.lock()) owner->runQueuedThrough(state_, timeoutSec < 0);
  std::unique_lock<std::mutex> g(state_->mu);
  if (timeoutSec < 0 || !(timeoutSec < kNoTimeLimitSec)) {  // waits of years are waits without a limit
    state_->cv.wait(g, [&] { return state_->done; });
  } else if (!state_->cv.wait_for(g, std::chrono::duration<double>(timeoutSec), [&] { return state_->done; })) {
    return Status::Timeout("the work did not finish within " + std::to_string(timeoutSec) + " s (it goes on)");
  }
  return state_->status;
}

bool Work::test() {
  if (!state_) return true;
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->done;
}

void Work::onDone(std::function<void(const Status&)> f) {
  if (!state_) {
    f(Status::InvalidUsage("empty Work"));
    return;
  }
  state_->whenDone(std::move(f));
}

Status Work::status() const {
  if (!state_) return Status::InvalidUsage("empty Work");
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->done ? state_->status : Status::InProgress("still running");
}

Result<void*> memAlloc(std::size_t bytes) {
  void* p = nullptr;
  Status s = mem::allocate(&p, bytes);
  if (!s.ok()) return s;
  return p;
}
Status memFree(void* ptr) { return mem::release(ptr); }

namespace {
Result<Communicator> wrap(Result<std::shared_ptr<Comm>> r) {
  if (!r.ok()) return r.status();
  return Communicator(*r);
}
}  // namespace

Result<Communicator> Communicator::fromEnv(const CommOptions& options) { return wrap(initFromEnv(options)); }
Result<Communicator> Communicator::fromUniqueId(const braidUniqueId& id, int nranks, int rank,
                                                const CommOptions& options) {
  return wrap(initFromUniqueId(id, nranks, rank, options));
}
Result<Communicator> Communicator::fromStore(const StoreOptions& store, int nranks, int rank,
                                             const CommOptions& options) {
  return wrap(initFromStore(store.host, store.port, store.isHost, nranks, rank, options));
}

int Communicator::rank() const { return impl_->rank(); }
int Communicator::size() const { return impl_->nranks(); }
Result<std::optional<Communicator>> Communicator::split(int color, int key, const CommOptions& options) {
  auto r = splitComm(*impl_, color, key, options);
  if (!r.ok()) return r.status();
  if (!*r) return std::optional<Communicator>();
  return std::optional<Communicator>(Communicator(*r));
}
std::string Communicator::transportTo(int peer) const {
  return peer >= 0 && peer < impl_->nranks() ? impl_->transportOf(peer) : "";
}

std::string Communicator::statusRecord() const { return impl_->statusRecord(); }

Work Communicator::allReduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kAllReduce, send, recv, count, t, op}, stream));
}
Work Communicator::allGather(const void* send, void* recv, std::size_t sendCount, DataType t, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kAllGather, send, recv, sendCount, t, ReduceOp::kSum}, stream));
}
Work Communicator::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType t, ReduceOp op, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kReduceScatter, send, recv, recvCount, t, op}, stream));
}
Work Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType t, int root, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kBroadcast, send, recv, count, t, ReduceOp::kSum, root}, stream));
}
Work Communicator::reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op, int root, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kReduce, send, recv, count, t, op, root}, stream));
}
Work Communicator::allToAll(const void* send, void* recv, std::size_t count, DataType t, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kAllToAll, send, recv, count, t, ReduceOp::kSum}, stream));
}
Work Communicator::allToAllv(const void* send, const std::vector<std::size_t>& sendCounts,
                             const std::vector<std::size_t>& sendDispls, void* recv,
                             const std::vector<std::size_t>& recvCounts, const std::vector<std::size_t>& recvDispls,
                             DataType t, void* stream) {
  CollArgs a{CollKind::kAllToAllv, send, recv, 0, t, ReduceOp::kSum};
  a.v = std::make_shared<AllToAllvCounts>(AllToAllvCounts{sendCounts, sendDispls, recvCounts, recvDispls});
  return Work(cuda::submit(*impl_, a, stream));
}
Work Communicator::sendRecvBatch(const std::vector<PeerOp>& ops, void* stream) {
  std::vector<CollArgs> calls;
  for (const PeerOp& op : ops) {
    const bool isSend = op.kind == PeerOp::kSend;
    CollArgs a{CollKind::kSendRecv, isSend ? op.buf : nullptr, isSend ? nullptr : op.buf, op.count, op.type,
               ReduceOp::kSum, -1, op.peer, isSend, op.tag};
    Status s = cuda::admitToGroup(*impl_, a, stream);
    if (!s.ok()) return Work(WorkState::finished(s.withContext("sendRecvBatch, entry " + std::to_string(calls.size()))));
    calls.push_back(a);
  }
  return Work(impl_->submitGroup(std::move(calls)));
}

Work Communicator::send(const void* buf, std::size_t count, DataType t, int peer, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kSendRecv, buf, nullptr, count, t, ReduceOp::kSum, -1, peer, true}, stream));
}
Work Communicator::recv(void* buf, std::size_t count, DataType t, int peer, void* stream) {
  return Work(cuda::submit(*impl_, {CollKind::kSendRecv, nullptr, buf, count, t, ReduceOp::kSum, -1, peer, false}, stream));
}
Work Communicator::barrier() {
  return Work(cuda::submit(*impl_, {CollKind::kBarrier, nullptr, nullptr, 0, DataType::kInt8, ReduceOp::kSum}, nullptr));
}

void Communicator::finishQueued() { impl_->waitForQueuedCalls(); }
bool Communicator::hasIncoming(int peer) { return impl_->hasIncoming(peer); }
void Communicator::abort() { impl_->abort(); }
Status Communicator::asyncError() const { return impl_->failure(); }

}  // namespace braid
