#include "common/blas.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/common.hpp"

namespace memtrade::blas {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  MT_CHECK(m > 0 && n > 0 && k > 0, "sgemm: sizes must be positive");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

int threads() { return openblas_get_num_threads(); }

const char* core() { return openblas_get_corename(); }

namespace {
#if defined(__x86_64__) || defined(__i386__)
// This CPU's widest SIMD as OpenBLAS's kernel sets need it: 3 AVX-512 (F, BW, VL, DQ), 2 AVX2 + FMA, 1 older.
int simd_level() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return 3;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 2 : 1;
}
#endif
// The widest of OpenBLAS's kernel sets for a level (nullptr below AVX2).
const char* core_for_level(int level) { return level == 3 ? "SkylakeX" : level == 2 ? "Haswell" : nullptr; }
}  // namespace

void use_the_cpus_kernels(char** argv) {
#if defined(__x86_64__) || defined(__i386__)  // the x86 fallbacks below; other architectures keep OpenBLAS's choice
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  const std::string now = core();
  if (now != "Prescott" && now != "Core2") return;  // DYNAMIC_ARCH's fallbacks for CPUs it does not know
  const char* best = core_for_level(simd_level());
  if (!best) return;
  setenv("OPENBLAS_CORETYPE", best, 1);
  execv("/proc/self/exe", argv);  // returns only on failure: go on with the generic kernels
  unsetenv("OPENBLAS_CORETYPE");
#else
  (void)argv;
#endif
}

std::string narrower_kernels_note(const std::string& core, int cpu_level, const char* coretype_env) {
  // OpenBLAS's AVX-512 kernel sets are level 3, its AVX2 ones level 2.
  const int level = core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids" ? 3
                    : core == "Haswell" || core == "Zen" || core == "Excavator"            ? 2
                                                                                           : 1;
  if (cpu_level < 2 || level >= cpu_level) return {};
  const std::string simd = cpu_level == 3 ? "AVX-512" : "AVX2 + FMA";
  return "OpenBLAS runs its " + core + " kernels on a CPU with " + simd +
         (coretype_env ? " because $OPENBLAS_CORETYPE is " + std::string(coretype_env) + ": unset it to let OpenBLAS choose"
                       : ": set $OPENBLAS_CORETYPE to an " + simd + " kernel set (" + core_for_level(cpu_level) + ")") +
         "; until then its GEMMs, the sgemm ceiling included, are figures of the narrower kernels";
}

std::string narrower_kernels_note() {
#if defined(__x86_64__) || defined(__i386__)
  return narrower_kernels_note(core(), simd_level(), std::getenv("OPENBLAS_CORETYPE"));
#else
  return {};
#endif
}

}  // namespace memtrade::blas

namespace memtrade::blas {
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  MT_CHECK(m > 0 && n > 0 && k > 0, "dgemm: sizes must be positive");
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
}  // namespace memtrade::blas
