/* kernels_avx512.c - AVX-512 level of rlai_matmul.
 *
 * The development machine has no AVX-512, so no AVX-512 kernel can be
 * verified there. Batch invariance (kernels_avx2.c: every output's float
 * accumulation is the same sequence whatever T, its position in the
 * batch, the work split or the thread count) must hold on every level, so
 * until AVX-512 kernels can be run and checked against that contract the
 * AVX-512 level uses the AVX2 matmul for every type, mode and T (valid on
 * any AVX-512 CPU; kernels.c selects this level only when cpuid and XCR0
 * report AVX-512F/BW/VL/DQ with OS-enabled ZMM state). The earlier
 * unverified T == 1 kernels for Q4_0/Q4_1/Q8_0 (two blocks per 512-bit
 * register, 16-lane accumulator) summed blocks in a different order than
 * the T > 1 tiles and were removed. A future kernel here must follow the
 * canonical per-output sequence of kernels_avx2.c (e.g. 16 rows per zmm
 * lane for T == 1), which makes its results bit-identical to AVX2's. */
#include "kernels_impl.h"

void rlai__mm_avx512(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch)
{
    rlai__mm_avx2(j, r0, r1, t0, t1, scratch);
}
