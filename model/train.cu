// The CUDA training step (train.hpp), mirroring the CPU trainer (train.cpp) buffer for buffer and step
// for step: one template over the storage type S of weights, activations and gradients (float for fp32,
// bf16_t for bf16-mixed / bf16-pure, f16_t for fp16-mixed[-noscale]) and the moment type M (float, or
// bf16_t for bf16-pure). Compute is fp32 everywhere; the float64 reference is CPU only.
//
// Every kernel is a thin wrapper around the host/device math of layers.hpp, precision.hpp and
// tile_math.hpp, so the CPU tests of those functions cover the GPU's element math:
//   embedding forward           a copy per element; backward one block per vocabulary row scanning the
//                               ids in order, rounding to S after every add exactly as the CPU loop does
//                               (deterministic, no atomics, bit-identical to the CPU given the same dres).
//   RMSNorm                     one block per row: the sums (sum x^2, sum w dy x) are block reductions
//                               (a different summation order than the CPU's serial loop), everything else
//                               is rmsnorm_forward_row / rmsnorm_backward_row's formula; dw is reduced
//                               deterministically: per-row rmsnorm_dw_term into an fp32 [rows x dim]
//                               workspace, then a column sum in row order.
//   RoPE                        rope_rotate_pair with the cos/sin table computed on the host with
//                               rope_cos_sin, exactly as the CPU trainer computes it, uploaded once.
//   SwiGLU                      swiglu_forward_elem / swiglu_backward_elem per element.
//   cross-entropy               one block per row over the row widened to fp32 in shared memory: row_max
//                               and row_exp_sum per thread chunk, combined across the block; the loss per
//                               row goes to an fp32 buffer and is summed on the host in double in row
//                               order (as the CPU does); the backward writes cross_entropy_row_backward's
//                               element formula in place over the logits.
//   attention                   causal GQA in the [B, H, T, hd] layout, the plain way (as the naive
//                               attention implementation): S = scale Q K^T into P (fp32 [B*H, T, T], tag
//                               activations, kept for the backward), a row softmax with the causal mask,
//                               O = P V; backward dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)),
//                               dQ = scale dS K, dK = scale dS^T Q (dK, dV summed over the query heads of
//                               a kv group). This materializes the T x T scores, fine for the suite's
//                               training shapes (T <= 128); the flash kernels are the way to long contexts.
//   finiteness check            one flag, set by any gradient whose unscaled value is not finite
//                               (double(g) * inv_scale, as the CPU checks it).
//   AdamW                       adamw_step per element under the policy: fp32 master copy, or bf16 moments
//                               with round_bf16_stochastic and bits mix64(seed ^ mix64(t * P + i)).
// GEMMs run through one cuBLAS handle with fp32 compute (CUBLAS_COMPUTE_32F, no TF32) on operands in S:
// an output in S is rounded once from the fp32 result (alpha A B + beta C with beta = 1 for the residual
// additions, the CPU's "acc"); weight gradients are produced in fp32 (cublasGemmEx with S inputs and an
// fp32 output), then a kernel counts the nonzero values and those that would underflow in fp16 and adds
// them to the S gradient, as the CPU's gemm_grad.
//
// Memory (tracked, device pool), identical to the CPU trainer in tags and sizes for weights, grads,
// master, optimizer and io. Activations are the CPU's list with one difference: the CPU keeps the
// attention log-sum-exp ([B*H*T] fp32 per layer) for its flash backward, the GPU keeps the probabilities P
// ([B*H*T*T] fp32 per layer), freed at the same point of the backward. Workspace differs: cuBLAS's
// workspace (Cublas::kDefaultWorkspace, 32 MiB), one fp32 output for weight gradients (dim x max(vocab,
// ffn, dim) elements, instead of the CPU's staging buffers and per-thread row scratch), the RoPE table
// (same size as on the CPU), 32 bytes of counters, and transient buffers: fp32 staging copies of q, k, v,
// o, dO and of dq, dk, dv for the 16-bit policies, dS ([B*H*T*T] fp32) in the attention backward, the
// [rows x dim] fp32 dw partials of each RMSNorm backward and the per-row losses ([rows] fp32).
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#include "datasets/random.hpp"
#include "harness/cuda_device.hpp"
#include "impls/attention/row_kernels.cuh"
#include "impls/attention/tile_math.hpp"
#include "common/kernels.cuh"
#include "harness/tracked_cublas.hpp"
#include "model/layers.hpp"
#include "model/train.hpp"
#include "model/train_core.hpp"

namespace memtrade::model {

namespace {

using precision::Policy;

constexpr int kThreads = 256;  // threads per block of every kernel (a multiple of 32)
constexpr int64_t kMaxBlocks = 1 << 16;
// The cross-entropy row in dynamic shared memory, next to the kernels' 128 static bytes, within the 48 KiB
// a block gets without opting in.
constexpr std::size_t kMaxCeShared = (48u << 10) - 32 * sizeof(float);

unsigned elem_blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

int to_int(int64_t v, const char* what) {
  MT_CHECK(v >= 0 && v <= INT_MAX, std::string("trainer (cuda): ") + what + " exceeds INT_MAX");
  return static_cast<int>(v);
}

template <class S>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<S, float>) return DType::f32;
  else if constexpr (std::is_same_v<S, bf16_t>) return DType::bf16;
  else return DType::f16;
}

template <class S>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<S, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<S, bf16_t>) return CUDA_R_16BF;
  else return CUDA_R_16F;
}

__device__ __forceinline__ unsigned warp_sum(unsigned v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// ---- elementwise and row kernels ----

// out[r] = table[ids[r]] (embedding_forward, one element per thread).
template <class S>
__global__ void embedding_forward_kernel(const int32_t* __restrict__ ids, int64_t n, const S* __restrict__ table,
                                         int64_t width, S* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * width; i += stride) {
    const int64_t r = i / width, j = i % width;
    out[i] = table[static_cast<int64_t>(ids[r]) * width + j];
  }
}

// embedding_backward: dtable[ids[r]] += d[r], one block per vocabulary row, the rows r scanned in order and
// each add rounded to S, exactly the CPU trainer's serial loop (deterministic for every S).
template <class S>
__global__ void embedding_backward_kernel(const int32_t* __restrict__ ids, int64_t n, const S* __restrict__ d,
                                          int64_t width, S* __restrict__ table) {
  const int32_t v = static_cast<int32_t>(blockIdx.x);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    S acc = table[static_cast<int64_t>(v) * width + j];
    for (int64_t r = 0; r < n; ++r)
      if (ids[r] == v) acc = from_f32<S>(to_f32(acc) + to_f32(d[r * width + j]));
    table[static_cast<int64_t>(v) * width + j] = acc;
  }
}

// One block per row: y = x r w with r = 1 / sqrt(mean(x^2) + eps) (rmsnorm_forward_row's formula, the
// sum of squares as a block reduction); r saved per row.
template <class S>
__global__ void rmsnorm_forward_kernel(const S* __restrict__ x, const S* __restrict__ w, S* __restrict__ y,
                                       float* __restrict__ inv_rms, int64_t n, float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const S* xr = x + row * n;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float a = to_f32(xr[j]);
    ss += a * a;
  }
  ss = block_reduce<false>(ss, red);
  const float r = 1.f / m_sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[row * n + j] = from_f32<S>(to_f32(xr[j]) * r * to_f32(w[j]));
  if (threadIdx.x == 0) inv_rms[row] = r;
}

// One block per row: dres += dx with dx = r (w dy - x r^2 mean(w dy x)) (rmsnorm_backward_row's formula,
// the dot product as a block reduction); the row's dw terms (rmsnorm_dw_term) go to part[row].
template <class S>
__global__ void rmsnorm_backward_kernel(const S* __restrict__ x, const S* __restrict__ w,
                                        const float* __restrict__ inv_rms, const S* __restrict__ dy,
                                        S* __restrict__ dres, float* __restrict__ part, int64_t n) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const S *xr = x + row * n, *gr = dy + row * n;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += to_f32(w[j]) * to_f32(gr[j]) * to_f32(xr[j]);
  dot = block_reduce<false>(dot, red);
  const float r = inv_rms[row];
  const float c = r * r * dot / static_cast<float>(n);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float g = to_f32(gr[j]), xj = to_f32(xr[j]);
    const float dx = r * (to_f32(w[j]) * g - xj * c);
    dres[row * n + j] = from_f32<S>(to_f32(dres[row * n + j]) + dx);
    part[row * n + j] = rmsnorm_dw_term(g, xj, r);
  }
}

// dw[j] += sum over rows of part[row][j], summed in row order (deterministic).
template <class S>
__global__ void column_sum_accumulate(const float* __restrict__ part, int64_t rows, int64_t n, S* __restrict__ dw) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    float sum = 0.f;
    for (int64_t r = 0; r < rows; ++r) sum += part[r * n + j];
    dw[j] = from_f32<S>(to_f32(dw[j]) + sum);
  }
}

// The CPU trainer's permute: [B, T, heads, hd] rows <-> [B, heads, T, hd], rotated by RoPE (forward: +angle
// into the head layout; backward: -angle out of it), or a plain transpose. One thread per pair (rotate) or
// per element (transpose). tab: cos/sin per (position, pair).
template <class S>
__global__ void permute_kernel(const S* __restrict__ src, S* __restrict__ dst, const float* __restrict__ tab,
                               int64_t rows, int64_t T, int64_t heads, int64_t hd, bool rotate, bool forward) {
  const int64_t half = hd / 2, per = rotate ? half : hd;
  const int64_t total = rows * heads * per;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t i = idx % per, h = (idx / per) % heads, bt = idx / (per * heads);
    const int64_t b = bt / T, t = bt % T;
    const int64_t flat = (bt * heads + h) * hd, head = ((b * heads + h) * T + t) * hd;
    const S* in = src + (forward ? flat : head);
    S* out = dst + (forward ? head : flat);
    if (!rotate) {
      out[i] = in[i];
      continue;
    }
    const float cs = tab[(t * half + i) * 2], sn = tab[(t * half + i) * 2 + 1] * (forward ? 1.f : -1.f);
    float y1, y2;
    rope_rotate_pair(to_f32(in[i]), to_f32(in[i + half]), cs, sn, y1, y2);
    out[i] = from_f32<S>(y1);
    out[i + half] = from_f32<S>(y2);
  }
}

template <class S>
__global__ void scale_kernel(S* __restrict__ p, int64_t n, float f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = from_f32<S>(to_f32(p[i]) * f);
}

template <class S>
__global__ void swiglu_forward_kernel(const S* __restrict__ g, const S* __restrict__ u, S* __restrict__ h, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    h[i] = from_f32<S>(swiglu_forward_elem(to_f32(g[i]), to_f32(u[i])));
}

// g and u are overwritten with their gradients.
template <class S>
__global__ void swiglu_backward_kernel(S* __restrict__ g, S* __restrict__ u, const S* __restrict__ dh, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float dg, du;
    swiglu_backward_elem(to_f32(g[i]), to_f32(u[i]), to_f32(dh[i]), dg, du);
    g[i] = from_f32<S>(dg);
    u[i] = from_f32<S>(du);
  }
}

// Widens logits row `row` of z into the fp32 shared row zs, then the row's max and sum_j exp(z_j - max)
// with row_max / row_exp_sum over each thread's contiguous chunk of zs, combined across the block.
template <class S>
__device__ void load_row_max_and_exp_sum(const S* z, int64_t row, int64_t vocab, float* zs, float* red, float& m,
                                         float& s) {
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) zs[j] = to_f32(z[row * vocab + j]);
  __syncthreads();
  const int64_t per = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t lo = threadIdx.x * per, hi = lo + per < vocab ? lo + per : vocab;
  m = block_reduce<true>(lo < hi ? row_max(zs + lo, hi - lo) : -INFINITY, red);
  s = block_reduce<false>(lo < hi ? row_exp_sum(zs + lo, hi - lo, m) : 0.f, red);
}

// One block per row (dynamic shared memory: vocab floats): the row's loss (cross_entropy_row_forward's
// formula) into loss[row].
template <class S>
__global__ void cross_entropy_forward_kernel(const S* __restrict__ z, const int32_t* __restrict__ targets,
                                             int64_t vocab, float* __restrict__ loss) {
  extern __shared__ float zs[];
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  float m, s;
  load_row_max_and_exp_sum(z, row, vocab, zs, red, m, s);
  if (threadIdx.x == 0) loss[row] = targets[row] == kIgnoreTarget ? 0.f : m_log(s) - (zs[targets[row]] - m);
}

// One block per row, in place: dz = (softmax(z) - onehot(target)) * scale (cross_entropy_row_backward).
template <class S>
__global__ void cross_entropy_backward_kernel(S* __restrict__ z, const int32_t* __restrict__ targets, int64_t vocab,
                                              float scale) {
  extern __shared__ float zs[];
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  float m, s;
  load_row_max_and_exp_sum(z, row, vocab, zs, red, m, s);
  const float inv_sum = 1.f / s;
  const int32_t target = targets[row];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = m_exp(zs[j] - m) * inv_sum;
    z[row * vocab + j] = from_f32<S>(target == kIgnoreTarget ? 0.f : (p - (j == target ? 1.f : 0.f)) * scale);
  }
}

// grad += r (the fp32 weight gradient of one GEMM), counting r's nonzero values and those of them that
// round to +-0 in fp16 (counters[0], counters[1]); the CPU's gemm_grad.
template <class S>
__global__ void accumulate_weight_grad(const float* __restrict__ r, S* __restrict__ grad, int64_t n,
                                       unsigned long long* __restrict__ counters) {
  unsigned nonzero = 0, under = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = r[i];
    if (v != 0.f) {
      ++nonzero;
      if (f16_rounds_to_zero(v)) ++under;
    }
    grad[i] = from_f32<S>(to_f32(grad[i]) + v);
  }
  nonzero = warp_sum(nonzero);
  under = warp_sum(under);
  if (threadIdx.x % 32 == 0 && nonzero > 0) {
    atomicAdd(&counters[0], static_cast<unsigned long long>(nonzero));
    atomicAdd(&counters[1], static_cast<unsigned long long>(under));
  }
}

// *flag = 1 if any double(g) * inv is Inf or NaN (the CPU trainer's test, in double; a bit test).
template <class S>
__global__ void non_finite_kernel(const S* __restrict__ g, int64_t n, float inv, int* __restrict__ flag) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double x = static_cast<double>(to_f32(g[i])) * static_cast<double>(inv);
    const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(x));
    bad |= (bits & 0x7FF0000000000000ull) == 0x7FF0000000000000ull;
  }
  if (bad) *flag = 1;
}

// AdamW over elements [begin, end) of one parameter tensor under the policy: the parameter is the fp32
// master (kMaster) or the working weight itself; without a master, bf16 weights are rounded stochastically
// with bits mix64(seed ^ mix64(t * P + i)) (bf16-pure), other types to nearest.
template <class S, class M, bool kMaster>
__global__ void adamw_kernel(S* __restrict__ w, const S* __restrict__ g, M* __restrict__ m, M* __restrict__ v,
                             float* __restrict__ master, int64_t begin, int64_t end, float inv, float lr, float beta1,
                             float beta2, float eps, float wd, float bc1, float bc2, uint64_t seed, int64_t t,
                             int64_t P) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
    const float grad = precision::unscale(to_f32(g[i]), inv);
    float mi = to_f32(m[i]), vi = to_f32(v[i]);
    float p = kMaster ? master[i] : to_f32(w[i]);
    adamw_step(p, grad, mi, vi, lr, beta1, beta2, eps, wd, bc1, bc2);
    m[i] = from_f32<M>(mi);
    v[i] = from_f32<M>(vi);
    if constexpr (kMaster) {
      master[i] = p;
      w[i] = from_f32<S>(p);
    } else if constexpr (std::is_same_v<S, bf16_t>) {
      const auto bits = static_cast<uint32_t>(
          datasets::mix64(seed ^ datasets::mix64(static_cast<uint64_t>(t) * static_cast<uint64_t>(P) + static_cast<uint64_t>(i))));
      w[i] = precision::round_bf16_stochastic(p, bits);
    } else {
      w[i] = from_f32<S>(p);
    }
  }
}

// ---- the trainer: train_core.hpp's sequence over these operations ----

template <class S, class M>
class CudaTrainer final : public TrainerCore<CudaTrainer<S, M>, S, M, float> {
  using Base = TrainerCore<CudaTrainer<S, M>, S, M, float>;
  friend Base;
  using Base::c_, Base::o_, Base::dev_, Base::L_, Base::master_, Base::weights_, Base::grads_, Base::m_, Base::v_,
      Base::master_buf_, Base::rows, Base::ws;
  static constexpr bool kStaged = !std::is_same_v<S, float>;  // attention runs on fp32 copies

 public:
  CudaTrainer(const Config& c, const TrainOptions& o, Device& dev, std::span<const float> init)
      : Base(c, o, dev, init, precision::traits(o.policy).master_fp32,
             precision::LossScaler(o.init_scale, 2.0, 0.5, o.growth_interval, precision::traits(o.policy).loss_scaling)),
        cuda_(as_cuda(dev)) {
    MT_CHECK(static_cast<std::size_t>(c.vocab) * sizeof(float) <= kMaxCeShared,
             "trainer (cuda): vocab " + std::to_string(c.vocab) + " exceeds the cross-entropy kernel's shared row");
    this->zero_moments();
    auto& pool = dev.memory();
    const int64_t D = c.dim, F = c.ffn, V = c.vocab;
    gemm_out_ = Buffer(pool, D * std::max({V, F, D}) * sizeof(float), Tag::workspace);  // largest weight matrix
    // RoPE cos/sin per (position, pair), computed once on the host with layers.hpp's formula.
    const int64_t half = c.head_dim() / 2;
    rope_ = Buffer(pool, o.seq * half * 2 * sizeof(float), Tag::workspace);
    {
      std::vector<float> tab(o.seq * half * 2);
      for (int64_t t = 0; t < o.seq; ++t)
        for (int64_t i = 0; i < half; ++i)
          rope_cos_sin(t, i, c.head_dim(), c.rope_theta, tab[(t * half + i) * 2], tab[(t * half + i) * 2 + 1]);
      cuda_.copy(rope_.data(), tab.data(), tab.size() * sizeof(float), CopyKind::host_to_device);
    }
    counters_ = Buffer(pool, 4 * sizeof(unsigned long long), Tag::workspace);  // nonzero, underflow, flag
    blas_ = std::make_unique<TrackedCublas>(cuda_);
    cuda_.synchronize();
  }

 private:
  cudaStream_t stream() const { return cuda_.stream(); }
  unsigned long long* counters() const { return counters_.as<unsigned long long>(); }
  int* flag() const { return reinterpret_cast<int*>(counters_.as<unsigned long long>() + 2); }

  void zero(void* p, std::size_t bytes) { MT_CUDA(cudaMemsetAsync(p, 0, bytes, stream())); }
  void clear_counters() { zero(counters_.data(), 2 * sizeof(unsigned long long)); }
  void read_counters(StepStats& s) {
    unsigned long long counts[2];
    cuda_.copy(counts, counters_.data(), sizeof counts, CopyKind::device_to_host);
    s.grad_nonzero = static_cast<int64_t>(counts[0]);
    s.grad_underflow_fp16 = static_cast<int64_t>(counts[1]);
  }

  std::vector<float> widen(const S* p, int64_t n) {
    std::vector<S> h(n);
    cuda_.copy(h.data(), p, n * sizeof(S), CopyKind::device_to_host);
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = to_f32(h[i]);
    return v;
  }

  // ---- GEMMs (row-major, fp32 compute) ----

  // Row-major C = alpha op(A) op(B) + beta C with per-operand types: the column-major C^T = op(B)^T op(A)^T,
  // so the operands are swapped (as Cublas::gemm does).
  void gemm_ex(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* A, cudaDataType_t at,
               int64_t lda, const void* B, cudaDataType_t bt, int64_t ldb, float beta, void* Cm, cudaDataType_t ct,
               int64_t ldc) {
    cublas_check(cublasGemmEx(blas_->get(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              to_int(n, "gemm n"), to_int(m, "gemm m"), to_int(k, "gemm k"), &alpha, B, bt,
                              to_int(ldb, "ldb"), A, at, to_int(lda, "lda"), &beta, Cm, ct, to_int(ldc, "ldc"),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }

  // out[m x n] (=, or += when acc) op(A) op(B); A is [m x k] ([k x m] if ta), B is [k x n] ([n x k] if tb).
  // The fp32 result (plus out when acc) is rounded to S once, as the CPU's gemm.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* A, const S* B, S* out, bool acc) {
    blas_->gemm(dtype_of<S>(), ta, tb, m, n, k, 1.f, A, ta ? m : k, B, tb ? k : n, acc ? 1.f : 0.f, out, n);
  }

  // A weight gradient: grad[m x n] += A^T B (A = dY [k x m], B = X [k x n]) through an fp32 result,
  // counting fp16 underflow of the new contribution.
  void gemm_grad(int64_t m, int64_t n, int64_t k, const S* A, const S* B, S* grad, StepStats*) {
    gemm_ex(true, false, m, n, k, 1.f, A, cuda_type<S>(), m, B, cuda_type<S>(), n, 0.f, gemm_out_.data(), CUDA_R_32F, n);
    accumulate_weight_grad<S><<<elem_blocks(m * n), kThreads, 0, stream()>>>(gemm_out_.as<float>(), grad, m * n, counters());
    MT_CUDA_LAUNCH();
  }

  // Row-major fp32 C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, X_i = x + i * stride_x.
  void gemm_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                    int64_t ldc, int64_t stride_c, int64_t batch) {
    cublas_check(cublasGemmStridedBatchedEx(blas_->get(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            to_int(n, "gemm n"), to_int(m, "gemm m"), to_int(k, "gemm k"), &alpha, b,
                                            CUDA_R_32F, to_int(ldb, "ldb"), static_cast<long long>(stride_b), a,
                                            CUDA_R_32F, to_int(lda, "lda"), static_cast<long long>(stride_a), &beta, c,
                                            CUDA_R_32F, to_int(ldc, "ldc"), static_cast<long long>(stride_c),
                                            to_int(batch, "gemm batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
  }

  // ---- row operations ----

  void embedding_fwd(const int32_t* ids, const S* table, S* out) {
    const int64_t R = rows(), D = c_.dim;
    embedding_forward_kernel<S><<<elem_blocks(R * D), kThreads, 0, stream()>>>(ids, R, table, D, out);
    MT_CUDA_LAUNCH();
  }

  void embedding_bwd(const int32_t* ids, const S* dres, S* dtable) {
    embedding_backward_kernel<S><<<static_cast<unsigned>(c_.vocab), kThreads, 0, stream()>>>(ids, rows(), dres, c_.dim,
                                                                                             dtable);
    MT_CUDA_LAUNCH();
  }

  void rmsnorm_fwd(const S* x, const S* w, S* y, float* rms) {
    rmsnorm_forward_kernel<S><<<static_cast<unsigned>(rows()), kThreads, 0, stream()>>>(x, w, y, rms, c_.dim, c_.norm_eps);
    MT_CUDA_LAUNCH();
  }

  // dres += rmsnorm backward of dy (the residual stream's gradient); dw += the norm weight gradient.
  void rmsnorm_bwd(const S* x, const S* w, const float* rms, const S* dy, S* dres, S* dw) {
    const int64_t R = rows(), D = c_.dim;
    Buffer part = ws(R * D, sizeof(float));
    rmsnorm_backward_kernel<S><<<static_cast<unsigned>(R), kThreads, 0, stream()>>>(x, w, rms, dy, dres, part.as<float>(), D);
    MT_CUDA_LAUNCH();
    column_sum_accumulate<S><<<elem_blocks(D), kThreads, 0, stream()>>>(part.as<float>(), R, D, dw);
    MT_CUDA_LAUNCH();
  }

  void to_heads(const S* src, S* dst, int64_t heads, bool rotate) { permute(src, dst, heads, rotate, true); }
  void from_heads(const S* src, S* dst, int64_t heads, bool rotate) { permute(src, dst, heads, rotate, false); }
  void permute(const S* src, S* dst, int64_t heads, bool rotate, bool forward) {
    const int64_t hd = c_.head_dim(), per = rotate ? hd / 2 : hd;
    permute_kernel<S><<<elem_blocks(rows() * heads * per), kThreads, 0, stream()>>>(
        src, dst, rope_.as<float>(), rows(), o_.seq, heads, hd, rotate, forward);
    MT_CUDA_LAUNCH();
  }

  void scale(S* p, int64_t n, float f) {
    scale_kernel<S><<<elem_blocks(n), kThreads, 0, stream()>>>(p, n, f);
    MT_CUDA_LAUNCH();
  }

  void swiglu(const S* g, const S* u, S* h, int64_t n) {
    swiglu_forward_kernel<S><<<elem_blocks(n), kThreads, 0, stream()>>>(g, u, h, n);
    MT_CUDA_LAUNCH();
  }

  void swiglu_bwd(S* g, S* u, const S* dh, int64_t n) {
    swiglu_backward_kernel<S><<<elem_blocks(n), kThreads, 0, stream()>>>(g, u, dh, n);
    MT_CUDA_LAUNCH();
  }

  // Per-row losses in fp32, summed on the host in double in row order.
  double ce_loss_sum(const S* z, const int32_t* tg) {
    const int64_t R = rows(), V = c_.vocab;
    Buffer row_loss = ws(R, sizeof(float));
    cross_entropy_forward_kernel<S><<<static_cast<unsigned>(R), kThreads, V * sizeof(float), stream()>>>(
        z, tg, V, row_loss.as<float>());
    MT_CUDA_LAUNCH();
    std::vector<float> h(R);
    cuda_.copy(h.data(), row_loss.data(), R * sizeof(float), CopyKind::device_to_host);
    double sum = 0;
    for (int64_t r = 0; r < R; ++r) sum += static_cast<double>(h[r]);
    return sum;
  }

  void ce_bwd(S* z, const int32_t* tg, float scale) {
    const int64_t V = c_.vocab;
    cross_entropy_backward_kernel<S><<<static_cast<unsigned>(rows()), kThreads, V * sizeof(float), stream()>>>(
        z, tg, V, scale);
    MT_CUDA_LAUNCH();
  }

  // The probabilities P ([B*H*T*T] fp32) where the CPU's flash kernels keep the log-sum-exp.
  int64_t attention_saved_bytes() const {
    return o_.batch * c_.heads * o_.seq * o_.seq * static_cast<int64_t>(sizeof(float));
  }

  // ---- attention (fp32 on fp32 views: the tensors themselves for fp32, converted copies otherwise) ----

  float* f32_in(const S* src, int64_t n, Buffer& stage) {
    if constexpr (!kStaged) {
      return const_cast<float*>(src);
    } else {
      stage = ws(n, sizeof(float));
      convert_to_f32<S><<<elem_blocks(n), kThreads, 0, stream()>>>(src, stage.as<float>(), n);
      MT_CUDA_LAUNCH();
      return stage.as<float>();
    }
  }
  float* f32_out(S* dst, int64_t n, Buffer& stage) {
    if constexpr (!kStaged) {
      return dst;
    } else {
      stage = ws(n, sizeof(float));
      return stage.as<float>();
    }
  }
  void f32_store(const float* src, S* dst, int64_t n) {
    if constexpr (kStaged) {
      convert_from_f32<S><<<elem_blocks(n), kThreads, 0, stream()>>>(src, dst, n);
      MT_CUDA_LAUNCH();
    }
  }

  struct AttnShape {
    int64_t T, d, g, batch, qs_r, qs_b, ps_r, ps_b, ks_b, rows, qe, kve;
    float scale;
  };
  AttnShape attn_shape() const {
    AttnShape a{};
    a.T = o_.seq;
    a.d = c_.head_dim();
    a.g = c_.heads / c_.kv_heads;
    a.batch = o_.batch * c_.kv_heads;         // strided-batched over (batch, kv head) pairs
    a.qs_r = a.T * a.d;                       // query-side [T, d]: group member offset
    a.qs_b = a.g * a.T * a.d;                 //   and batch stride
    a.ps_r = a.T * a.T;                       // P / dS [T, T]: member offset
    a.ps_b = a.g * a.T * a.T;                 //   and batch stride
    a.ks_b = a.T * a.d;                       // K / V / dK / dV: batch stride
    a.rows = o_.batch * c_.heads * a.T;       // query rows
    a.qe = a.rows * a.d;
    a.kve = o_.batch * c_.kv_heads * a.T * a.d;
    a.scale = 1.0f / std::sqrt(static_cast<float>(a.d));  // attention::Dims::scale()
    return a;
  }

  // O = softmax(causal(scale Q K^T)) V; P kept in A.attn. Query head h = hk * g + r uses kv head hk.
  void attention_fwd(LayerActs& A) {
    const AttnShape s = attn_shape();
    Buffer q32, k32, v32, o32;
    const float* Q = f32_in(A.q.as<S>(), s.qe, q32);
    const float* K = f32_in(A.k.as<S>(), s.kve, k32);
    const float* V = f32_in(A.v.as<S>(), s.kve, v32);
    float* O = f32_out(A.o.as<S>(), s.qe, o32);
    float* P = A.attn.as<float>();
    for (int64_t r = 0; r < s.g; ++r)  // S = scale Q K^T -> P
      gemm_batched(false, true, s.T, s.T, s.d, s.scale, Q + r * s.qs_r, s.d, s.qs_b, K, s.d, s.ks_b, 0.f,
                   P + r * s.ps_r, s.T, s.ps_b, s.batch);
    attention::softmax_rows<<<static_cast<unsigned>(s.rows), kThreads, 0, stream()>>>(P, s.T, s.T, true);
    MT_CUDA_LAUNCH();
    for (int64_t r = 0; r < s.g; ++r)  // O = P V
      gemm_batched(false, false, s.T, s.d, s.T, 1.f, P + r * s.ps_r, s.T, s.ps_b, V, s.d, s.ks_b, 0.f, O + r * s.qs_r,
                   s.d, s.qs_b, s.batch);
    f32_store(O, A.o.as<S>(), s.qe);
  }

  // dq, dk, dv written (dk, dv summed over each kv head's query heads).
  void attention_bwd(LayerActs& A, const S* dout, S* dq, S* dk, S* dv, void* /*free*/, std::size_t /*free_bytes*/) {
    const AttnShape s = attn_shape();
    Buffer q32, k32, v32, o32, do32, dq32, dk32, dv32;
    const float* Q = f32_in(A.q.as<S>(), s.qe, q32);
    const float* K = f32_in(A.k.as<S>(), s.kve, k32);
    const float* V = f32_in(A.v.as<S>(), s.kve, v32);
    const float* O = f32_in(A.o.as<S>(), s.qe, o32);
    const float* dO = f32_in(dout, s.qe, do32);
    float* dQ = f32_out(dq, s.qe, dq32);
    float* dK = f32_out(dk, s.kve, dk32);
    float* dV = f32_out(dv, s.kve, dv32);
    const float* P = A.attn.as<float>();
    Buffer dsbuf = ws(s.rows * s.T, sizeof(float));
    float* dS = dsbuf.as<float>();
    for (int64_t r = 0; r < s.g; ++r) {
      const float beta = r == 0 ? 0.f : 1.f;
      // dV (+)= P^T dO  ([T, T]^T x [T, d])
      gemm_batched(true, false, s.T, s.d, s.T, 1.f, P + r * s.ps_r, s.T, s.ps_b, dO + r * s.qs_r, s.d, s.qs_b, beta,
                   dV, s.d, s.ks_b, s.batch);
      // dP = dO V^T -> dS
      gemm_batched(false, true, s.T, s.T, s.d, 1.f, dO + r * s.qs_r, s.d, s.qs_b, V, s.d, s.ks_b, 0.f, dS + r * s.ps_r,
                   s.T, s.ps_b, s.batch);
    }
    attention::score_grad_rows<<<static_cast<unsigned>(s.rows), kThreads, 0, stream()>>>(P, dS, O, dO, s.T, s.d);
    MT_CUDA_LAUNCH();
    for (int64_t r = 0; r < s.g; ++r) {
      const float beta = r == 0 ? 0.f : 1.f;
      // dQ = scale dS K
      gemm_batched(false, false, s.T, s.d, s.T, s.scale, dS + r * s.ps_r, s.T, s.ps_b, K, s.d, s.ks_b, 0.f,
                   dQ + r * s.qs_r, s.d, s.qs_b, s.batch);
      // dK (+)= scale dS^T Q
      gemm_batched(true, false, s.T, s.d, s.T, s.scale, dS + r * s.ps_r, s.T, s.ps_b, Q + r * s.qs_r, s.d, s.qs_b, beta,
                   dK, s.d, s.ks_b, s.batch);
    }
    f32_store(dQ, dq, s.qe);
    f32_store(dK, dk, s.kve);
    f32_store(dV, dv, s.kve);
  }

  // ---- AdamW under the policy ----

  bool any_non_finite(const S* g, float inv) {
    zero(flag(), sizeof(int));
    const int64_t n = this->trainable_total();
    non_finite_kernel<S><<<elem_blocks(n), kThreads, 0, stream()>>>(g, n, inv, flag());
    MT_CUDA_LAUNCH();
    int bad = 0;
    cuda_.copy(&bad, flag(), sizeof bad, CopyKind::device_to_host);
    return bad != 0;
  }

  void adamw(const ParamTensor& pt, float lr, float wd, float bc1, float bc2, float inv, int64_t t) {
    const int64_t P = this->trainable_total();
    float* mw = master_ ? master_buf_.template as<float>() : nullptr;
    const unsigned blocks = elem_blocks(pt.size);
    S* w = this->tw().template as<S>();
    const S* g = grads_.template as<S>();
    M *m = m_.template as<M>(), *v = v_.template as<M>();
    if (master_)
      adamw_kernel<S, M, true><<<blocks, kThreads, 0, stream()>>>(w, g, m, v, mw, pt.offset, pt.offset + pt.size, inv, lr,
                                                                  o_.beta1, o_.beta2, o_.eps, wd, bc1, bc2, o_.seed, t, P);
    else
      adamw_kernel<S, M, false><<<blocks, kThreads, 0, stream()>>>(w, g, m, v, mw, pt.offset, pt.offset + pt.size, inv, lr,
                                                                   o_.beta1, o_.beta2, o_.eps, wd, bc1, bc2, o_.seed, t, P);
    MT_CUDA_LAUNCH();
  }

  CudaDevice& cuda_;
  Buffer gemm_out_, rope_, counters_;
  std::unique_ptr<TrackedCublas> blas_;  // last: its workspace is allocated after the model state
};

}  // namespace

std::unique_ptr<Trainer> make_trainer_cuda(const Config& c, const TrainOptions& o, Device& dev,
                                           std::span<const float> init) {
  validate(c, o);
  MT_CHECK(!o.float64, "training (cuda): the float64 reference runs on the CPU only");
  if (o.base_format) throw Skip("training (cuda): a quantized base (QLoRA) is decoded on the host; CPU backend only so far");
  as_cuda(dev);  // throws for another backend
  switch (o.policy) {
    case Policy::fp32: return std::make_unique<CudaTrainer<float, float>>(c, o, dev, init);
    case Policy::bf16_mixed: return std::make_unique<CudaTrainer<bf16_t, float>>(c, o, dev, init);
    case Policy::fp16_mixed:
    case Policy::fp16_mixed_noscale: return std::make_unique<CudaTrainer<f16_t, float>>(c, o, dev, init);
    case Policy::bf16_pure: return std::make_unique<CudaTrainer<bf16_t, bf16_t>>(c, o, dev, init);
  }
  throw Error("training: unknown precision policy");
}

}  // namespace memtrade::model
