/* The README's C example, built and run by the test suite (multiproc: example-c). */
#include <braid/braid.h>
#include <stdio.h>

int main(void) {
  braidComm_t comm;
  if (braidCommInitFromEnv(&comm) != braidSuccess) {
    fprintf(stderr, "init failed: %s\n", braidGetLastError(NULL));
    return 1;
  }
  int rank;
  braidCommUserRank(comm, &rank);
  float x[4] = {rank, rank, rank, rank};
  braidResult_t r = braidAllReduce(x, x, 4, braidFloat, braidSum, comm, NULL); /* in place */
  if (r != braidSuccess) fprintf(stderr, "allreduce: %s\n", braidGetLastError(comm));
  else printf("rank %d: x[0] = %g\n", rank, x[0]);
  braidCommDestroy(comm);
  return r != braidSuccess;
}
