#include "harness/convert.hpp"

#include <cstring>

namespace memtrade {

namespace {
template <class F>
void by_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16_t{});
    case DType::f16: return f(f16_t{});
    default: throw Error("fp32 conversion: unsupported dtype " + std::string(dtype_name(t)));
  }
}
}  // namespace

void tensor_to_f32(const TensorView& src, float* dst) {
  const int64_t n = src.numel();
  by_dtype(src.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* s = src.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = memtrade::to_f32(s[i]);
  });
}

void tensor_from_f32(const float* src, const TensorView& dst) {
  const int64_t n = dst.numel();
  by_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* d = dst.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = memtrade::from_f32<T>(src[i]);
  });
}

}  // namespace memtrade
