// Machine ceilings: the rates a run's throughput is compared with, measured by the harness itself.
//   cpu_fp32_gemm_flops    OpenBLAS sgemm, n = 2048, best of 5
//   cpu_copy_bytes_per_s   a copy of 256 MiB over the OpenMP threads, bytes read + written: the faster of
//                          cpu_memcpy_bytes_per_s (memcpy) and cpu_stream_copy_bytes_per_s (non-temporal
//                          stores), each the best of 5 cold calls
//   cpu_read_bytes_per_s   a sum of those 256 MiB as 64-bit words over the threads, best of 5 cold calls
//   cuda_{fp32,bf16,fp16}_gemm_flops, cuda_copy_bytes_per_s   cuBLAS at n = 8192 and a 1 GiB device copy
#pragma once

#include "harness/results.hpp"

namespace memtrade {

Ceilings probe_cpu();
Ceilings probe_cuda();  // empty when no CUDA device is usable

}  // namespace memtrade
