#include "base/process.h"

#include <cstdio>
#include <cstring>

namespace braid {

namespace {
// The state letter of /proc/PID/stat ("R", "S", "T", "Z", ...), or 0 when unreadable.
char stateLetter(int pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  std::FILE* f = pid > 0 ? std::fopen(path, "r") : nullptr;
  if (!f) return 0;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  const char* close = read ? std::strrchr(line, ')') : nullptr;  // "pid (comm) S ...": comm may hold spaces
  if (!close || close[1] != ' ') return 0;
  return close[2];
}
}  // namespace

ProcState procState(int pid) {
  const char s = stateLetter(pid);
  if (s == 0) return ProcState::kUnreadable;
  return s == 'Z' || s == 'X' ? ProcState::kEnded : ProcState::kRuns;
}

bool procStopped(int pid) {
  const char s = stateLetter(pid);
  return s == 'T' || s == 't';
}

}  // namespace braid
