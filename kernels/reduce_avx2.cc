// Braid: the reduce loops built for AVX2 (+FMA, F16C) via per-function target attributes, so the
// rest of the library keeps the default -march and this code only runs after the dispatcher has
// checked the CPU. Empty on non-x86 hosts.
#if defined(__x86_64__)
#define BRAID_KERNEL_ISA avx2
#define BRAID_KERNEL_TARGET __attribute__((target("avx2,fma,f16c")))
#define BRAID_KERNEL_F16C 256
#include "kernels/reduce_impl.h"

namespace braid::kernels::avx2 {
const KernelTable kTable = makeTable("avx2");
}  // namespace braid::kernels::avx2
#endif
