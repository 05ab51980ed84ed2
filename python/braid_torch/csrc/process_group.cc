#include "process_group.h"

#include <pybind11/pybind11.h>  // gil_scoped_release (~ProcessGroupBraid)

#include <algorithm>
#include <cstring>
#include <mutex>
#include <functional>
#include <string>
#include <utility>

#include "p2p.h"
#include "tensors.h"
#include "work.h"

namespace braid::torch_backend {
namespace {

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

// The one tensor a call takes (c10d passes lists: one tensor per device in the old multi-device API).
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "braid: ", what, " takes exactly one tensor per call, got ", tensors.size());
  checkDevice(tensors[0]);
  return tensors[0];
}

// Contiguous memory for Braid: the tensor itself when it is, else a copy (written back after the
// call for outputs).
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// All tensors of a list flattened end to end into one new contiguous buffer of their dtype.
at::Tensor concat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const at::Tensor& t : ts) {
    checkSameDevice(ts[0], t, "a call");
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

// The communicators of this process's groups (weak: the list keeps none alive, nor delays a
// group's destructor), for finishAllQueued. Never freed: a group may go during the interpreter's
// last steps, after static destructors.
std::mutex liveMu;
std::vector<std::weak_ptr<braid::Comm>>& live() {
  static auto* comms = new std::vector<std::weak_ptr<braid::Comm>>();
  return *comms;
}

}  // namespace

void ProcessGroupBraid::finishAllQueued() {
  std::vector<std::weak_ptr<braid::Comm>> comms;
  {
    std::lock_guard<std::mutex> g(liveMu);
    comms = live();
  }
  for (auto& weak : comms)
    if (auto impl = weak.lock()) braid::Communicator(std::move(impl)).finishQueued();
}

ProcessGroupBraid::ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : Base(rank, size), store_(store), timeout_(braidTimeout(timeout)) {
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
  char idText[256] = {};
  if (braidUniqueIdToString(&id, idText, sizeof(idText)) == braidSuccess) uniqueId_ = idText;
  // The process group's timeout bounds every Braid call, unless BRAID_TIMEOUT says otherwise.
  braid::CommOptions options;
  options.timeoutSec = std::max(0.001, static_cast<double>(timeout.count()) / 1000.0);
  auto c = braid::Communicator::fromUniqueId(id, size, rank, options);
  TORCH_CHECK(c.ok(), "braid: rank ", rank, " could not join the communicator of ", size, " ranks: ", c.status().toString());
  comm_ = std::make_unique<braid::Communicator>(std::move(*c));
  {
    std::lock_guard<std::mutex> g(liveMu);
    auto& comms = live();
    comms.erase(std::remove_if(comms.begin(), comms.end(), [](const auto& w) { return w.expired(); }), comms.end());
    comms.emplace_back(comm_->impl());
  }
  p2p_ = std::make_shared<P2pQueue>(comm_.get(), rank, size, options.timeoutSec);
}

ProcessGroupBraid::~ProcessGroupBraid() {
  if (!p2p_) return;
  p2p_->close();  // nothing is left unsent; Works still held elsewhere keep their results
  // Destroying the communicator drains its queue on Braid's worker thread, and a Work finishing
  // there may drop the last reference to a tensor Python made, which takes the GIL. torch destroys
  // a process group from Python, holding the GIL: let go of it meanwhile, or each waits for the
  // other (destroy_process_group right after async calls nobody waited on).
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    comm_.reset();
  }
}

c10::intrusive_ptr<Base> ProcessGroupBraid::create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                   const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<ProcessGroupBraid>(store, rank, size,
                                                std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

braid::Communicator& ProcessGroupBraid::comm() {
  if (coalescing_) {
    // Refused, and the coalescing ends here: torch's context manager raises out without calling
    // endCoalescing. What was sent and received in it stays queued, as outside one.
    coalescing_ = false;
    coalesced_.clear();
    TORCH_CHECK(false, "braid: only sends and receives may be made between startCoalescing and endCoalescing on rank ",
                getRank(), " (torch coalesces all_reduce, all_gather_into_tensor and reduce_scatter_tensor without a device; "
                "make other collectives outside)");
  }
  p2p_->flush();  // calls run in the order they were made
  seq_.fetch_add(1, std::memory_order_relaxed);
  return *comm_;
}

// Every rank starts at 0 and counts the calls made through comm(): the same number on every rank
// after the same calls, as torch's checks (TORCH_DISTRIBUTED_DEBUG=DETAIL) expect.
void ProcessGroupBraid::setSequenceNumberForGroup() { seq_.store(0, std::memory_order_relaxed); }
uint64_t ProcessGroupBraid::getSequenceNumberForGroup() { return seq_.load(std::memory_order_relaxed); }

void ProcessGroupBraid::checkPeerOp(bool isSend, const at::Tensor& user, int peer, int tag) const {
  const char* what = isSend ? "send to" : "recv from";
  checkDevice(user);
  (void)braidType(user);
  TORCH_CHECK(tag != kManifestTag, "braid: ", what, " rank ", peer, ": tag ", tag, " is reserved by Braid (any other int is a tag)");
  if (!isSend && peer == kAnySource) return;  // recvAnysource
  TORCH_CHECK(peer >= 0 && peer < getSize(), "braid: ", what, " rank ", peer, " on rank ", getRank(),
              ": the peer is outside 0..", getSize() - 1, " (this group's ranks)");
  TORCH_CHECK(peer != getRank(), "braid: ", what, " rank ", peer, ": that is this rank itself");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::deferPeerOp(bool isSend, at::Tensor user, int peer, int tag) {
  // Checked here, so that a bad one is refused alone instead of failing the batch it would join.
  checkPeerOp(isSend, user, peer, tag);
  at::Tensor buf;
  std::function<void()> after;  // a receive into a non-contiguous or device tensor lands in `buf` first
  if (user.device().is_cpu()) {
    buf = dense(user);
  } else {
    // A device tensor goes through host memory, where the tag matching (p2p.h) holds messages: a
    // send copies it out now on torch's current stream (so after the work queued there before the
    // send); a receive is copied in on the stream current at the call, ahead of the Work's
    // completion there (WorkBraid::complete), which is what wait() makes the waiter's stream wait for.
    buf = at::empty(user.sizes(), user.options().device(at::kCPU));  // (dense)
    if (isSend) buf.copy_(user);
  }
  if (!isSend && !buf.is_same(user)) after = [user, buf]() mutable { user.copy_(buf); };
  std::weak_ptr<P2pQueue> weak = p2p_;
  auto w = WorkBraid::deferred(getRank(), isSend ? c10d::OpType::SEND : c10d::OpType::RECV, {user}, {buf}, std::move(after),
                               [weak] {
                                 if (auto p = weak.lock()) p->flush();
                               });
  p2p_->push(isSend, buf, peer, tag, w);
  if (coalescing_) coalesced_.push_back(w);
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
    return comm().broadcast(ptr(b), ptr(b), count(b), dt, static_cast<int>(opts.rootRank), braidStream(b));
  });
}

// The sum of sparse COO tensors: every rank's coalesced indices and values gathered (padded to the
// largest count, which an all-gather of the counts gives first), laid end to end in rank order and
// coalesced, which sums the entries that share an index (what gloo computes). The result replaces
// the tensor's contents, as gloo's does. Only the counts are waited for here; the Work completes
// with the values' all-gather, whose `after` builds the result.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "braid: all_reduce of a sparse tensor supports ReduceOp.SUM only");
  TORCH_CHECK(t.layout() == at::kSparse, "braid: all_reduce supports sparse COO tensors, not ", t.layout());
  TORCH_CHECK(t.device().is_cpu(), "braid: all_reduce of sparse tensors on the CPU only, not ", t.device());
  const at::Tensor in = t.coalesce();
  const int n = getSize();
  const int64_t sparseDims = in.sparse_dim(), nnz = in._nnz();
  at::Tensor counts = at::empty({n}, at::kLong), mine = at::full({1}, nnz, at::kLong);
  braid::Communicator& c = comm();  // (one call in torch's count)
  const braid::Status counted = c.allGather(ptr(mine), ptr(counts), 1, braid::DataType::kInt64).wait();
  TORCH_CHECK(counted.ok(), "braid: sparse all_reduce: ", counted.toString());
  const int64_t most = counts.max().item<int64_t>();
  std::vector<int64_t> valueShape = in._values().sizes().vec();
  valueShape[0] = most;
  at::Tensor idx = at::zeros({sparseDims, most}, at::kLong), val = at::zeros(valueShape, in._values().options());
  idx.narrow(1, 0, nnz).copy_(in._indices());
  val.narrow(0, 0, nnz).copy_(in._values());
  at::Tensor allIdx = at::empty({n, sparseDims, most}, at::kLong);
  valueShape.insert(valueShape.begin(), n);
  at::Tensor allVal = at::empty(valueShape, val.options());
  (void)c.allGather(ptr(idx), ptr(allIdx), count(idx), braid::DataType::kInt64);  // (in order: done before the values)
  braid::Work w = c.allGather(ptr(val), ptr(allVal), count(val), braidType(val));
  auto after = [t, counts, allIdx, allVal, n]() mutable {
    std::vector<at::Tensor> indices, values;
    for (int q = 0; q < n; ++q) {
      const int64_t k = counts[q].item<int64_t>();
      indices.push_back(allIdx[q].narrow(1, 0, k));
      values.push_back(allVal[q].narrow(0, 0, k));
    }
    t.copy_(at::sparse_coo_tensor(at::cat(indices, 1), at::cat(values, 0), t.sizes()).coalesce());
  };
  return WorkBraid::start(getRank(), c10d::OpType::ALLREDUCE, std::move(w), {t}, {idx, val, allIdx, allVal}, std::move(after));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "braid: allreduce takes exactly one tensor per call, got ", tensors.size());
  if (tensors[0].is_sparse()) return allreduceSparse(tensors[0], opts);
  at::Tensor& t = single(tensors, "allreduce");
  const braid::DataType dt = braidType(t);
  const braid::ReduceOp op = braidOp(opts.reduceOp, t);
  return inPlace(getRank(), c10d::OpType::ALLREDUCE, t,
                 [&](const at::Tensor& b) { return comm().allReduce(ptr(b), ptr(b), count(b), dt, op, braidStream(b)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "braid: allreduce_coalesced of no tensors");
  at::Tensor buf = concat(tensors);
  const braid::ReduceOp op = braidOp(opts.reduceOp, tensors[0]);
  braid::Work w = comm().allReduce(ptr(buf), ptr(buf), count(buf), braidType(buf), op, braidStream(buf));
  return WorkBraid::start(getRank(), c10d::OpType::ALLREDUCE_COALESCED, std::move(w), tensors, {buf},
                          [tensors, buf]() mutable { split(buf, tensors); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor& t = single(tensors, "reduce");
  const braid::DataType dt = braidType(t);
  const braid::ReduceOp op = braidOp(opts.reduceOp, t);
  return inPlace(getRank(), c10d::OpType::REDUCE, t, [&](const at::Tensor& b) {
    return comm().reduce(ptr(b), ptr(b), count(b), dt, op, static_cast<int>(opts.rootRank), braidStream(b));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), "braid: allgather needs one list of ",
              getSize(), " output tensors");
  for (const at::Tensor& o : outputs[0]) {
    checkSameDevice(in, o, "allgather");
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                "braid: allgather's output tensors must match the input's size and dtype");
  }
  at::Tensor src = dense(in);
  at::Tensor all = at::empty({getSize() * in.numel()}, in.options());
  braid::Work w = comm().allGather(ptr(src), ptr(all), count(src), braidType(in), braidStream(src));
  std::vector<at::Tensor> outs = outputs[0];
  return WorkBraid::start(getRank(), c10d::OpType::ALLGATHER, std::move(w), outs, {src, all},
                          [outs, all]() mutable { split(all, outs); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions&) {
  checkSameDevice(input, output, "_allgather_base");
  TORCH_CHECK(output.numel() == getSize() * input.numel() && output.scalar_type() == input.scalar_type(),
              "braid: _allgather_base's output must hold world_size times the input, in its dtype");
  at::Tensor src = dense(input);
  return inPlace(getRank(), c10d::OpType::_ALLGATHER_BASE, output, [&](const at::Tensor& b) {
    return comm().allGather(ptr(src), ptr(b), count(src), braidType(input), braidStream(b));
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions&) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == static_cast<std::size_t>(getSize()),
              "braid: allgather_coalesced needs world_size lists of outputs");
  at::Tensor src = concat(inputs);
  at::Tensor all = at::empty({getSize() * src.numel()}, src.options());
  braid::Work w = comm().allGather(ptr(src), ptr(all), count(src), braidType(src), braidStream(src));
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
  if (isRoot) {
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == n, "braid: gather's root needs one list of ", n, " outputs");
    for (const at::Tensor& o : outputs[0]) checkSameDevice(in, o, "gather");
  }
  at::Tensor src = dense(in);
  at::Tensor all = at::empty({isRoot ? getSize() * in.numel() : 0}, in.options());
  std::vector<std::size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
  sc[root] = count(src);
  for (std::size_t q = 0; isRoot && q < n; ++q) {
    rc[q] = count(src);
    rd[q] = q * count(src);
  }
  braid::Work w = comm().allToAllv(ptr(src), sc, sd, ptr(all), rc, rd, braidType(in), braidStream(src));
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
    for (const at::Tensor& t : inputs[0]) {
      checkSameDevice(out, t, "scatter");
      TORCH_CHECK(t.numel() == out.numel(), "braid: scatter's inputs must match the output's size");
    }
    src = concat(inputs[0]);
  }
  std::vector<std::size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
  for (std::size_t q = 0; isRoot && q < n; ++q) {
    sc[q] = count(out);
    sd[q] = q * count(out);
  }
  rc[root] = count(out);
  return inPlace(getRank(), c10d::OpType::SCATTER, out, [&](const at::Tensor& b) {
    return comm().allToAllv(ptr(src), sc, sd, ptr(b), rc, rd, braidType(out), braidStream(b));
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "braid: reduce_scatter needs one list of ",
              getSize(), " input tensors");
  for (const at::Tensor& t : inputs[0]) {
    checkSameDevice(out, t, "reduce_scatter");
    TORCH_CHECK(t.numel() == out.numel(), "braid: reduce_scatter's inputs must match the output's size");
  }
  at::Tensor src = concat(inputs[0]);
  const braid::ReduceOp op = braidOp(opts.reduceOp, out);
  return inPlace(getRank(), c10d::OpType::REDUCE_SCATTER, out, [&](const at::Tensor& b) {
    return comm().reduceScatter(ptr(src), ptr(b), count(b), braidType(out), op, braidStream(b));
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  checkSameDevice(input, output, "_reduce_scatter_base");
  TORCH_CHECK(input.numel() == getSize() * output.numel(), "braid: _reduce_scatter_base's input must hold world_size times the output");
  at::Tensor src = dense(input);
  const braid::ReduceOp op = braidOp(opts.reduceOp, output);
  return inPlace(getRank(), c10d::OpType::_REDUCE_SCATTER_BASE, output, [&](const at::Tensor& b) {
    return comm().reduceScatter(ptr(src), ptr(b), count(b), braidType(output), op, braidStream(b));
  }, {src});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& outputSplits,
                                                                std::vector<int64_t>& inputSplits,
                                                                const c10d::AllToAllOptions&) {
  checkSameDevice(input, output, "all_to_all_single");
  const std::size_t n = static_cast<std::size_t>(getSize());
  at::Tensor src = dense(input);
  if (outputSplits.empty() && inputSplits.empty()) {
    TORCH_CHECK(input.numel() % getSize() == 0 && output.numel() == input.numel(),
                "braid: all_to_all_single without split sizes needs equal tensors divisible by world_size");
    return inPlace(getRank(), c10d::OpType::ALLTOALL_BASE, output, [&](const at::Tensor& b) {
      return comm().allToAll(ptr(src), ptr(b), count(src) / n, braidType(input), braidStream(b));
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
    return comm().allToAllv(ptr(src), sc, sd, ptr(b), rc, rd, braidType(input), braidStream(b));
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
    checkSameDevice(src, outputs[p], "all_to_all");
    rc.push_back(count(outputs[p]));
    rd.push_back(ro);
    ro += rc.back();
  }
  at::Tensor all = at::empty({static_cast<int64_t>(ro)}, src.options());
  braid::Work w = comm().allToAllv(ptr(src), sc, sd, ptr(all), rc, rd, braidType(src), braidStream(src));
  std::vector<at::Tensor> outs = outputs;
  return WorkBraid::start(getRank(), c10d::OpType::ALLTOALL, std::move(w), outs, {src, all},
                          [outs, all]() mutable { split(all, outs); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return deferPeerOp(true, single(tensors, "send"), dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return deferPeerOp(false, single(tensors, "recv"), srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return deferPeerOp(false, single(tensors, "recv"), kAnySource, tag);
}

std::vector<c10::intrusive_ptr<c10d::Work>> ProcessGroupBraid::batchSendRecv(
    const std::vector<std::tuple<bool, at::Tensor, int, int>>& ops) {
  for (const auto& [isSend, tensor, peer, tag] : ops) checkPeerOp(isSend, tensor, peer, tag);  // all or none
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const auto& [isSend, tensor, peer, tag] : ops) works.push_back(deferPeerOp(isSend, tensor, peer, tag));
  p2p_->flush();  // as one: a batch's sends and receives go to Braid together whatever their order
  return works;
}

#if BRAID_TORCH_COALESCING
// One all-gather of the inputs laid end to end; rank r's block then holds its inputs in order, and
// output i takes input i's piece of every block.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const c10d::AllgatherOptions&) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "braid: allgather_into_tensor_coalesced needs one output per input");
  const int64_t n = getSize();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    checkSameDevice(inputs[i], outputs[i], "allgather_into_tensor_coalesced");
    TORCH_CHECK(outputs[i].numel() == n * inputs[i].numel() && outputs[i].scalar_type() == inputs[i].scalar_type(),
                "braid: allgather_into_tensor_coalesced's output ", i, " must hold world_size times its input, in its dtype");
  }
  at::Tensor src = concat(inputs);
  at::Tensor all = at::empty({n * src.numel()}, src.options());
  braid::Work w = comm().allGather(ptr(src), ptr(all), count(src), braidType(src), braidStream(src));
  return WorkBraid::start(getRank(), c10d::OpType::COALESCED, std::move(w), outputs, {src, all}, [outputs, all, n]() mutable {
    const at::Tensor blocks = all.view({n, -1});
    int64_t off = 0;
    for (at::Tensor& o : outputs) {
      const int64_t k = o.numel() / n;
      o.copy_(blocks.narrow(1, off, k).reshape(o.sizes()));
      off += k;
    }
  });
}

// One reduce-scatter of the inputs' blocks side by side: rank r's block is every input's r-th
// piece in order, so that its result is the outputs laid end to end.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "braid: reduce_scatter_tensor_coalesced needs one output per input");
  const int64_t n = getSize();
  std::vector<at::Tensor> pieces;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    checkSameDevice(inputs[0], inputs[i], "reduce_scatter_tensor_coalesced");
    checkSameDevice(inputs[i], outputs[i], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK(inputs[i].numel() == n * outputs[i].numel() && outputs[i].scalar_type() == inputs[i].scalar_type() &&
                    inputs[i].scalar_type() == inputs[0].scalar_type(),
                "braid: reduce_scatter_tensor_coalesced's input ", i, " must hold world_size times its output, in its dtype "
                "(one dtype for the list)");
    pieces.push_back(inputs[i].reshape({n, -1}));
  }
  at::Tensor src = at::cat(pieces, 1);  // (n, sum of the outputs' sizes), dense
  at::Tensor buf = at::empty({src.size(1)}, src.options());
  const braid::ReduceOp op = braidOp(opts.reduceOp, outputs[0]);
  braid::Work w = comm().reduceScatter(ptr(src), ptr(buf), count(buf), braidType(buf), op, braidStream(buf));
  return WorkBraid::start(getRank(), c10d::OpType::COALESCED, std::move(w), outputs, {src, buf},
                          [outputs, buf]() mutable { split(buf, outputs); });
}

void ProcessGroupBraid::startCoalescing() {
  TORCH_CHECK(!coalescing_, "braid: startCoalescing on rank ", getRank(), " before the last one's endCoalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::endCoalescing() {
  TORCH_CHECK(coalescing_, "braid: endCoalescing on rank ", getRank(), " without startCoalescing");
  coalescing_ = false;
  p2p_->flush();  // as one batch, as batch_isend_irecv's
  return WorkAll::over(getRank(), std::move(coalesced_));
}
#endif

void ProcessGroupBraid::cppAllReduce(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "braid: _cpp_all_reduce takes a dense CPU tensor");
  const braid::Status s = comm().allReduce(ptr(t), ptr(t), count(t), braidType(t), braid::ReduceOp::kSum).wait();
  TORCH_CHECK(s.ok(), "braid: ", s.toString());
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
