// Whether this process holds a capability in its effective set (from /proc/self/status), for
// checks the kernel makes the same way: CAP_IPC_LOCK lets memory registration pin past
// RLIMIT_MEMLOCK. Header-only, so that test programs outside Braid (the verbs emulation) share it.
#pragma once
#include <fstream>
#include <string>

namespace braid {

inline constexpr int kCapIpcLock = 14;

inline bool hasCapability(int cap) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> cap) & 1;
  return false;
}

}  // namespace braid
