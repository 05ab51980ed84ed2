#!/usr/bin/env bash
# Open MPI's remote-start agent for test hosts (mpirun --mca plm_rsh_agent THIS): mpirun calls it
# as an ssh, "AGENT [OPTION...] HOST COMMAND...", to start its daemon (orted) on HOST. Here HOST is a
# test host's address, 10.213.0.K, and the command runs in host hK's namespaces: those of a process
# already living there, whose PID is in $MPI_AGENT_DIR/hK.pid. (The hosts' namespace files under
# /run/braid-testhosts cannot be entered from inside another host's mount namespace, where mpirun
# runs; a process's /proc/PID/ns/ can.)
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
[ $# -ge 2 ] || { echo "mpi_agent: usage: mpi_agent [OPTION...] HOST COMMAND..." >&2; exit 2; }
host=$1
shift
pidfile=${MPI_AGENT_DIR:?mpi_agent: MPI_AGENT_DIR is not set}/h${host##*.}.pid
[ -r "$pidfile" ] || { echo "mpi_agent: no process on host $host ($pidfile)" >&2; exit 2; }
exec nsenter -t "$(cat "$pidfile")" --net --mount --uts -- /bin/sh -c "$*"
