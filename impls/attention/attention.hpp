// Attention: O = softmax(Q K^T * scale [+ causal mask]) V, forward and backward.
//   naive  (cpu, cuda)  materializes P = softmax(S) as a [B, H, N, Nk] fp32 tensor (and dS in backward);
//                       GEMMs through OpenBLAS / cuBLAS
//   flash  (cpu, cuda)  FlashAttention-2 style tiles with the online softmax; saves only O and the
//                       per-row log-sum-exp; backward recomputes P tile by tile. No N x Nk buffer.
//   auto   (cpu)        picks naive or flash per call from the crossover measured on this machine.
// Layout [B, H, N, D] row-major; K and V have H_kv heads (grouped-query attention: H_kv divides H, query
// head h reads kv head h / (H / H_kv)). Inputs fp32, bf16 or fp16; fp32 accumulation; outputs and
// gradients in the input dtype. Causal masking is aligned to the bottom right (query i sees keys
// j <= i + Nk - N); a query row that sees no key has O = 0 and zero gradients.
// Case parameters: b, h, h_kv (default h), n, n_kv (default n), d, causal, dtype, pass ("fwd" | "fwd_bwd").
#pragma once

#include <memory>
#include <vector>

#include "harness/registry.hpp"
#include "harness/tensor.hpp"
#include "impls/attention/dims.hpp"

namespace memtrade::attention {

// Reads and validates a case: every size >= 1, h_kv divides h, d <= 256, dtype fp32/bf16/fp16.
Dims case_dims(const Case& c);

// FLOPs of the standard count: forward 4 B H N Nk D (halved when causal), backward 2.5x forward.
double flops(const Dims& s);

// Host inputs (rounded to the dtype, held as float64) and the float64 oracle.
struct AttnProblem final : Problem {
  Dims s;
  std::vector<double> q, k, v, dout;  // dout: the upstream gradient, for the backward pass
  bool full_oracle = true;            // false: only sampled query rows of O and dQ are checked
  std::vector<int64_t> rows;          // query rows (within one head) the oracle covers
  std::vector<double> o, dq, dk, dv;  // o, dq: [B, H, rows.size(), D]; dk, dv: full, when full_oracle
};
std::unique_ptr<AttnProblem> prepare(const Case& c);
// Throws Error naming the tensor and index of the first NaN or Inf input (after rounding to the dtype).
void check_inputs(const AttnProblem& p);

// Float64 attention for one (batch, head): the oracle, also used by the tests. Writes o and lse for
// the listed query rows; if dq/dk/dv are given (full rows only), the backward pass with upstream dout.
void reference_head_f64(const Dims& s, const double* q, const double* k, const double* v, const double* dout,
                        const std::vector<int64_t>& rows, double* o, double* dq, double* dk, double* dv);

// Device tensors every implementation uses, and the error against the oracle.
class AttnWorkload : public Workload {
 public:
  AttnWorkload(const AttnProblem& p, Device& dev);
  ErrorStats error() override;  // the worst of O, dQ, dK, dV by relative L2; per-tensor counters too
  Work work() const override;
  void add_counters(std::map<std::string, double>& counters) override;
  // The last run's outputs as exact float64 copies: O, then dQ, dK, dV with the backward pass.
  std::vector<std::vector<double>> outputs();

 protected:
  const AttnProblem& p_;
  const Dims s_;
  Device& dev_;
  Tensor q_, k_, v_, o_, dout_, dq_, dk_, dv_;

 private:
  std::map<std::string, double> per_tensor_;
};

// Exact tracked bytes (the tests check these against the allocator to the byte).
struct MemoryModel {
  std::size_t live_before;  // inputs, outputs, gradients (+ the cuBLAS workspace for CUDA naive)
  std::size_t extra;        // what the call itself allocates at its peak
};
MemoryModel naive_memory(const Dims& s, Backend b);
MemoryModel flash_memory(const Dims& s, Backend b);

int64_t cpu_flash_slots(const Dims& s);
// The CPU flash kernels over caller-owned buffers (see dims.hpp), for callers that own their tensors (the
// model's training step). ws: cpu_flash_slots(s) slots of cpu_flash_slot_bytes(s.d) bytes. dq32: for
// 16-bit dtypes, optional fp32 scratch of dq32_floats floats; with one KV head's query rows per thread it
// lets the backward run in one pass (simd/flash_simd.hpp's BackwardPasses).
void flash_forward_cpu(const Dims& s, const FlashCpuBuffers& b, float* ws, int64_t slots, float* lse);
void flash_backward_cpu(const Dims& s, const FlashCpuBuffers& b, float* ws, int64_t slots, const float* lse,
                        float* delta, float* dq32 = nullptr, int64_t dq32_floats = 0);

std::unique_ptr<Workload> make_naive_cpu(const AttnProblem& p, Device& dev);
std::unique_ptr<Workload> make_flash_cpu(const AttnProblem& p, Device& dev);

void register_technique(Registry& r);

}  // namespace memtrade::attention
