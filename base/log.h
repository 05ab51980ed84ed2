// Logging: `host:pid:tid [rank] SUBSYS LEVEL message` on stderr, filtered by BRAID_DEBUG (level) and
// BRAID_DEBUG_SUBSYS (subsystem mask). Nothing above TRACE belongs inside per-chunk loops.
#pragma once
#include <string>

namespace braid::log {

enum class Level : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };
enum Subsys : unsigned { kInit = 1, kColl = 2, kNet = 4, kShm = 8, kTune = 16, kBoot = 32, kAll = ~0u };

// Applied at communicator creation from the config; the last call wins for the whole process.
void configure(const std::string& level, const std::string& subsysList);
void setRank(int rank);
bool enabled(Level level, Subsys subsys);
void write(Level level, Subsys subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace braid::log

#define BRAID_LOG(level, subsys, ...)                                                      \
  do {                                                                                     \
    if (::braid::log::enabled(::braid::log::Level::level, ::braid::log::subsys))           \
      ::braid::log::write(::braid::log::Level::level, ::braid::log::subsys, __VA_ARGS__); \
  } while (0)
