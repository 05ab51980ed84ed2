// Braid as a c10d process group (torch.distributed's backend "braid"). Built only against Braid's
// public C++ API (braid/braid.hpp): every collective becomes one braid::Work on the communicator's
// worker thread, wrapped in a c10d::Work whose future completes when Braid's work does.
//
// torch 1.13 (Debian 12's python3-torch) has the collectives on c10d::ProcessGroup; torch 2.x moved
// them, with the same signatures, to c10d::Backend, which a ProcessGroup holds one of per device
// type. The class derives from whichever of the two the torch it is built against calls on (Base).
#pragma once
#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "work.h"  // (BRAID_TORCH_COALESCING)

namespace braid::torch_backend {

class P2pQueue;

#if TORCH_VERSION_MAJOR >= 2
using Base = c10d::Backend;
#else
using Base = c10d::ProcessGroup;
#endif

class ProcessGroupBraid : public Base {
 public:
  // Rendezvous through the store torch hands the backend: rank 0 makes a Braid unique id and
  // publishes it there; every rank then joins the communicator. `timeout` bounds every call (the
  // communicator's CommOptions::timeoutSec; BRAID_TIMEOUT, when set, wins).
  ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout);
  ~ProcessGroupBraid() override;

  const std::string getBackendName() const override { return "braid"; }
  // Sequence numbers (TORCH_DISTRIBUTED_DEBUG=DETAIL: torch 2.x wraps every backend and sets them).
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  // A receive from whichever rank sends first (dist.recv without src), as gloo's: p2p.h.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
#if BRAID_TORCH_COALESCING
  // torch 2.x routes the all_reduce of a sparse tensor here (1.13 to allreduce).
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    return allreduce(tensors, opts);
  }
  // Coalesced all_gather_into_tensor and reduce_scatter_tensor: one Braid call for the list.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  // The sends and receives made between the two run as one Braid batch (as batch_isend_irecv's);
  // endCoalescing's Work is done when all of them are. Collectives are refused in between (which
  // ends the coalescing): torch gathers its coalesced all_reduce, all_gather_into_tensor and
  // reduce_scatter_tensor itself, and running one as called could deadlock where NCCL's grouping
  // would not (a receive queued ahead of it waits for a send queued behind the peer's).
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
#endif
  // torch.distributed.batch_isend_irecv on this group (braid_torch routes it here): the batch of
  // (is_send, tensor, peer as a rank of this group, tag) runs as one Braid group, so that no order of
  // sends and receives deadlocks. One Work per operation, in order.
  std::vector<c10::intrusive_ptr<c10d::Work>> batchSendRecv(const std::vector<std::tuple<bool, at::Tensor, int, int>>& ops);
  // The sum all-reduce of a dense CPU tensor, in place, through Braid's C++ API on this group's
  // communicator, waited on (bench/torch_compare: the backend's cost in the same processes).
  void cppAllReduce(const at::Tensor& t);
  // This rank's live record (braid::Communicator::statusRecord), and the unique id the group's
  // ranks met through ("host:port/nonce": what `braid status --unique-id` takes).
  std::string statusRecord() const { return comm_->statusRecord(); }
  const std::string& uniqueId() const { return uniqueId_; }

  // For torch.distributed.Backend.register_backend: (store, rank, size, timeout) -> process group.
  static c10::intrusive_ptr<Base> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                       const std::chrono::duration<float>& timeout);
  // Runs what every group of this process still has queued, with what their Work callbacks
  // queue meanwhile (braid::Communicator::finishQueued), without the GIL. braid_torch calls it at
  // interpreter exit (atexit): a call left queued would otherwise finish on Braid's worker thread
  // while Python shuts down, and its future's Python callback could no longer take the GIL.
  static void finishAllQueued();

 private:
  // The communicator, after handing Braid the pending sends and receives (p2p.h).
  braid::Communicator& comm();
  // allreduce of a sparse COO tensor (sum): all-gathers of the counts, indices and values, coalesced.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts);
  // Refuses a send or receive that cannot be made (peer, tag, tensor), on this rank alone.
  void checkPeerOp(bool isSend, const at::Tensor& user, int peer, int tag) const;
  // Queues one send or receive of the user's tensor (p2p.h: held back until flushed).
  c10::intrusive_ptr<c10d::Work> deferPeerOp(bool isSend, at::Tensor user, int peer, int tag);
  std::unique_ptr<braid::Communicator> comm_;
  std::string uniqueId_;
  std::shared_ptr<P2pQueue> p2p_;  // (weak references in its Works: they flush it)
  c10::intrusive_ptr<c10d::Store> store_;  // the group's: monitoredBarrier meets through it
  std::chrono::milliseconds timeout_;
  std::uint64_t monitoredRounds_ = 0;
  std::atomic<std::uint64_t> seq_{0};  // calls made through comm() since setSequenceNumberForGroup
  bool coalescing_ = false;                                // between startCoalescing and endCoalescing
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;  // the sends and receives made meanwhile
};

}  // namespace braid::torch_backend
