/* One rank of bench/scale: how long creating a communicator takes, what it adds in open
 * descriptors and resident memory, and the 8 B and 1 MiB all-reduce times after it. Prints one
 * line: "scale-probe rank R of N: create S s, fds +F, rss +K KiB, allreduce 8B U us, 1MiB U us". */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "braid/braid.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int openFds(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  for (struct dirent* e; (e = readdir(d));)
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

static long rssKiB(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) v = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return v;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* The median over `reps` all-reduces of `count` floats, in microseconds (a barrier before each). */
static double allReduceUs(braidComm_t comm, float* buf, size_t count, int reps) {
  double t[64];
  for (int i = 0; i < reps; ++i) {
    if (braidBarrier(comm) != braidSuccess) return -1;
    double t0 = now();
    if (braidAllReduce(buf, buf, count, braidFloat32, braidSum, comm, NULL) != braidSuccess) return -1;
    t[i] = (now() - t0) * 1e6;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmpDouble);
  return t[reps / 2];
}

int main(void) {
  const int fds0 = openFds();
  const long rss0 = rssKiB();
  const double t0 = now();
  braidComm_t comm;
  if (braidCommInitFromEnv(&comm) != braidSuccess) {
    fprintf(stderr, "scale-probe: %s\n", braidGetLastError(NULL));
    return 1;
  }
  const double created = now() - t0;
  const int fds = openFds() - fds0;
  const long rss = rssKiB() - rss0;
  int rank = 0, n = 0;
  braidCommUserRank(comm, &rank);
  braidCommCount(comm, &n);
  float* buf = calloc(1 << 18, sizeof(float));
  const double small = allReduceUs(comm, buf, 2, 31), large = allReduceUs(comm, buf, 1 << 18, 11);
  free(buf);
  if (small < 0 || large < 0) {
    fprintf(stderr, "scale-probe: %s\n", braidGetLastError(comm));
    return 1;
  }
  printf("scale-probe rank %d of %d: create %.3f s, fds +%d, rss +%ld KiB, allreduce 8B %.1f us, 1MiB %.1f us\n", rank, n,
         created, fds, rss, small, large);
  return braidCommDestroy(comm) == braidSuccess ? 0 : 1;
}
