// Braid: the reduce loops built for AVX-512 (F, BW, VL) via per-function target attributes, with
// 512-bit vectors preferred: these loops stream memory, where the wider vector halves the
// instruction count and the frequency penalty that makes GCC default to 256 bits does not pay off
// less. Empty on non-x86 hosts.
#if defined(__x86_64__)
#define BRAID_KERNEL_ISA avx512
#define BRAID_KERNEL_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,prefer-vector-width=512")))
#define BRAID_KERNEL_F16C 512
#include "kernels/reduce_impl.h"

namespace braid::kernels::avx512 {
const KernelTable kTable = makeTable("avx512");
}  // namespace braid::kernels::avx512
#endif
