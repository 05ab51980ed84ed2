// Braid: `braid run`, the launcher that starts a job's local ranks with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), hosts the
// job's rendezvous store on node 0, and stops the ranks all as soon as one fails.
#pragma once
#include <string>

namespace braid::tools {

// The job's rendezvous store, hosted by the launcher on node 0 (`braid run`: tools/braid_main.cc
// gives one), so that rank 0 holds one store connection instead of one for every rank of the job.
// Without one, rank 0 hosts the store, as under torchrun, mpirun and srun.
class StoreHost {
 public:
  virtual ~StoreHost() = default;
  // Whether to host it (BRAID_STORE_HOST): asked before any rank starts, which then learns so.
  virtual bool wanted() = 0;
  // Starts the store at addr:port (MASTER_PORT + 1) for the ranks that prove `secret` (BRAID_SECRET
  // where set, else this); "" or why not. Called after the ranks are forked (the launcher forks
  // single-threaded).
  virtual std::string start(const std::string& addr, int port, const std::string& secret) = 0;
  // Every rank that joined has left: a later communicator of the job needs a new store (start).
  virtual bool finished() = 0;
  // Serves until every rank that joined has left, or BRAID_TIMEOUT has passed (1 s where the job
  // failed: its notices were relayed as they came); then stops.
  virtual void waitUntilAllLeft(bool jobFailed) = 0;
  virtual void stop() = 0;
};

// argv[0] is "run"; the rest are the options and the program, as in
//   braid run -n N [--master-addr A] [--master-port P] [--nnodes K --node-rank R] [--tag-output]
//             [--] PROGRAM ARGS...
// Returns the exit status for the process: 0 when every rank exited 0, 2 for bad arguments, the
// first failed rank's exit status (128+signal if it was killed), or 128+signal when the launcher
// itself was interrupted by SIGINT/SIGTERM.
// Call it from a single-threaded process: it forks, and it blocks SIGINT, SIGTERM and SIGCHLD in
// the calling thread to read them from a signalfd (other threads would take them instead).
// `store`: where node 0's launcher hosts the store (null: rank 0 hosts it).
int runLauncher(int argc, char** argv, StoreHost* store = nullptr);

}  // namespace braid::tools
