#include "base/fdlimit.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>

#include "base/log.h"

namespace braid::fdlimit {

namespace {
long asLong(rlim_t v) { return v == RLIM_INFINITY ? -1 : static_cast<long>(v); }
std::string text(long v) { return v < 0 ? std::string("unlimited") : std::to_string(v); }
}  // namespace

Limits current() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0) return {};
  return {asLong(l.rlim_cur), asLong(l.rlim_max)};
}

int openNow() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

Status reserve(long more, const std::string& who, const std::string& what) {
  const Limits l = current();
  const int open = openNow();
  const long need = (open < 0 ? 0 : open) + more + kMargin;
  if (l.soft < 0 || need <= l.soft) return Status::Ok();
  if (l.hard < 0 || need <= l.hard) {
    rlimit raised{l.hard < 0 ? RLIM_INFINITY : static_cast<rlim_t>(l.hard), l.hard < 0 ? RLIM_INFINITY : static_cast<rlim_t>(l.hard)};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      BRAID_LOG(kInfo, kInit, "raised the soft limit on open files from %ld to %s: %s needs %ld (%s)", l.soft,
                text(l.hard).c_str(), who.c_str(), need, what.c_str());
      return Status::Ok();
    }
  }
  return Status::SystemError(who + " needs " + std::to_string(need) + " open files (" + std::to_string(open) +
                             " open now, " + what + ", " + std::to_string(kMargin) + " spare), but this process may open " +
                             text(l.soft) + " (ulimit -n; hard limit " + text(l.hard) + "): raise it before starting the "
                             "ranks, e.g. `ulimit -n " + std::to_string(need < 4096 ? 4096 : need) +
                             "` (LimitNOFILE= for a systemd service, --ulimit nofile= for a container)");
}

std::string exhaustedText(int err) {
  if (err == EMFILE)
    return "too many open files: this process may open " + text(current().soft) + " (ulimit -n; raise it)";
  if (err == ENFILE) return "too many open files in the system (fs.file-max)";
  return "";
}

}  // namespace braid::fdlimit
