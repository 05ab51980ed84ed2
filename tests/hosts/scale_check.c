/* Run on every rank of a large job (tests/hosts): the collectives the algorithms' connections
 * serve, a send/recv both ways at once between ranks half the job apart (not connected when the
 * communicator was created), an all-to-all, and the communicator split 8 ways by rank % 8 with an
 * all-reduce and a broadcast in each part; every result checked exactly. With --alltoall-refused
 * (ranks' open files capped low) the all-to-all must fail on every rank with the numbers (open
 * files, ulimit -n), and nothing more runs. Exits non-zero, saying why, if anything is off. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "braid/braid.h"

static int rank_ = 0;

static int fail(const char* what, braidComm_t comm) {
  fprintf(stderr, "scale-check: rank %d: %s: %s\n", rank_, what, braidGetLastError(comm));
  return 1;
}

/* Descriptors this process holds (/proc/self/fd, less the one reading it). */
static int openFds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int k = 0;
  while (readdir(d)) ++k;
  closedir(d);
  return k - 3; /* ".", ".." and the directory's own */
}

int main(int argc, char** argv) {
  const int refused = argc > 1 && strcmp(argv[1], "--alltoall-refused") == 0;
  braidComm_t world, part;
  if (braidCommInitFromEnv(&world) != braidSuccess) return fail("init", NULL);
  int n = 0;
  braidCommUserRank(world, &rank_);
  braidCommCount(world, &n);
  const int rank = rank_;
  const long long sumRanks = (long long)n * (n - 1) / 2;
  const int fdsAfterSetup = openFds();

  long long s = rank;
  if (braidAllReduce(&s, &s, 1, braidInt64, braidSum, world, NULL) != braidSuccess) return fail("all-reduce", world);
  if (s != sumRanks) return fprintf(stderr, "scale-check: rank %d: all-reduce %lld, want %lld\n", rank, s, sumRanks), 2;

  int* all = malloc(sizeof(int) * 3 * (size_t)n);
  int mine[3] = {rank, -rank, 7};
  if (braidAllGather(mine, all, 3, braidInt32, world, NULL) != braidSuccess) return fail("all-gather", world);
  for (int r = 0; r < n; ++r)
    if (all[3 * r] != r || all[3 * r + 1] != -r || all[3 * r + 2] != 7)
      return fprintf(stderr, "scale-check: rank %d: all-gather block %d wrong\n", rank, r), 2;

  for (int i = 0; i < 3 * n; ++i) all[i] = i / 3 + rank;  /* block b (of 3 ints) from rank r: b + r */
  int block[3] = {0, 0, 0};
  if (braidReduceScatter(all, block, 3, braidInt32, braidSum, world, NULL) != braidSuccess) return fail("reduce-scatter", world);
  for (int i = 0; i < 3; ++i)
    if (block[i] != (long long)n * rank + sumRanks)
      return fprintf(stderr, "scale-check: rank %d: reduce-scatter %d, want %lld\n", rank, block[i], n * rank + sumRanks), 2;

  double b = rank == n - 1 ? 2.5 : -1;
  if (braidBroadcast(&b, &b, 1, braidFloat64, n - 1, world, NULL) != braidSuccess) return fail("broadcast", world);
  if (b != 2.5) return fprintf(stderr, "scale-check: rank %d: broadcast %g\n", rank, b), 2;
  long long r = rank, red = -1;
  if (braidReduce(&r, &red, 1, braidInt64, braidSum, n / 2, world, NULL) != braidSuccess) return fail("reduce", world);
  if (rank == n / 2 && red != sumRanks) return fprintf(stderr, "scale-check: reduce %lld\n", red), 2;
  if (braidBarrier(world) != braidSuccess) return fail("barrier", world);

  /* Half the job apart: on another host, and no ring, tree or column neighbour. */
  const int half = n / 2, partner = rank < half ? rank + half : rank - half;  /* an odd job's last rank sits out */
  int out[1000], in[1000];
  for (int i = 0; i < 1000; ++i) out[i] = rank * 1000 + i, in[i] = -1;
  if (rank < 2 * half) {
    braidGroupStart();
    braidSend(out, 1000, braidInt32, partner, world, NULL);
    braidRecv(in, 1000, braidInt32, partner, world, NULL);
    if (braidGroupEnd() != braidSuccess) return fail("send/recv with the rank half the job apart", world);
    for (int i = 0; i < 1000; ++i)
      if (in[i] != partner * 1000 + i) return fprintf(stderr, "scale-check: rank %d: from rank %d wrong\n", rank, partner), 2;
  }

  if (refused) {
    /* The refusal below fails the communicator on every rank: let every rank finish the calls
     * above first (a rank still finishing its barrier would fail there instead). */
    if (braidBarrier(world) != braidSuccess) return fail("barrier", world);
    sleep(1);
  }
  int* a2aIn = malloc(sizeof(int) * 2 * (size_t)n);
  int* a2aOut = malloc(sizeof(int) * 2 * (size_t)n);
  for (int d = 0; d < n; ++d) a2aIn[2 * d] = rank, a2aIn[2 * d + 1] = d, a2aOut[2 * d] = a2aOut[2 * d + 1] = -1;
  braidResult_t got = braidAllToAll(a2aIn, a2aOut, 2, braidInt32, world, NULL);
  if (refused) {
    /* Refused where a rank's limit is too low, and every rank fails at once with the numbers. */
    const char* why = braidGetLastError(world);
    if (got == braidSuccess || !strstr(why, "open files") || !strstr(why, "ulimit -n"))
      return fprintf(stderr, "scale-check: rank %d: all-to-all under the cap returned %d: %s\n", rank, got, why), 2;
    if (rank == 0) printf("scale-check: %d ranks: every collective exact, send/recv half the job apart exact; "
                          "rank 0 held %d descriptors after set-up; all-to-all refused: %s\n", n, fdsAfterSetup, why);
    braidCommAbort(world);
    free(all);
    free(a2aIn);
    free(a2aOut);
    return 0;
  } else {
    if (got != braidSuccess) return fail("all-to-all", world);
    for (int q = 0; q < n; ++q)
      if (a2aOut[2 * q] != q || a2aOut[2 * q + 1] != rank)
        return fprintf(stderr, "scale-check: rank %d: all-to-all block %d wrong\n", rank, q), 2;
  }

  const int color = rank % 8;
  if (braidCommSplit(world, color, rank, &part) != braidSuccess) return fail("split", world);
  int size = 0, sub = 0;
  braidCommCount(part, &size);
  braidCommUserRank(part, &sub);
  long long want = 0, members = 0, last = -1;
  for (int q = color; q < n; q += 8) want += q, ++members, last = q;
  long long sum = rank;
  int from = rank;
  if (braidAllReduce(&sum, &sum, 1, braidInt64, braidSum, part, NULL) != braidSuccess ||
      braidBroadcast(&from, &from, 1, braidInt32, size - 1, part, NULL) != braidSuccess)
    return fail("a part of the split", part);
  if (size != members || sub != rank / 8 || sum != want || from != last) {
    fprintf(stderr, "scale-check: rank %d (color %d): part of %d ranks (want %lld), rank %d in it, sum %lld (want %lld), "
            "broadcast %d (want %lld)\n", rank, color, size, members, sub, sum, want, from, last);
    return 2;
  }
  if (rank == 0)
    printf("scale-check: %d ranks: every collective exact, send/recv half the job apart exact, all-to-all exact; "
           "split 8 ways, every part exact\n", n);
  braidCommDestroy(part);
  free(all);
  free(a2aIn);
  free(a2aOut);
  return braidCommDestroy(world) == braidSuccess ? 0 : 1;
}
