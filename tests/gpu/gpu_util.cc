#include "tests/gpu/gpu_util.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace braid::test {

std::string gpuUnavailableReason() {
  int fds[2];
  if (pipe(fds) != 0) return "pipe() failed";
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    std::string why;
    if (e != cudaSuccess) why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    else if (count < 1) why = "no CUDA device";
    else if ((e = cudaFree(nullptr)) != cudaSuccess)
      why = std::string("creating a CUDA context: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    if (!why.empty() && write(fds[1], why.data(), why.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string why;
  char buf[256];
  ssize_t k;
  while ((k = read(fds[0], buf, sizeof(buf))) > 0) why.append(buf, static_cast<std::size_t>(k));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st)) return "the CUDA probe process died (signal " + std::to_string(WTERMSIG(st)) + ")";
  return why;
}

bool onEmulation() { return dlsym(RTLD_DEFAULT, "fakecudaEmulation") != nullptr; }

FailIpcOpens failIpcOpensHook() { return reinterpret_cast<FailIpcOpens>(dlsym(RTLD_DEFAULT, "fakecudaFailIpcOpens")); }

void skipWithoutGpu(const char* suite) {
  std::string why = gpuUnavailableReason();
  if (why.empty()) return;
  std::printf("%s: SKIPPED, no usable GPU: %s\n", suite, why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

}  // namespace braid::test
