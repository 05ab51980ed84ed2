#include "process_group.h"

#include <pybind11/pybind11.h>  // gil_scoped_release (~ProcessGroupBraid)

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace braid::torch_backend {
namespace {

// Braid's element type for a tensor's dtype; bool travels as uint8 (its reductions: below).
braid::DataType braidType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return braid::DataType::kFloat32;
    case at::kDouble: return braid::DataType::kFloat64;
    case at::kHalf: return braid::DataType::kFloat16;
    case at::kBFloat16: return braid::DataType::kBfloat16;
    case at::kInt: return braid::DataType::kInt32;
    case at::kLong: return braid::DataType::kInt64;
    case at::kChar: return braid::DataType::kInt8;
    case at::kByte:
    case at::kBool: return braid::DataType::kUint8;
    default: break;
  }
  TORCH_CHECK(false, "braid: tensors of type ", t.scalar_type(),
              " are not supported (Braid has float32, float64, float16, bfloat16, int8, uint8, int32, int64 and bool)");
}

// Braid's reduction for c10d's op on this tensor. On bool, sum is logical or (max) and product
// logical and (min), as NCCL and Gloo make them.
braid::ReduceOp braidOp(const c10d::ReduceOp& op, const at::Tensor& t) {
  const bool isBool = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return isBool ? braid::ReduceOp::kMax : braid::ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT: return isBool ? braid::ReduceOp::kMin : braid::ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return braid::ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return braid::ReduceOp::kMax;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!isBool, "braid: ReduceOp.AVG on bool tensors is not defined");
      return braid::ReduceOp::kAvg;
    default: break;
  }
  TORCH_CHECK(false, "braid: ReduceOp BAND, BOR, BXOR and PREMUL_SUM are not supported (Braid reduces with SUM, ",
              "PRODUCT, MIN, MAX and AVG)");
}

void checkCpu(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "braid: ", t.device(), " tensors are not supported by this backend yet (CPU tensors are)");
}

// The one tensor a call takes (c10d passes lists: one tensor per device in the old multi-device API).
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "braid: ", what, " takes exactly one tensor per call, got ", tensors.size());
  checkCpu(tensors[0]);
  return tensors[0];
}

// Contiguous memory for Braid: the tensor itself when it is, else a copy (written back after the
// call for outputs).
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

std::size_t count(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// All tensors of a list flattened end to end into one new contiguous buffer of their dtype.
at::Tensor concat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const at::Tensor& t : ts) {
    checkCpu(t);
    TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "braid: the tensors of one call must have one dtype");
    flat.push_back(t.reshape({-1}));
  }
  return at::cat(flat);
}

// Copies consecutive pieces of `from` into each tensor of `to`.
void split(const at::Tensor& from, std::vector<at::Tensor>& to) {
  int64_t off = 0;
  for (at::Tensor& t : to) {
    t.copy_(from.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

std::chrono::milliseconds braidTimeout(std::chrono::milliseconds timeout) { return timeout; }

// A c10d::Work over a braid::Work: done when Braid's is, with a future that completes then (DDP's
// comm hooks wait on it). `after` runs first, on success (copies results into non-contiguous or
// list outputs); `keep` holds the buffers Braid uses until then.
class WorkBraid : public c10d::Work {
 public:
  static c10::intrusive_ptr<c10d::Work> start(int rank, c10d::OpType type, braid::Work work, std::vector<at::Tensor> outputs,
                                              std::vector<at::Tensor> keep = {}, std::function<void()> after = {}) {
    auto w = deferred(rank, type, std::move(outputs), std::move(keep), std::move(after), {});
    attach(w, std::move(work));
    return w;
  }
  // A Work whose Braid call is made later (attach): until then wait(), isCompleted() and
  // getFuture() first call `flush`, which makes it (the pending sends and receives, see send()).
  static c10::intrusive_ptr<WorkBraid> deferred(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                                                std::vector<at::Tensor> keep, std::function<void()> after,
                                                std::function<void()> flush) {
    auto w = c10::make_intrusive<WorkBraid>(rank, type, std::move(outputs));
    w->keep_ = std::move(keep);
    w->after_ = std::move(after);
    w->flush_ = std::move(flush);
    return w;
  }
  static void attach(const c10::intrusive_ptr<WorkBraid>& self, braid::Work work) {
    {
      std::lock_guard<std::mutex> g(self->flushMu_);
      self->flush_ = nullptr;
    }
    self->work_ = std::move(work);
    self->work_.onDone([self](const braid::Status& s) { self->complete(s); });
  }

  WorkBraid(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    kick();
    return future_;
  }
  bool isCompleted() override {
    kick();
    return c10d::Work::isCompleted();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    kick();
    // A call that has not started runs here, on the waiting thread (braid::Work::wait): a
    // blocking collective then costs no hand-off to the worker thread and back.
    (void)work_.wait(timeout.count() > 0 ? static_cast<double>(timeout.count()) / 1000.0 : -1);  // (its status: complete() has it)
    return c10d::Work::wait(timeout);
  }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  void kick() {
    std::function<void()> flush;
    {
      std::lock_guard<std::mutex> g(flushMu_);
      flush = flush_;
    }
    if (flush) flush();
  }
  void complete(const braid::Status& s) {
    std::exception_ptr error;
    if (s.ok() && after_) {
      try {
        after_();
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(std::runtime_error(std::string("braid: copying the result out failed: ") + e.what()));
      }
    }
    if (!s.ok()) error = std::make_exception_ptr(std::runtime_error("braid: " + s.toString()));
    keep_.clear();
    finish(error);
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(outputs_));
  }

  braid::Work work_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> after_;
  std::mutex flushMu_;
  std::function<void()> flush_;  // set until attach
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

// isend and irecv (and the blocking send and recv, which torch makes of them) are held back until
// their Work is waited on or polled, or another call is made on this group, and then all that
// are pending go to Braid together as one group (Communicator::sendRecvBatch): so two ranks that
// both isend before they irecv, or isend and then recv, do not wait on each other whatever the
// sizes, where one call at a time would (a send past the channels' buffering waits for its
// receive). Order between two ranks is kept: Braid matches a pair's messages in order.
struct ProcessGroupBraid::PendingP2p {
  struct Entry {
    braid::PeerOp op;
    c10::intrusive_ptr<WorkBraid> work;
  };
  std::mutex mu;
  braid::Communicator* comm = nullptr;
  std::vector<Entry> entries;

  void flush() {
    std::vector<Entry> batch;
    braid::Communicator* c = nullptr;
    {
      std::lock_guard<std::mutex> g(mu);
      batch.swap(entries);
      c = comm;
    }
    if (batch.empty() || !c) return;
    std::vector<braid::PeerOp> ops;
    ops.reserve(batch.size());
    for (const Entry& e : batch) ops.push_back(e.op);
    braid::Work w = c->sendRecvBatch(ops);
    for (Entry& e : batch) WorkBraid::attach(e.work, w);
  }
};

ProcessGroupBraid::ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), store_(store), timeout_(braidTimeout(timeout)) {
  const std::string key = "braid/unique_id";
  braidUniqueId id;
  if (rank == 0) {
    const braidResult_t r = braidGetUniqueId(&id);
    TORCH_CHECK(r == braidSuccess, "braid: rank 0 could not make a unique id: ", braidGetLastError(nullptr));
    store->set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id));
  } else {
    const std::vector<uint8_t> bytes = store->get(key);  // waits for rank 0, bounded by the store's timeout
    TORCH_CHECK(bytes.size() == sizeof id, "braid: the store holds ", bytes.size(), " bytes under ", key, ", not a unique id");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  // The process group's timeout bounds every Braid call, unless BRAID_TIMEOUT says otherwise.
  braid::CommOptions options;
  options.timeoutSec = std::max(0.001, static_cast<double>(timeout.count()) / 1000.0);
  auto c = braid::Communicator::fromUniqueId(id, size, rank, options);
  pending_ = std::make_shared<PendingP2p>();
  TORCH_CHECK(c.ok(), "braid: rank ", rank, " could not join the communicator of ", size, " ranks: ", c.status().toString());
  comm_ = std::make_unique<braid::Communicator>(std::move(*c));
  pending_->comm = comm_.get();
}

ProcessGroupBraid::~ProcessGroupBraid() {
  if (!pending_) return;
  pending_->flush();  // nothing is left unsent; Works still held elsewhere keep their results
  {
    std::lock_guard<std::mutex> g(pending_->mu);
    pending_->comm = nullptr;
  }
  // Destroying the communicator drains its queue on Braid's worker thread, and a Work finishing
  // there may drop the last reference to a tensor Python made, which takes the GIL. torch destroys
  // a process group from Python, holding the GIL: let go of it meanwhile, or each waits for the
  // other (destroy_process_group right after async calls nobody waited on).
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    comm_.reset();
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupBraid::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                                 int size, const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<ProcessGroupBraid>(store, rank, size,
                                                std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

braid::Communicator& ProcessGroupBraid::comm() {
  pending_->flush();  // calls run in the order they were made
  return *comm_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::deferPeerOp(braid::PeerOp op, c10d::OpType type, at::Tensor user,
                                                              at::Tensor buf) {
  // Checked here, so that a bad one is refused alone instead of failing the batch it would join.
  const char* what = type == c10d::OpType::SEND ? "send to" : "recv from";
  TORCH_CHECK(op.peer >= 0 && op.peer < getSize(), "braid: ", what, " rank ", op.peer, " on rank ", getRank(),
              ": the peer is outside 0..", getSize() - 1, " (this group's ranks)");
  TORCH_CHECK(op.peer != getRank(), "braid: ", what, " rank ", op.peer, ": that is this rank itself");
  std::function<void()> after;  // a receive into a non-contiguous tensor lands in `buf` first
  if (type == c10d::OpType::RECV && !buf.is_same(user)) after = [user, buf]() mutable { user.copy_(buf); };
  std::weak_ptr<PendingP2p> weak = pending_;
  auto w = WorkBraid::deferred(getRank(), type, {user}, {buf}, std::move(after), [weak] {
    if (auto p = weak.lock()) p->flush();
  });
  std::lock_guard<std::mutex> g(pending_->mu);
  pending_->entries.push_back({op, w});
  return w;
}

namespace {
// A call whose result is one tensor: Braid writes `buf` (the tensor, or a dense copy written back
// after). `inputs`: other buffers the call reads, kept alive until it is done.
c10::intrusive_ptr<c10d::Work> inPlace(int rank, c10d::OpType type, at::Tensor& t,
                                       const std::function<braid::Work(const at::Tensor&)>& call,
                                       std::vector<at::Tensor> inputs = {}) {
  at::Tensor buf = dense(t);
  braid::Work w = call(buf);
  std::function<void()> after;
  if (!buf.is_same(t)) after = [t, buf]() mutable { t.copy_(buf); };
  inputs.push_back(buf);
  return WorkBraid::start(rank, type, std::move(w), {t}, std::move(inputs), std::move(after));
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  at::Tensor& t = single(tensors, "broadcast");
  const braid::DataType dt = braidType(t);
  return inPlace(getRank(), c10d::OpType::BROADCAST, t, [&](const at::Tensor& b) {
    return comm().broadcast(ptr(b), ptr(b), count(b), dt, static_cast<int>(opts.rootRank));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  at::Tensor& t = single(tensors, "allreduce");
  const braid::DataType dt = braidType(t);
  const braid::ReduceOp op = braidOp(opts.reduceOp, t);
  return inPlace(getRank(), c10d::OpType::ALLREDUCE, t,
                 [&](const at::Tensor& b) { return comm().allReduce(ptr(b), ptr(b), count(b), dt, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "braid: allreduce_coalesced of no tensors");
  at::Tensor buf = concat(tensors);
  const braid::ReduceOp op = braidOp(opts.reduceOp, tensors[0]);
  braid::Work w = comm().allReduce(ptr(buf), ptr(buf), count(buf), braidType(buf), op);
  return WorkBraid::start(getRank(), c10d::OpType::ALLREDUCE_COALESCED, std::move(w), tensors, {buf},
                          [tensors, buf]() mutable { split(buf, tensors); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor& t = single(tensors, "reduce");
  const braid::DataType dt = braidType(t);
  const braid::ReduceOp op = braidOp(opts.reduceOp, t);
  return inPlace(getRank(), c10d::OpType::REDUCE, t, [&](const at::Tensor& b) {
    return comm().reduce(ptr(b), ptr(b), count(b), dt, op, static_cast<int>(opts.rootRank));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), "braid: allgather needs one list of ",
              getSize(), " output tensors");
  for (const at::Tensor& o : outputs[0])
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                "braid: allgather's output tensors must match the input's size and dtype");
  at::Tensor src = dense(in);
  at::Tensor all = at::empty({getSize() * in.numel()}, in.options());
  braid::Work w = comm().allGather(ptr(src), ptr(all), count(src), braidType(in));
  std::vector<at::Tensor> outs = outputs[0];
  return WorkBraid::start(getRank(), c10d::OpType::ALLGATHER, std::move(w), outs, {src, all},
                          [outs, all]() mutable { split(all, outs); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions&) {
  checkCpu(input);
  checkCpu(output);
  TORCH_CHECK(output.numel() == getSize() * input.numel() && output.scalar_type() == input.scalar_type(),
              "braid: _allgather_base's output must hold world_size times the input, in its dtype");
  at::Tensor src = dense(input);
  return inPlace(getRank(), c10d::OpType::_ALLGATHER_BASE, output, [&](const at::Tensor& b) {
    return comm().allGather(ptr(src), ptr(b), count(src), braidType(input));
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions&) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == static_cast<std::size_t>(getSize()),
              "braid: allgather_coalesced needs world_size lists of outputs");
  at::Tensor src = concat(inputs);
  at::Tensor all = at::empty({getSize() * src.numel()}, src.options());
  braid::Work w = comm().allGather(ptr(src), ptr(all), count(src), braidType(src));
  std::vector<at::Tensor> outs;
  for (auto& list : outputs) outs.insert(outs.end(), list.begin(), list.end());
  return WorkBraid::start(getRank(), c10d::OpType::ALLGATHER_COALESCED, std::move(w), outs, {src, all},
                          [outs, all]() mutable { split(all, outs); });
}

// Gather and scatter are all-to-allv calls in which only the root's row (or column) is non-zero.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  at::Tensor& in = single(inputs, "gather");
  const std::size_t n = static_cast<std::size_t>(getSize()), root = static_cast<std::size_t>(opts.rootRank);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "braid: gather's root ", opts.rootRank, " is outside 0..",
              getSize() - 1);
  const bool isRoot = getRank() == opts.rootRank;
  if (isRoot)
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == n, "braid: gather's root needs one list of ", n, " outputs");
  at::Tensor src = dense(in);
  at::Tensor all = at::empty({isRoot ? getSize() * in.numel() : 0}, in.options());
  std::vector<std::size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
  sc[root] = count(src);
  for (std::size_t q = 0; isRoot && q < n; ++q) {
    rc[q] = count(src);
    rd[q] = q * count(src);
  }
  braid::Work w = comm().allToAllv(ptr(src), sc, sd, ptr(all), rc, rd, braidType(in));
  std::vector<at::Tensor> outs = isRoot ? outputs[0] : std::vector<at::Tensor>{};
  return WorkBraid::start(getRank(), c10d::OpType::GATHER, std::move(w), outs, {src, all},
                          [outs, all]() mutable { split(all, outs); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  at::Tensor& out = single(outputs, "scatter");
  const std::size_t n = static_cast<std::size_t>(getSize()), root = static_cast<std::size_t>(opts.rootRank);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "braid: scatter's root ", opts.rootRank, " is outside 0..",
              getSize() - 1);
  const bool isRoot = getRank() == opts.rootRank;
  at::Tensor src = at::empty({0}, out.options());
  if (isRoot) {
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == n, "braid: scatter's root needs one list of ", n, " inputs");
    for (const at::Tensor& t : inputs[0]) TORCH_CHECK(t.numel() == out.numel(), "braid: scatter's inputs must match the output's size");
    src = concat(inputs[0]);
  }
  std::vector<std::size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
  for (std::size_t q = 0; isRoot && q < n; ++q) {
    sc[q] = count(out);
    sd[q] = q * count(out);
  }
  rc[root] = count(out);
  return inPlace(getRank(), c10d::OpType::SCATTER, out, [&](const at::Tensor& b) {
    return comm().allToAllv(ptr(src), sc, sd, ptr(b), rc, rd, braidType(out));
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "braid: reduce_scatter needs one list of ",
              getSize(), " input tensors");
  for (const at::Tensor& t : inputs[0])
    TORCH_CHECK(t.numel() == out.numel(), "braid: reduce_scatter's inputs must match the output's size");
  at::Tensor src = concat(inputs[0]);
  const braid::ReduceOp op = braidOp(opts.reduceOp, out);
  return inPlace(getRank(), c10d::OpType::REDUCE_SCATTER, out, [&](const at::Tensor& b) {
    return comm().reduceScatter(ptr(src), ptr(b), count(b), braidType(out), op);
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  checkCpu(input);
  checkCpu(output);
  TORCH_CHECK(input.numel() == getSize() * output.numel(), "braid: _reduce_scatter_base's input must hold world_size times the output");
  at::Tensor src = dense(input);
  const braid::ReduceOp op = braidOp(opts.reduceOp, output);
  return inPlace(getRank(), c10d::OpType::_REDUCE_SCATTER_BASE, output, [&](const at::Tensor& b) {
    return comm().reduceScatter(ptr(src), ptr(b), count(b), braidType(output), op);
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& outputSplits,
                                                                std::vector<int64_t>& inputSplits,
                                                                const c10d::AllToAllOptions&) {
  checkCpu(input);
  checkCpu(output);
  const std::size_t n = static_cast<std::size_t>(getSize());
  at::Tensor src = dense(input);
  if (outputSplits.empty() && inputSplits.empty()) {
    TORCH_CHECK(input.numel() % getSize() == 0 && output.numel() == input.numel(),
                "braid: all_to_all_single without split sizes needs equal tensors divisible by world_size");
    return inPlace(getRank(), c10d::OpType::ALLTOALL_BASE, output, [&](const at::Tensor& b) {
      return comm().allToAll(ptr(src), ptr(b), count(src) / n, braidType(input));
    }, {src});
  }
  // Split sizes count rows (the first dimension); an empty list means equal rows.
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, std::vector<std::size_t>& counts,
                    std::vector<std::size_t>& displs) {
    const std::size_t rows = t.dim() ? static_cast<std::size_t>(t.size(0)) : 1;
    const std::size_t perRow = rows ? count(t) / rows : 0;
    TORCH_CHECK(splits.empty() || splits.size() == n, "braid: all_to_all_single needs ", n, " split sizes");
    TORCH_CHECK(!splits.empty() || rows % n == 0, "braid: all_to_all_single: ", rows, " rows do not split equally over ", n,
                " ranks");
    std::size_t off = 0;
    for (std::size_t p = 0; p < n; ++p) {
      const std::size_t r = splits.empty() ? rows / n : static_cast<std::size_t>(splits[p]);
      counts.push_back(r * perRow);
      displs.push_back(off);
      off += r * perRow;
    }
    TORCH_CHECK(off <= count(t), "braid: all_to_all_single's split sizes add up to more rows than the tensor has");
  };
  std::vector<std::size_t> sc, sd, rc, rd;
  layout(input, inputSplits, sc, sd);
  layout(output, outputSplits, rc, rd);
  return inPlace(getRank(), c10d::OpType::ALLTOALL_BASE, output, [&](const at::Tensor& b) {
    return comm().allToAllv(ptr(src), sc, sd, ptr(b), rc, rd, braidType(input));
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions&) {
  const std::size_t n = static_cast<std::size_t>(getSize());
  TORCH_CHECK(inputs.size() == n && outputs.size() == n, "braid: all_to_all needs ", n, " input and ", n, " output tensors");
  at::Tensor src = concat(inputs);
  std::vector<std::size_t> sc, sd, rc, rd;
  std::size_t so = 0, ro = 0;
  for (std::size_t p = 0; p < n; ++p) {
    sc.push_back(count(inputs[p]));
    sd.push_back(so);
    so += sc.back();
    checkCpu(outputs[p]);
    rc.push_back(count(outputs[p]));
    rd.push_back(ro);
    ro += rc.back();
  }
  at::Tensor all = at::empty({static_cast<int64_t>(ro)}, src.options());
  braid::Work w = comm().allToAllv(ptr(src), sc, sd, ptr(all), rc, rd, braidType(src));
  std::vector<at::Tensor> outs = outputs;
  return WorkBraid::start(getRank(), c10d::OpType::ALLTOALL, std::move(w), outs, {src, all},
                          [outs, all]() mutable { split(all, outs); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  at::Tensor& t = single(tensors, "send");
  at::Tensor src = dense(t);
  return deferPeerOp({braid::PeerOp::kSend, ptr(src), count(src), braidType(t), dstRank, tag}, c10d::OpType::SEND, t, src);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  at::Tensor& t = single(tensors, "recv");
  at::Tensor buf = dense(t);
  return deferPeerOp({braid::PeerOp::kRecv, ptr(buf), count(buf), braidType(t), srcRank, tag}, c10d::OpType::RECV, t, buf);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::batchSendRecv(const std::vector<std::tuple<bool, at::Tensor, int, int>>& ops) {
  std::vector<braid::PeerOp> batch;
  std::vector<at::Tensor> outputs, keep;
  std::vector<std::pair<at::Tensor, at::Tensor>> copyBack;  // (user's tensor, dense buffer)
  for (const auto& [isSend, tensor, peer, tag] : ops) {
    checkCpu(tensor);
    at::Tensor buf = dense(tensor);
    keep.push_back(buf);
    outputs.push_back(tensor);
    if (!isSend && !buf.is_same(tensor)) copyBack.emplace_back(tensor, buf);
    batch.push_back({isSend ? braid::PeerOp::kSend : braid::PeerOp::kRecv, ptr(buf), count(buf), braidType(tensor), peer, tag});
  }
  braid::Work w = comm().sendRecvBatch(batch);
  std::function<void()> after;
  if (!copyBack.empty())
    after = [copyBack]() mutable {
      for (auto& [t, buf] : copyBack) t.copy_(buf);
    };
  return WorkBraid::start(getRank(), c10d::OpType::SEND, std::move(w), std::move(outputs), std::move(keep), std::move(after));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::barrier(const c10d::BarrierOptions&) {
  return WorkBraid::start(getRank(), c10d::OpType::BARRIER, comm().barrier(), {});
}

// As gloo's: rank 0 waits for every other rank to arrive, then answers them all. It goes through the
// store torch gave the group, not the communicator, so a rank that fails to arrive is named on every
// rank (rank 0's verdict is what the others read) and the communicator stays as it was.
void ProcessGroupBraid::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const std::chrono::milliseconds timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const std::string round = "braid/monitored_barrier/" + std::to_string(++monitoredRounds_) + "/";
  const std::string verdictKey = round + "verdict";
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  // Store::wait with a zero timeout would wait forever (kNoTimeout): at the deadline, only look.
  auto arrives = [&](const std::string& key, std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return store_->check({key});
    try {
      store_->wait({key}, left);
      return true;
    } catch (const std::exception&) {
      return store_->check({key});
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (getRank() != 0) {
    // Rank 0 answers at its own deadline at the latest: wait that long and a grace beyond it.
    const std::chrono::milliseconds grace = std::max(std::chrono::milliseconds(1000), timeout / 10);
    store_->set(round + std::to_string(getRank()), bytes("arrived"));
    TORCH_CHECK(arrives(verdictKey, deadline + grace), "braid: monitored_barrier on rank ", getRank(),
                ": rank 0 did not answer within ", (timeout + grace).count(),
                " ms (it is slow, hung in another call, or gone; its own error names the ranks it missed)");
    const std::vector<uint8_t> v = store_->get(verdictKey);
    const std::string verdict(v.begin(), v.end());
    TORCH_CHECK(verdict == "ok", "braid: monitored_barrier on rank ", getRank(), ": rank 0 says ", verdict);
    return;
  }
  std::vector<int> missing;
  for (int r = 1; r < getSize() && (waitAllRanks || missing.empty()); ++r)
    if (!arrives(round + std::to_string(r), deadline)) missing.push_back(r);
  std::string verdict = "ok";
  if (!missing.empty()) {
    verdict = missing.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < missing.size(); ++i) verdict += (i ? ", " : "") + std::to_string(missing[i]);
    verdict += std::string(missing.size() == 1 ? " has" : " have") + " not reached monitored_barrier within " +
               std::to_string(timeout.count()) + " ms (slow, hung in another call, or gone)";
    if (!waitAllRanks && getSize() > 2) verdict += "; wait_all_ranks=True names every missing rank";
  }
  store_->set(verdictKey, bytes(verdict));
  for (int r = 1; r < getSize(); ++r) {
    try {
      store_->deleteKey(round + std::to_string(r));
    } catch (const std::exception&) {  // a store without deleteKey keeps them: a few bytes a round
    }
  }
  TORCH_CHECK(verdict == "ok", "braid: monitored_barrier on rank 0: ", verdict);
}

}  // namespace braid::torch_backend
