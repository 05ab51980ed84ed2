// Open-file limits (RLIMIT_NOFILE): how many descriptors this process has open and may open, room
// made for a communicator before it connects, and the text of every "too many open files" error.
#pragma once
#include <string>

#include "braid/status.hpp"

namespace braid::fdlimit {

struct Limits {
  long soft = -1;  // -1: unlimited
  long hard = -1;
};
Limits current();
// Entries in /proc/self/fd (-1 when it cannot be read).
int openNow();

// Makes room for `more` descriptors beyond those open now (plus a margin for the library's own):
// if the soft limit is too low and the hard one allows it, the soft limit is raised to the hard
// one (as an unprivileged process may). Otherwise an error that says what `who` needs, what is
// open and what is allowed, and how to raise it (ulimit -n).
Status reserve(long more, const std::string& who, const std::string& what);

// The margin reserve() keeps for descriptors the library opens beside the counted ones (the
// store's connection, eventfds and timers, a listener, a segment being mapped).
inline constexpr long kMargin = 16;

// "Too many open files (this process may open N: ulimit -n)" for EMFILE, the system-wide text for
// ENFILE; "" for any other errno.
std::string exhaustedText(int err);
inline bool exhausted(int err) { return !exhaustedText(err).empty(); }

}  // namespace braid::fdlimit
