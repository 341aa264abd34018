// The CUDA decode attention: CudaDecode uploads a DecodePlan and launches decode_kernels.cuh's kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "harness/cuda_device.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "impls/kvcache/decode_kernels.cuh"

namespace memtrade::kvcache {

using namespace decode_kernels;

namespace {

// Bytes of v rounded up to 16, so that every array in the packed buffer starts 16-byte aligned.
template <class T>
std::size_t padded(const std::vector<T>& v) {
  return (v.size() * sizeof(T) + 15) / 16 * 16;
}

}  // namespace

struct CudaDecode::Impl {
  Device& dev;
  Buffer arrays, ws;
  Args args{};
  Shape shape;
  SplitKernel kernel = nullptr;
  explicit Impl(Device& d) : dev(d) {}
};

CudaDecode::CudaDecode(Device& dev, DecodePlan plan) : plan_(std::move(plan)) {
  const DecodePlan& p = plan_;
  MT_CHECK(dev.backend() == Backend::cuda, "CudaDecode: the cache is not on a CUDA device");
  MT_CHECK(p.head_dim > 0 && p.head_dim <= 256, "CudaDecode: head_dim must be 1..256");
  const int64_t splits = static_cast<int64_t>(p.split_req.size()), reqs = static_cast<int64_t>(p.length.size());
  MT_CHECK(splits > 0 && splits <= 65535 && reqs <= 65535 && p.heads <= 65535,
           "CudaDecode: " + std::to_string(splits) + " splits of " + std::to_string(reqs) +
               " requests (at most 65535 of each and of heads: use longer splits)");
  impl_ = std::make_unique<Impl>(dev);
  Impl& m = *impl_;
  // One tracked buffer holds every array of the plan, each at a 16-byte-aligned offset.
  std::size_t bytes = 0;
  for (std::size_t b : {padded(p.blocks), padded(p.first_block), padded(p.block_tokens), padded(p.split_req),
                        padded(p.split_from), padded(p.split_to), padded(p.split_slot), padded(p.first_slot),
                        padded(p.qk_scale), padded(p.v_scale), padded(p.smooth), padded(p.residual), padded(p.quantized)})
    bytes += b;
  m.arrays = Buffer(dev.memory(), bytes, Tag::workspace);
  if (p.first_slot.back() > 0)
    m.ws = Buffer(dev.memory(), static_cast<std::size_t>(p.first_slot.back() * p.heads * (p.head_dim + 2)) * sizeof(float),
                  Tag::workspace);
  std::size_t at = 0;
  auto upload = [&](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    T* d = reinterpret_cast<T*>(m.arrays.as<uint8_t>() + at);
    if (!v.empty()) dev.copy(d, v.data(), v.size() * sizeof(T), CopyKind::host_to_device);
    at += padded(v);
    return const_cast<const T*>(d);
  };
  m.shape = make_args(p, upload, m.ws.as<float>(), m.args);
  m.kernel = split_kernel(p, m.shape);
}

CudaDecode::~CudaDecode() = default;

namespace {

// The split kernel over splits [from, to) of the plan.
void launch_splits(SplitKernel kernel, const Shape& shape, Args a, int64_t from, int64_t to, cudaStream_t st) {
  if (to <= from) return;
  a.split_base = static_cast<int>(from);
  kernel<<<dim3(shape.grid_x, static_cast<unsigned>(to - from)), kThreads, 0, st>>>(a);
  MT_CUDA_LAUNCH();
}

void launch_merge(const DecodePlan& p, const Args& a, cudaStream_t st) {
  if (p.first_slot.back() == 0) return;
  merge_splits_kernel<<<dim3(static_cast<unsigned>(p.length.size()), static_cast<unsigned>(p.heads)), kThreads, 0, st>>>(a);
  MT_CUDA_LAUNCH();
}

}  // namespace

void CudaDecode::run(const float* q, float* out) {
  Impl& m = *impl_;
  Args a = m.args;
  a.q = q;
  a.out = out;
  const cudaStream_t st = as_cuda(m.dev).stream();
  launch_splits(m.kernel, m.shape, a, 0, m.shape.grid_y, st);
  launch_merge(plan_, a, st);
}

void CudaDecode::run_staged(const float* q, float* out, int64_t slots, int64_t chunks,
                            const std::function<void(int64_t, int64_t)>& copy) {
  Impl& m = *impl_;
  Args a = m.args;
  a.q = q;
  a.out = out;
  CudaDevice& dev = as_cuda(m.dev);
  const cudaStream_t st = dev.stream();
  dev.fork_copies();  // the copies overwrite the staging area once the work before this step is done
  for (const StagedStep& s : staged_schedule(plan_, slots, chunks)) {
    if (s.copy_to > s.copy_from) {
      copy(s.copy_from, s.copy_to);
      dev.join_copies();
    }
    launch_splits(m.kernel, m.shape, a, s.split_from, s.split_to, st);
  }
  launch_merge(plan_, a, st);
}

}  // namespace memtrade::kvcache
