#!/usr/bin/env bash
# The rooms' include rules (docs/ARCHITECTURE.md, "Rooms"): each folder includes only the rooms
# below it. Prints every include that breaks a rule; exit status 1 if there is one.
#   base/            (the ground floor: status, config, log, sockets, auth, hostlists)  braid/ and base/ only
#   comm/bootstrap/  (store, unique ids, launchers)  braid/, base/, comm/bootstrap/
#   transport/       braid/, base/, kernels/, topology/, transport/, the build config (never the communicator, bootstrap or CUDA path)
#   kernels/, topology/  nothing of comm/ or transport/
#   tools/           everything above, but a communicator only through comm/introspect.h
#   sim/             (the simulator, above comm/: tools and tests use it)  braid/, base/, comm/, transport/, sim/
#   ddp/             (a client of the public API)  braid/ and ddp/, plus the two kernel headers whose GPU
#                    conversions it shares with the engine (kernels/half.h, kernels/reduce_cuda.h) and
#                    comm/cuda/cuda_util.h for the CUDA error texts every Braid message uses
set -uo pipefail
cd "$(dirname "$0")/../.."
bad=0
rule() {  # FOLDER ALLOWED-REGEX: every quoted include under FOLDER must match ALLOWED-REGEX
  local folder=$1 allowed=$2 line
  while IFS= read -r line; do
    echo "layer rule broken: $line (allowed from $folder: $allowed)"
    bad=1
  done < <(grep -rn --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' '^#include "' "$folder" |
           grep -vE "#include \"($allowed)")
}
rule base 'braid/|base/'
rule comm/bootstrap 'braid/|base/|comm/bootstrap/'
rule transport 'braid/|base/|transport/|kernels/|topology/|braid_build_config.h'
rule kernels 'braid/|kernels/|braid_build_config.h'
rule topology 'braid/|topology/|base/|braid_build_config.h'
rule ddp 'braid/|ddp/|braid_build_config.h|kernels/half\.h"|kernels/reduce_cuda\.h"|comm/cuda/cuda_util\.h"'
rule sim 'braid/|base/|comm/|transport/|sim/'
# The tools read a communicator through comm/introspect.h, never its internals.
while IFS= read -r line; do
  echo "layer rule broken: $line (tools/ reads a communicator through comm/introspect.h)"
  bad=1
done < <(grep -rn --include='*.h' --include='*.cc' -E '^#include "comm/(communicator|c_handle)\.h"' tools)
[ "$bad" = 0 ] && echo "every include follows the rooms' rules"
exit "$bad"
