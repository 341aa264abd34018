// For Highway sources that need fixed-width vectors: kernels that hold vectors in arrays (register blocks)
// or cut their data into blocks of whole vectors, which sizeless vector types (SVE, RVV) allow neither of,
// and sources a compiler cannot build for SVE (the include line says which). Those targets are left out and
// such machines run the fixed-width target (NEON). Include it first, before <hwy/foreach_target.h> and
// <hwy/highway.h>.
#if (defined(__aarch64__) || defined(__riscv)) && !defined(HWY_DISABLED_TARGETS)
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
