// What /proc says of a process of this pid namespace.
#pragma once

namespace braid {

// kRuns: /proc/PID/stat names a state other than zombie or dead; kEnded: a zombie (killed, not yet
// reaped: where nobody reaps orphans, as under a container's first process, it stays one) or dead;
// kUnreadable: no such entry (no such process), or /proc hides it.
enum class ProcState { kRuns, kEnded, kUnreadable };
ProcState procState(int pid);
// The process is stopped (SIGSTOP, SIGTSTP) or stopped by a debugger: it counts as running above.
bool procStopped(int pid);

}  // namespace braid
