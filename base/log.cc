#include "base/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace braid::log {
namespace {
// Plain atomics, no destructors: logging stays safe from detached threads during process exit.
std::atomic<int> gLevel{static_cast<int>(Level::kWarn)};
std::atomic<unsigned> gMask{kAll};
std::atomic<int> gRank{-1};
char gHost[64] = "?";

const char* subsysName(Subsys s) {
  switch (s) {
    case kInit: return "INIT";
    case kColl: return "COLL";
    case kNet: return "NET";
    case kShm: return "SHM";
    case kTune: return "TUNE";
    case kBoot: return "BOOT";
    default: return "ALL";
  }
}
}  // namespace

void configure(const std::string& level, const std::string& subsysList) {
  Level l = Level::kWarn;
  if (level == "NONE") l = Level::kNone;
  else if (level == "INFO") l = Level::kInfo;
  else if (level == "TRACE") l = Level::kTrace;
  gLevel = static_cast<int>(l);
  unsigned mask = 0;
  std::size_t start = 0;
  while (start <= subsysList.size()) {
    std::size_t end = subsysList.find(',', start);
    if (end == std::string::npos) end = subsysList.size();
    std::string item = subsysList.substr(start, end - start);
    for (Subsys s : {kInit, kColl, kNet, kShm, kTune, kBoot})
      if (item == subsysName(s)) mask |= s;
    if (item == "ALL") mask = kAll;
    start = end + 1;
  }
  gMask = mask ? mask : static_cast<unsigned>(kAll);
  gethostname(gHost, sizeof(gHost) - 1);
}

void setRank(int rank) { gRank = rank; }

bool enabled(Level level, Subsys subsys) {
  return static_cast<int>(level) <= gLevel.load(std::memory_order_relaxed) &&
         (gMask.load(std::memory_order_relaxed) & subsys);
}

void write(Level level, Subsys subsys, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* lv = level == Level::kWarn ? "WARN" : level == Level::kInfo ? "INFO" : "TRACE";
  // One fprintf per line so that lines from concurrent threads do not interleave.
  std::fprintf(stderr, "%s:%d:%ld [%d] %s %s %s\n", gHost, static_cast<int>(getpid()),
               static_cast<long>(syscall(SYS_gettid)), gRank.load(), subsysName(subsys), lv, msg);
}

}  // namespace braid::log
