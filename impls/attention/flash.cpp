// FlashAttention-2 style attention on the CPU: query tiles of 64 rows stream over key tiles of 64 keys
// with the online softmax (tile_math.hpp); only O and, for training, the per-row log-sum-exp are kept.
// Backward recomputes P tile by tile in two passes without atomics: one owns key tiles (dK, dV), one
// owns query tiles (dQ). OpenMP over tiles; the kernels are portable SIMD dispatched at run time
// (simd/flash_simd.hpp). Every buffer is a tracked per-thread slot.
#include "impls/attention/attention.hpp"
#include "impls/attention/simd/flash_simd.hpp"

namespace memtrade::attention {

namespace {

// The benchmark workload: tracked workspace around the kernels.
class FlashCpu final : public AttnWorkload {
 public:
  using AttnWorkload::AttnWorkload;

  void run() override {
    const int64_t slots = cpu_flash_slots(s_);
    Buffer ws(dev_.memory(), slots * cpu_flash_slot_bytes(s_.d), Tag::workspace);
    Buffer lse, delta;
    if (s_.backward) {
      lse = Buffer(dev_.memory(), s_.rows() * sizeof(float), Tag::activations);
      delta = Buffer(dev_.memory(), s_.rows() * sizeof(float), Tag::workspace);
    }
    const FlashCpuBuffers b{q_.data(), k_.data(), v_.data(), o_.data(), dout_.data(), dq_.data(), dk_.data(), dv_.data()};
    flash_forward_cpu(s_, b, ws.as<float>(), slots, lse.as<float>());
    if (s_.backward) flash_backward_cpu(s_, b, ws.as<float>(), slots, lse.as<float>(), delta.as<float>());
  }
};

}  // namespace

void flash_forward_cpu(const Dims& s, const FlashCpuBuffers& b, float* ws, int64_t slots, float* lse) {
  simd::flash_forward(s, s.scale(), b, ws, slots, lse);
}

void flash_backward_cpu(const Dims& s, const FlashCpuBuffers& b, float* ws, int64_t slots, const float* lse,
                        float* delta, float* dq32, int64_t dq32_floats) {
  simd::flash_backward(s, s.scale(), b, ws, slots, lse, delta, simd::BackwardPasses::automatic, dq32, dq32_floats);
}

std::unique_ptr<Workload> make_flash_cpu(const AttnProblem& p, Device& dev) { return std::make_unique<FlashCpu>(p, dev); }

MEMTRADE_IMPLEMENTATION(typed_impl("attention", "flash", Role::optimized, Backend::cpu,
                                   "tiled online softmax, O(N) memory, OpenMP, runtime-dispatched SIMD", make_flash_cpu))

}  // namespace memtrade::attention
