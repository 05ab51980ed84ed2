// Braid: the reduce loops built for the baseline ISA (x86-64 SSE2, or whatever the host compiler
// targets by default). Always present; the dispatcher falls back to it when nothing better runs.
#define BRAID_KERNEL_ISA generic
#define BRAID_KERNEL_TARGET
#define BRAID_KERNEL_F16C 0
#include "kernels/reduce_impl.h"

namespace braid::kernels::generic {
const KernelTable kTable = makeTable("generic");
}  // namespace braid::kernels::generic
