/* Braid: collective communication for CPUs and GPUs, with NCCL's C shapes.
 *
 * Contract (every function):
 *  - Returns a braidResult_t; braidGetErrorString names the code, braidGetLastError(comm) says what
 *    exactly went wrong (rank, peer, transport, collective, sequence number, and the knob to turn).
 *  - A bad argument returns braidInvalidArgument, does nothing, and leaves the communicator usable.
 *  - Any other failure (a peer died, ranks called different collectives, a timeout) ends the
 *    communicator: every later call returns that error until braidCommDestroy or braidCommAbort.
 *  - With host buffers and stream == NULL a call returns when the collective is complete on this
 *    rank. No call waits longer than BRAID_TIMEOUT seconds (default 300; inf: no limit), which
 *    bounds the whole call.
 *  - In place: send == recv; for all-gather send == recv + rank*sendcount, for reduce-scatter
 *    recv == send + rank*recvcount (NCCL's conventions). Send and receive buffers that overlap in
 *    any other way are braidInvalidArgument (nothing is sent). Braid cannot see buffers that are
 *    too short for count, or memory another thread writes during the call.
 *  - CUDA (a build configured with -Dcuda): send and recv may be CUDA device (or managed) memory,
 *    found with the driver's pointer attributes. The call then returns at once and is ordered with
 *    `stream` (a cudaStream_t; NULL is the legacy default stream): it starts after the work queued
 *    on the stream before it, and work queued after it sees its result. Send and recv of different
 *    memory types, or device memory in a build without CUDA, are braidInvalidArgument. Host buffers
 *    with a stream: the stream is waited for, then the call runs as with NULL. A failure found after
 *    the call returned (braidCudaError, braidTimeout, a peer's error) ends the communicator:
 *    braidCommGetAsyncError reports it and every later call returns it. Each rank uses the device
 *    whose context was current when it created the communicator; see docs/API.md for the rest.
 *    A call made on a stream being captured (cudaStreamBeginCapture) becomes a node of the graph
 *    and runs at every launch. From a communicator's first captured call on, each of its calls runs
 *    when its stream reaches it, not in the order the calls were made: calls on different streams
 *    must then be ordered by the streams themselves (events), the same way on every rank, or two
 *    calls of the same shape may meet the other ranks' calls in a different order, and their data
 *    mix with no error.
 *  - A communicator is used by one thread at a time (like one CUDA stream in NCCL); different
 *    communicators are independent. A call made while another thread is inside a call of the same
 *    communicator is braidInvalidUsage (naming both calls), and it ends the communicator on every
 *    rank, the other thread's call included: the two threads' calls may already have met other
 *    ranks' calls of the other thread. Threads that take turns without overlapping are allowed, and
 *    must make their calls in the same order on every rank: that Braid cannot check.
 *  - Files: a communicator makes room for its connections under RLIMIT_NOFILE before it opens any
 *    (raising the soft limit toward the hard one when needed); when the hard limit is too low every
 *    rank fails at creation, naming ulimit -n, what it needs and what it may open.
 *  - After braidCommDestroy or braidCommAbort the handle stays valid for braidGetLastError,
 *    braidCommCount and braidCommUserRank (other calls are braidInvalidUsage); it keeps a few KiB.
 */
#ifndef BRAID_BRAID_H_
#define BRAID_BRAID_H_

#include <stddef.h>

#include "braid/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BRAID_MAJOR 0
#define BRAID_MINOR 1
#define BRAID_PATCH 0
#define BRAID_UNIQUE_ID_BYTES 128

typedef struct braidComm* braidComm_t;

/* Opaque, 128 bytes like ncclUniqueId: the rendezvous address and a random job nonce. */
typedef struct {
  char internal[BRAID_UNIQUE_ID_BYTES];
} braidUniqueId;

typedef enum {
  braidSuccess = 0,
  braidCudaError = 1,
  braidSystemError = 2,
  braidInternalError = 3,
  braidInvalidArgument = 4,
  braidInvalidUsage = 5,
  braidRemoteError = 6,
  braidInProgress = 7,
  braidTimeout = 8,
  braidAborted = 9,
  braidNumResults = 10
} braidResult_t;

typedef enum {
  braidInt8 = 0, braidChar = 0,
  braidUint8 = 1,
  braidInt32 = 2, braidInt = 2,
  braidUint32 = 3,
  braidInt64 = 4,
  braidUint64 = 5,
  braidFloat16 = 6, braidHalf = 6,
  braidFloat32 = 7, braidFloat = 7,
  braidFloat64 = 8, braidDouble = 8,
  braidBfloat16 = 9,
  braidFloat8e4m3 = 10, /* NCCL's ncclFloat8e4m3: torch's float8_e4m3fn (no infinity, largest 448) */
  braidFloat8e5m2 = 11, /* NCCL's ncclFloat8e5m2 */
  braidInt16 = 12,      /* Braid's own, after NCCL's types */
  braidUint16 = 13,
  braidNumTypes = 14
} braidDataType_t;

typedef enum { braidSum = 0, braidProd = 1, braidMax = 2, braidMin = 3, braidAvg = 4, braidNumOps = 5 } braidRedOp_t;

/* Opens a rendezvous listener in this process (on BRAID_COMM_ID's host:port if set) and describes
 * it in *uniqueId. Pass the id to every rank out of band (MPI_Bcast, a file, ...). The listener
 * lives until every rank of the communicator has left. */
BRAID_EXPORT braidResult_t braidGetUniqueId(braidUniqueId* uniqueId);
/* "host:port/nonce" form of an id, for command lines and logs; buf needs 128 bytes. */
BRAID_EXPORT braidResult_t braidUniqueIdToString(const braidUniqueId* uniqueId, char* buf, size_t bufSize);
BRAID_EXPORT braidResult_t braidUniqueIdFromString(const char* text, braidUniqueId* uniqueId);

/* Collective over nranks processes; blocks until all have joined or BRAID_TIMEOUT passes. */
BRAID_EXPORT braidResult_t braidCommInitRank(braidComm_t* comm, int nranks, braidUniqueId commId, int rank);
/* Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun, braid run), else Open MPI's or
 * Slurm's variables; rank 0 hosts the rendezvous store on MASTER_PORT. */
BRAID_EXPORT braidResult_t braidCommInitFromEnv(braidComm_t* comm);
/* Releases the communicator after its last collective (asynchronous calls of the C++ API still
 * queued run first, in order). Collective: each rank waits (at most
 * BRAID_TIMEOUT) until every other rank has called destroy or left, and returns braidInvalidUsage,
 * naming both calls, if any rank's calls did not match (e.g. a message nobody read). Rank 0 (env
 * mode) then waits for the others to leave, so that the store outlives their last use of it. The
 * handle itself stays valid: any later call on it returns braidInvalidUsage ("destroyed or
 * aborted"). */
BRAID_EXPORT braidResult_t braidCommDestroy(braidComm_t comm);
/* Stops at once: calls in flight on other threads return braidAborted within a few milliseconds,
 * other ranks get an error naming this rank, and everything the communicator held (sockets, shared
 * memory, threads) is released. Later calls on the handle return braidInvalidUsage. */
BRAID_EXPORT braidResult_t braidCommAbort(braidComm_t comm);
BRAID_EXPORT braidResult_t braidCommCount(const braidComm_t comm, int* count);
BRAID_EXPORT braidResult_t braidCommUserRank(const braidComm_t comm, int* rank);
/* braidSuccess, or the error that ended the communicator (also one raised by another rank). */
BRAID_EXPORT braidResult_t braidCommGetAsyncError(braidComm_t comm, braidResult_t* asyncError);

/* The color of a rank that takes part in braidCommSplit but joins no new communicator. */
#define BRAID_SPLIT_NOCOLOR (-1)
/* Splits `comm` as ncclCommSplit does: every rank of `comm` calls it; those passing the same color
 * (>= 0) form a new communicator, ranked by `key` (ties by their rank in `comm`), with `comm`'s
 * settings (BRAID_TIMEOUT, interfaces, ...). A rank passing BRAID_SPLIT_NOCOLOR gets *newcomm =
 * NULL. Runs two all-gathers on `comm`, then each new communicator's init; `comm` stays usable and
 * independent of the new ones. A rank's bad arguments (a color below -1, newcomm NULL) make every
 * rank return braidInvalidArgument naming it, and no communicator is made. Not inside
 * braidGroupStart/End. */
BRAID_EXPORT braidResult_t braidCommSplit(braidComm_t comm, int color, int key, braidComm_t* newcomm);

BRAID_EXPORT braidResult_t braidAllReduce(const void* sendbuff, void* recvbuff, size_t count, braidDataType_t datatype,
                                          braidRedOp_t op, braidComm_t comm, void* stream);
BRAID_EXPORT braidResult_t braidAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, braidDataType_t datatype,
                                          braidComm_t comm, void* stream);
BRAID_EXPORT braidResult_t braidReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, braidDataType_t datatype,
                                              braidRedOp_t op, braidComm_t comm, void* stream);
BRAID_EXPORT braidResult_t braidBroadcast(const void* sendbuff, void* recvbuff, size_t count, braidDataType_t datatype, int root,
                                          braidComm_t comm, void* stream);
BRAID_EXPORT braidResult_t braidReduce(const void* sendbuff, void* recvbuff, size_t count, braidDataType_t datatype,
                                       braidRedOp_t op, int root, braidComm_t comm, void* stream);
/* Point to point: a send completes when its data has been handed to the transport (small) or
 * received (large); match every send with a recv on the peer, in the same order. */
BRAID_EXPORT braidResult_t braidSend(const void* sendbuff, size_t count, braidDataType_t datatype, int peer, braidComm_t comm,
                                     void* stream);
BRAID_EXPORT braidResult_t braidRecv(void* recvbuff, size_t count, braidDataType_t datatype, int peer, braidComm_t comm,
                                     void* stream);
BRAID_EXPORT braidResult_t braidBarrier(braidComm_t comm);
/* All-to-all: block p of this rank's send buffer (count elements at sendbuff + p*count) goes to
 * rank p, which puts it at recvbuff + r*count, r being this rank. In place: sendbuff == recvbuff.
 * Host buffers; CUDA device buffers are braidInvalidArgument for now. */
BRAID_EXPORT braidResult_t braidAllToAll(const void* sendbuff, void* recvbuff, size_t count, braidDataType_t datatype,
                                         braidComm_t comm, void* stream);
/* All-to-all with per-peer counts and displacements, in elements (MPI_Alltoallv's four arrays, one
 * entry per rank): sendcounts[p] elements from sendbuff + sdispls[p] go to rank p, which puts them
 * at its recvbuff + rdispls[r]; its recvcounts[r] must be the same number (a rank whose counts do
 * not match its peer's gets braidInvalidUsage naming both, and the communicator ends, as for any
 * mismatch). sendcounts[r] == recvcounts[r] for this rank r. In place: sendbuff == recvbuff (the
 * send side is copied first). Host buffers only, as braidAllToAll. */
BRAID_EXPORT braidResult_t braidAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                                          const size_t* recvcounts, const size_t* rdispls, braidDataType_t datatype,
                                          braidComm_t comm, void* stream);

/* Groups, as NCCL's ncclGroupStart/ncclGroupEnd: calls made between them on this thread are
 * checked at once (a bad argument is returned then and leaves the group as it was) and run at the
 * outermost braidGroupEnd. There, per communicator in the order each first appeared, its sends and
 * receives run together as one, so that no order of posting them on one communicator deadlocks
 * (every rank sending to every other before receiving, say), then its collectives in call order.
 * Each send and receive is still matched one for one, in order per pair: a grouped send may meet
 * a plain braidRecv when the group holds only sends and receives (a collective in the group runs
 * after all of them, which a peer calling in plain order would not expect). Not yet: several
 * communicators whose grouped sends and receives wait on each other (they run one communicator
 * after the other), and device buffers in a group (braidInvalidArgument). Groups nest;
 * braidGroupEnd returns the first error of the group. */
BRAID_EXPORT braidResult_t braidGroupStart(void);
BRAID_EXPORT braidResult_t braidGroupEnd(void);

/* Host memory that the other ranks of this host can map (NCCL has ncclMemAlloc for the same
 * reason): an all-reduce of 256 KiB or more whose buffers on every rank come from braidMemAlloc
 * reads and reduces straight from the peers' buffers instead of copying through staging rings.
 * Any other memory still works, through the staged path. The memory is zeroed and its pages are
 * resident on return. Thread-safe. */
BRAID_EXPORT braidResult_t braidMemAlloc(void** ptr, size_t bytes);
/* Frees memory from braidMemAlloc (NULL is ignored). Not while a collective uses it. */
BRAID_EXPORT braidResult_t braidMemFree(void* ptr);

BRAID_EXPORT const char* braidGetErrorString(braidResult_t result);
/* The last error's message on this communicator (or, for comm == NULL, on this thread). */
BRAID_EXPORT const char* braidGetLastError(braidComm_t comm);

#ifdef __cplusplus
}
#endif
#endif /* BRAID_BRAID_H_ */
