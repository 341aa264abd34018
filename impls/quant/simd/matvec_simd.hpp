// The quantized and dense matvec kernels in portable SIMD (Google Highway), dispatched at run time to the
// best target this CPU supports (AVX-512, AVX2+FMA, SSE4, ... or scalar; common/simd/targets.hpp restricts
// it). Semantics as matvec.hpp's matvec_cpu and dense baselines: codes decoded in registers, every packed
// byte read once, fp32 accumulation with the group's scale applied to the group's partial sum, OpenMP
// over rows, no allocation. matvec_cpu uses these except where a hand-written AVX-512 path is compiled in
// and dispatch is not restricted below AVX-512.
#pragma once

#include <cstdint>

#include "common/dtype.hpp"
#include "impls/quant/formats.hpp"

namespace memtrade::quant::simd {

// The CPU kernels' software prefetch this far down the code stream, once per cache line (rows are
// contiguous): one core's hardware prefetch alone keeps too few lines in flight to stream the weights
// from DRAM.
inline constexpr int64_t kPrefetchBytes = 4096;
// The dense fp32 / bf16 rows, which spend less arithmetic per byte, twice as far. Zen 5, 4096 x 4096, one
// process alternating the distances call by call (caches flushed before each): against 4 KB, bf16 0.85-0.90
// of the time and fp32 0.91-0.96 where memory ran above 60 GB/s, 0.86 and 0.93 on one thread, level on two
// threads where it ran at 40-60 GB/s; 16 and 32 KB no better than 8 KB on the whole.
inline constexpr int64_t kDensePrefetchBytes = 8192;

void matvec(const QLayout& L, const uint8_t* blob, const float* x, float* y);
// Rows [r0, r0 + nr) of deq(W) into out[nr x K], bit for bit dequantize()'s values.
void dequant_rows(const QLayout& L, const uint8_t* blob, int64_t r0, int64_t nr, float* out);
// Y [M x N] = X [M x K] deq(W)^T for small M (matmul_cpu's path for decode batches): blocks of W's rows
// decoded tile by tile into per-thread scratch carved from ws, each tile multiplied with every row of X,
// fp32 accumulation. ws: ws_floats floats, any alignment of a float; rounded up to 64 bytes, it must hold
// at least one scratch of matmul_small_scratch_floats(M) (the threads used are capped by how many fit).
void matmul_small(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y, float* ws, int64_t ws_floats);
int64_t matmul_small_scratch_floats(int64_t M);
// Its blocking (the same on every target): weight rows per block, columns per tile. One scratch holds a
// tile of the block's decoded rows and their partial sums by lanes, kSmallRows x (kSmallTile + M x lanes)
// floats: at most small_scratch_bound_floats(M) for vectors of up to 16 floats (AVX-512), plus 16 for
// rounding the workspace up to 64 bytes.
inline constexpr int kSmallRows = 4;
inline constexpr int64_t kSmallTile = 512;
inline constexpr int64_t small_scratch_bound_floats(int64_t M) { return kSmallRows * (kSmallTile + 16 * M) + 16; }
void matvec_dense_f32(const float* W, const float* x, float* y, int64_t N, int64_t K);
void matvec_dense_bf16(const bf16_t* W, const float* x, float* y, int64_t N, int64_t K);
// Y [M x N] (+)= X [M x K] W^T for small M, W dense fp32 or bf16 [N x K]: four rows of W (two below AVX-512)
// against four rows of X at a time in registers, fp32 accumulation, OpenMP over blocks of rows.
void matmul_dense_f32(const float* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate);
void matmul_dense_bf16(const bf16_t* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate);

}  // namespace memtrade::quant::simd
