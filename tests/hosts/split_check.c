/* Run on every rank of a job (tests/hosts): splits the communicator into 8 by rank % 8, then in
 * each part an exact all-reduce of the members' world ranks and a broadcast from the part's last
 * member; exits non-zero, saying why, if anything is off. */
#include <stdio.h>

#include "braid/braid.h"

int main(void) {
  braidComm_t world, part;
  if (braidCommInitFromEnv(&world) != braidSuccess) {
    fprintf(stderr, "split-check: %s\n", braidGetLastError(NULL));
    return 1;
  }
  int rank = 0, n = 0;
  braidCommUserRank(world, &rank);
  braidCommCount(world, &n);
  const int color = rank % 8;
  if (braidCommSplit(world, color, rank, &part) != braidSuccess) {
    fprintf(stderr, "split-check: rank %d: split: %s\n", rank, braidGetLastError(world));
    return 1;
  }
  int size = 0, sub = 0;
  braidCommCount(part, &size);
  braidCommUserRank(part, &sub);
  long long want = 0, members = 0, last = -1;
  for (int r = color; r < n; r += 8) want += r, ++members, last = r;
  long long got = rank;
  int from = rank;
  if (braidAllReduce(&got, &got, 1, braidInt64, braidSum, part, NULL) != braidSuccess ||
      braidBroadcast(&from, &from, 1, braidInt32, size - 1, part, NULL) != braidSuccess) {
    fprintf(stderr, "split-check: rank %d: %s\n", rank, braidGetLastError(part));
    return 1;
  }
  if (size != members || sub != rank / 8 || got != want || from != last) {
    fprintf(stderr, "split-check: rank %d (color %d): part of %d ranks (want %lld), rank %d in it, sum %lld (want %lld), "
            "broadcast %d (want %lld)\n", rank, color, size, members, sub, got, want, from, last);
    return 2;
  }
  if (rank == 0) printf("split-check: %d ranks split 8 ways, every part exact\n", n);
  braidCommDestroy(part);
  return braidCommDestroy(world) == braidSuccess ? 0 : 1;
}
