#include "base/process.h"

#include <cstdio>
#include <cstring>

namespace braid {

ProcState procState(int pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  std::FILE* f = pid > 0 ? std::fopen(path, "r") : nullptr;
  if (!f) return ProcState::kUnreadable;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  const char* close = read ? std::strrchr(line, ')') : nullptr;  // "pid (comm) S ...": comm may hold spaces
  if (!close || close[1] != ' ') return ProcState::kUnreadable;
  return close[2] == 'Z' || close[2] == 'X' ? ProcState::kEnded : ProcState::kRuns;
}

}  // namespace braid
