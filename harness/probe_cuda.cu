#include <vector>

#include "harness/probe.hpp"
#include "harness/read_stream.cuh"
#include "harness/tracked_cublas.hpp"

namespace memtrade {

Ceilings probe_cuda() {
  Ceilings c;
  if (!cuda_status().available) return c;
  auto dev_owner = make_cuda_device();
  CudaDevice& dev = as_cuda(*dev_owner);
  {
    const int64_t n = 8192;
    Buffer a(dev.memory(), n * n * 4, Tag::workspace), b(dev.memory(), n * n * 4, Tag::workspace),
        out(dev.memory(), n * n * 4, Tag::workspace);
    // Random-looking, non-zero operands: zeros run faster than real data on some parts.
    std::vector<float> host(n * n);
    for (int64_t i = 0; i < n * n; ++i) host[i] = static_cast<float>((i * 2654435761u % 1000) / 1000.0 - 0.5);
    TrackedCublas blas(dev);
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      std::vector<unsigned char> staged(n * n * dtype_size(t));
      for (int64_t i = 0; i < n * n; ++i) {
        if (t == DType::f32) reinterpret_cast<float*>(staged.data())[i] = host[i];
        else if (t == DType::bf16) reinterpret_cast<bf16_t*>(staged.data())[i] = to_bf16(host[i]);
        else reinterpret_cast<f16_t*>(staged.data())[i] = to_f16(host[i]);
      }
      dev.copy(a.data(), staged.data(), staged.size(), CopyKind::host_to_device);
      dev.copy(b.data(), staged.data(), staged.size(), CopyKind::host_to_device);
      auto gemm = [&] { blas.gemm(t, false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, out.data(), n); };
      dev.time_call(gemm);
      double best = 1e30;
      for (int i = 0; i < 5; ++i) best = std::min(best, dev.time_call(gemm));
      c[std::string("cuda_") + std::string(dtype_name(t)) + "_gemm_flops"] = 2.0 * n * n * n / best;
    }
  }
  {
    const std::size_t bytes = 1u << 30;
    Buffer src(dev.memory(), bytes, Tag::workspace), dst(dev.memory(), bytes, Tag::workspace);
    MT_CUDA(cudaMemsetAsync(src.data(), 1, bytes, dev.stream()));
    auto copy = [&] { MT_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, dev.stream())); };
    dev.time_call(copy);
    double best = 1e30;
    for (int i = 0; i < 5; ++i) best = std::min(best, dev.time_call(copy));
    c["cuda_copy_bytes_per_s"] = 2.0 * bytes / best;
    // The same source read once by a sum (the read-stream ceiling of kernels that only read, as a decode
    // step over a KV cache does): 8 blocks of 256 threads per multiprocessor.
    const int sms = dev.props().multiProcessorCount;
    Buffer sum(dev.memory(), sizeof(unsigned long long), Tag::workspace);
    auto read = [&] {
      probe_kernels::read_stream_sum<<<static_cast<unsigned>(8 * sms), 256, 0, dev.stream()>>>(
          static_cast<const uint4*>(src.data()), bytes / sizeof(uint4), sum.as<unsigned long long>());
      MT_CUDA_LAUNCH();
    };
    dev.time_call(read);
    best = 1e30;
    for (int i = 0; i < 5; ++i) best = std::min(best, dev.time_call(read));
    c["cuda_read_bytes_per_s"] = static_cast<double>(bytes) / best;
  }
  return c;
}

}  // namespace memtrade
