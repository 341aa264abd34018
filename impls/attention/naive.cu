// Naive attention on the GPU: the reference that materializes everything.
//
//   forward   S = scale Q K^T (cuBLAS, fp32) written into P; a row kernel applies the causal mask and the
//             softmax in place; O = P V (cuBLAS).
//   backward  dV = P^T dO; dP = dO V^T (into dS); a row kernel computes delta_i = dO_i . O_i and
//             dS = P (dP - delta) in place; dQ = scale dS K; dK = scale dS^T Q. For grouped-query
//             attention dK and dV of a kv head sum over the query heads of its group (beta = 0 for the
//             first head of the group, 1 after).
//
// All GEMMs run in fp32 (CUBLAS_COMPUTE_32F) on fp32 buffers. For bf16 / fp16 inputs the tensors are
// staged through fp32 copies (tag workspace) converted by small elementwise kernels; fp32 inputs are used
// in place. Every temporary is allocated at the start of run() and freed at its end, in the order that
// attention.hpp's naive_memory counts: staging q, k, v, o [, dout, dq, dk, dv], then P (activations),
// then dS (workspace, backward only).
//
// The GEMMs are strided-batched over the b * h_kv (batch, kv head) pairs, one call per member r of the
// query-head group: query head h = hk * group + r, so with hq = (b * h_kv + hk) * group + r the query-side
// operands of member r start at r * n * d (P: r * n * n_kv) and step by group * n * d (P: group * n *
// n_kv), while K / V / dK / dV step by n_kv * d.
#include <climits>

#include "harness/cuda_device.hpp"
#include "impls/attention/attention.hpp"
#include "impls/attention/row_kernels.cuh"
#include "impls/attention/tile_math.hpp"
#include "common/kernels.cuh"
#include "harness/tracked_cublas.hpp"

namespace memtrade::attention {

namespace {

constexpr int kRowThreads = 256;   // threads per block of the row kernels (a multiple of 32)
constexpr int kElemThreads = 256;  // threads per block of the conversion kernels
constexpr int64_t kMaxElemBlocks = 1 << 16;

// ---- kernels ----

int to_int(int64_t v, const char* what) {
  MT_CHECK(v >= 0 && v <= INT_MAX, std::string("naive attention (cuda): ") + what + " exceeds INT_MAX");
  return static_cast<int>(v);
}

class NaiveCuda final : public AttnWorkload {
 public:
  NaiveCuda(const AttnProblem& p, Device& dev) : AttnWorkload(p, dev), cuda_(as_cuda(dev)), blas_(cuda_) {}

  void run() override {
    const Dims& s = s_;
    const bool staged = s.dtype != DType::f32;
    const bool bwd = s.backward;
    const int64_t qe = s.q_elems(), kve = s.kv_elems();
    const int64_t rows = s.rows();
    const std::size_t p_bytes = static_cast<std::size_t>(rows) * static_cast<std::size_t>(s.n_kv) * sizeof(float);
    MT_CHECK(rows <= INT_MAX, "naive attention (cuda): b * h * n exceeds the grid limit");

    // ---- every temporary, in naive_memory's order ----
    auto stage = [&](int64_t elems, bool needed) {
      return (staged && needed) ? Buffer(dev_.memory(), static_cast<std::size_t>(elems) * sizeof(float), Tag::workspace)
                                : Buffer();
    };
    Buffer q32 = stage(qe, true), k32 = stage(kve, true), v32 = stage(kve, true), o32 = stage(qe, true);
    Buffer do32 = stage(qe, bwd), dq32 = stage(qe, bwd), dk32 = stage(kve, bwd), dv32 = stage(kve, bwd);
    Buffer pbuf(dev_.memory(), p_bytes, Tag::activations);
    Buffer dsbuf = bwd ? Buffer(dev_.memory(), p_bytes, Tag::workspace) : Buffer();

    // fp32 views: the staging copies, or the tensors themselves for fp32.
    float* Q = staged ? q32.as<float>() : q_.as<float>();
    float* K = staged ? k32.as<float>() : k_.as<float>();
    float* V = staged ? v32.as<float>() : v_.as<float>();
    float* O = staged ? o32.as<float>() : o_.as<float>();
    float* dO = bwd ? (staged ? do32.as<float>() : dout_.as<float>()) : nullptr;
    float* dQ = bwd ? (staged ? dq32.as<float>() : dq_.as<float>()) : nullptr;
    float* dK = bwd ? (staged ? dk32.as<float>() : dk_.as<float>()) : nullptr;
    float* dV = bwd ? (staged ? dv32.as<float>() : dv_.as<float>()) : nullptr;
    float* P = pbuf.as<float>();
    float* dS = bwd ? dsbuf.as<float>() : nullptr;

    if (staged) {
      stage_in(q_, Q, qe);
      stage_in(k_, K, kve);
      stage_in(v_, V, kve);
      if (bwd) stage_in(dout_, dO, qe);
    }

    const int64_t n = s.n, nk = s.n_kv, d = s.d, g = s.group();
    const int64_t batch = s.b * s.h_kv;
    const float scale = s.scale();
    const int64_t qs_r = n * d, qs_b = g * n * d;       // query-side [n, d] operands: member offset, batch stride
    const int64_t ps_r = n * nk, ps_b = g * n * nk;     // P / dS: member offset, batch stride
    const int64_t ks_b = nk * d;                        // K / V / dK / dV: batch stride

    // ---- forward ----
    for (int64_t r = 0; r < g; ++r)  // S = scale Q K^T  -> P
      gemm_batched(false, true, n, nk, d, scale, Q + r * qs_r, d, qs_b, K, d, ks_b, 0.f, P + r * ps_r, nk, ps_b, batch);
    softmax_rows<<<static_cast<unsigned>(rows), kRowThreads, 0, cuda_.stream()>>>(P, n, nk, s.causal);
    MT_CUDA_LAUNCH();
    for (int64_t r = 0; r < g; ++r)  // O = P V
      gemm_batched(false, false, n, d, nk, 1.f, P + r * ps_r, nk, ps_b, V, d, ks_b, 0.f, O + r * qs_r, d, qs_b, batch);
    if (staged) stage_out(O, o_, qe);

    if (!bwd) return;

    // ---- backward ----
    for (int64_t r = 0; r < g; ++r) {
      const float beta = r == 0 ? 0.f : 1.f;
      // dV += P^T dO  ([nk, n] x [n, d])
      gemm_batched(true, false, nk, d, n, 1.f, P + r * ps_r, nk, ps_b, dO + r * qs_r, d, qs_b, beta, dV, d, ks_b, batch);
      // dP = dO V^T  -> dS  ([n, d] x [d, nk])
      gemm_batched(false, true, n, nk, d, 1.f, dO + r * qs_r, d, qs_b, V, d, ks_b, 0.f, dS + r * ps_r, nk, ps_b, batch);
    }
    score_grad_rows<<<static_cast<unsigned>(rows), kRowThreads, 0, cuda_.stream()>>>(P, dS, O, dO, nk, d);
    MT_CUDA_LAUNCH();
    for (int64_t r = 0; r < g; ++r) {
      const float beta = r == 0 ? 0.f : 1.f;
      // dQ = scale dS K  ([n, nk] x [nk, d])
      gemm_batched(false, false, n, d, nk, scale, dS + r * ps_r, nk, ps_b, K, d, ks_b, 0.f, dQ + r * qs_r, d, qs_b, batch);
      // dK += scale dS^T Q  ([nk, n] x [n, d])
      gemm_batched(true, false, nk, d, n, scale, dS + r * ps_r, nk, ps_b, Q + r * qs_r, d, qs_b, beta, dK, d, ks_b, batch);
    }
    if (staged) {
      stage_out(dQ, dq_, qe);
      stage_out(dK, dk_, kve);
      stage_out(dV, dv_, kve);
    }
  }

 private:
  // Row-major C_i = alpha op(A_i) op(B_i) + beta C_i (fp32, fp32 accumulation) for i < batch, with
  // X_i = x + i * stride_x. As in Cublas::gemm, row-major C = op(A) op(B) is the column-major
  // C^T = op(B)^T op(A)^T, so the operands are swapped.
  void gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                    int64_t ldc, int64_t stride_c, int64_t batch) {
    cublas_check(cublasGemmStridedBatchedEx(blas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n, "gemm n"), to_int(m, "gemm m"),
                                            to_int(k, "gemm k"), &alpha, b, CUDA_R_32F, to_int(ldb, "ldb"),
                                            static_cast<long long>(stride_b), a, CUDA_R_32F, to_int(lda, "lda"),
                                            static_cast<long long>(stride_a), &beta, c, CUDA_R_32F, to_int(ldc, "ldc"),
                                            static_cast<long long>(stride_c), to_int(batch, "gemm batch"),
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
  }

  static unsigned elem_blocks(int64_t count) {
    const int64_t blocks = (count + kElemThreads - 1) / kElemThreads;
    return static_cast<unsigned>(blocks < kMaxElemBlocks ? (blocks > 0 ? blocks : 1) : kMaxElemBlocks);
  }

  // Tensor (bf16 / fp16) -> fp32 staging copy.
  void stage_in(const Tensor& src, float* dst, int64_t count) {
    auto launch = [&](auto tag) {
      using T = decltype(tag);
      convert_to_f32<T><<<elem_blocks(count), kElemThreads, 0, cuda_.stream()>>>(src.as<T>(), dst, count);
    };
    if (src.dtype() == DType::bf16) launch(bf16_t{});
    else if (src.dtype() == DType::f16) launch(f16_t{});
    else launch(float{});
    MT_CUDA_LAUNCH();
  }

  // fp32 staging copy -> tensor (bf16 / fp16), rounded to nearest even.
  void stage_out(const float* src, Tensor& dst, int64_t count) {
    auto launch = [&](auto tag) {
      using T = decltype(tag);
      convert_from_f32<T><<<elem_blocks(count), kElemThreads, 0, cuda_.stream()>>>(src, dst.as<T>(), count);
    };
    if (dst.dtype() == DType::bf16) launch(bf16_t{});
    else if (dst.dtype() == DType::f16) launch(f16_t{});
    else launch(float{});
    MT_CUDA_LAUNCH();
  }

  CudaDevice& cuda_;
  TrackedCublas blas_;
};

}  // namespace

MEMTRADE_IMPLEMENTATION(typed_impl<AttnProblem>("attention", "naive", Role::reference, Backend::cuda,
                                                "materialized P, cuBLAS GEMMs + softmax kernel",
                                                [](const AttnProblem& p, Device& dev) -> std::unique_ptr<Workload> {
                                                  return std::make_unique<NaiveCuda>(p, dev);
                                                }))

}  // namespace memtrade::attention
