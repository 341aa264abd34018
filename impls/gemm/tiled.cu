// GEMM with a plain shared-memory tiled CUDA kernel: one thread per output element, 16 x 16 tiles of A
// and B staged through shared memory, fp32 accumulation, conversions from common/dtype.hpp.
#include "harness/cuda_device.hpp"
#include "impls/gemm/gemm.hpp"

namespace memtrade::gemm {

namespace {

constexpr int kTile = 16;

template <class T>
__global__ void gemm_tiled(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m, int64_t n,
                           int64_t k) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile];
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  float acc = 0.f;
  for (int64_t t = 0; t < k; t += kTile) {
    const int64_t ac = t + threadIdx.x, br = t + threadIdx.y;
    as[threadIdx.y][threadIdx.x] = (row < m && ac < k) ? to_f32(a[row * k + ac]) : 0.f;
    bs[threadIdx.y][threadIdx.x] = (br < k && col < n) ? to_f32(b[br * n + col]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kTile; ++p) acc = fmaf(as[threadIdx.y][p], bs[p][threadIdx.x], acc);
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = from_f32<T>(acc);
}

class Tiled final : public GemmWorkload {
 public:
  Tiled(const GemmProblem& p, Device& dev) : GemmWorkload(p, dev), cuda_(as_cuda(dev)) {}
  void run() override {
    const auto [m, n, k] = p_.s;
    const dim3 block(kTile, kTile);
    const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>((m + kTile - 1) / kTile));
    auto launch = [&](auto tag) {
      using T = decltype(tag);
      gemm_tiled<T><<<grid, block, 0, cuda_.stream()>>>(a_.as<T>(), b_.as<T>(), c_.as<T>(), m, n, k);
    };
    if (p_.dtype == DType::f32) launch(float{});
    else if (p_.dtype == DType::bf16) launch(bf16_t{});
    else launch(f16_t{});
    MT_CUDA_LAUNCH();
  }

 private:
  CudaDevice& cuda_;
};

}  // namespace

MEMTRADE_IMPLEMENTATION(typed_impl<GemmProblem>("gemm", "tiled", Role::reference, Backend::cuda,
                                                "shared-memory tiled kernel, fp32 accumulation",
                                                [](const GemmProblem& p, Device& dev) -> std::unique_ptr<Workload> {
                                                  return std::make_unique<Tiled>(p, dev);
                                                }))

}  // namespace memtrade::gemm
