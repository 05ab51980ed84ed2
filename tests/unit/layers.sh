#!/usr/bin/env bash
# The rooms' include rules (docs/ARCHITECTURE.md, "Rooms"): each folder includes only the rooms
# below it. Prints every include that breaks a rule; exit status 1 if there is one.
#   comm/base/       (the helpers below everything)  braid/ and comm/base/ only
#   comm/bootstrap/  (store, unique ids, launchers)  braid/, comm/base/, comm/bootstrap/
#   transport/       braid/, comm/base/, kernels/, topology/, transport/, the build config (never the communicator, bootstrap or CUDA path)
#   kernels/, topology/  nothing of comm/ or transport/
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
rule comm/base 'braid/|comm/base/'
rule comm/bootstrap 'braid/|comm/base/|comm/bootstrap/'
rule transport 'braid/|comm/base/|transport/|kernels/|topology/|braid_build_config.h'
rule kernels 'braid/|kernels/|braid_build_config.h'
rule topology 'braid/|topology/|comm/base/|braid_build_config.h'
[ "$bad" = 0 ] && echo "every include follows the rooms' rules"
exit "$bad"
