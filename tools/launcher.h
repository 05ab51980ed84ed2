// Braid: `braid run`, the launcher that starts a job's local ranks with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and stops
// them all as soon as one fails.
#pragma once

namespace braid::tools {

// argv[0] is "run"; the rest are the options and the program, as in
//   braid run -n N [--master-addr A] [--master-port P] [--nnodes K --node-rank R] [--tag-output]
//             [--] PROGRAM ARGS...
// Returns the exit status for the process: 0 when every rank exited 0, 2 for bad arguments, the
// first failed rank's exit status (128+signal if it was killed), or 128+signal when the launcher
// itself was interrupted by SIGINT/SIGTERM.
// Call it from a single-threaded process: it forks, and it blocks SIGINT, SIGTERM and SIGCHLD in
// the calling thread to read them from a signalfd (other threads would take them instead).
int runLauncher(int argc, char** argv);

}  // namespace braid::tools
