// Braid: the reduce loops built for AVX-512 (F, BW, VL) via per-function target attributes, so the
// rest of the library keeps the default -march and this code only runs after the dispatcher has
// checked the CPU. Beyond the wider vectors, BW/VL give masked compares and 16-bit permutes that
// make the bf16 rounding loop about 1.5x faster than the AVX2 build. Empty on non-x86 hosts.
#if defined(__x86_64__)
#define BRAID_KERNEL_ISA avx512
#define BRAID_KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define BRAID_KERNEL_F16C 512
#include "kernels/reduce_impl.h"

namespace braid::kernels::avx512 {
const KernelTable kTable = makeTable("avx512");
}  // namespace braid::kernels::avx512
#endif
