#include "harness/tensor.hpp"

#include <cmath>
#include <cstring>

namespace memtrade {

Shape::Shape(std::initializer_list<int64_t> d) {
  if (d.size() > kMaxRank) throw Error("tensor rank " + std::to_string(d.size()) + " exceeds the maximum of 4");
  for (int64_t x : d) {
    if (x < 1) throw Error("impossible tensor shape: dimension " + std::to_string(x) + " (dimensions must be >= 1)");
    dims[rank++] = x;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

Tensor::Tensor(Device& dev, DType dtype, Shape shape, Tag tag) {
  view_.dtype = dtype;
  view_.shape = shape;
  view_.backend = dev.backend();
  storage_ = Buffer(dev.memory(), view_.bytes(), tag);
  view_.data = storage_.data();
}

namespace {

template <class T>
void narrow(std::span<const double> src, void* dst) {
  T* out = static_cast<T*>(dst);
  for (std::size_t i = 0; i < src.size(); ++i) {
    if constexpr (std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>)
      out[i] = from_f32<T>(static_cast<float>(src[i]));
    else
      out[i] = static_cast<T>(src[i]);
  }
}

template <class T>
void widen(const void* src, std::vector<double>& dst) {
  const T* in = static_cast<const T*>(src);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    if constexpr (std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>)
      dst[i] = to_f32(in[i]);
    else
      dst[i] = static_cast<double>(in[i]);
  }
}

template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f64: return f(double{});
    case DType::f32: return f(float{});
    case DType::f16: return f(f16_t{});
    case DType::bf16: return f(bf16_t{});
    case DType::i32: return f(int32_t{});
    case DType::i8: return f(int8_t{});
    case DType::u8: return f(uint8_t{});
  }
  throw Error("unhandled dtype");
}

}  // namespace

void upload(Device& dev, const TensorView& dst, std::span<const double> values) {
  if (values.size() != static_cast<std::size_t>(dst.numel()))
    throw Error("upload: " + std::to_string(values.size()) + " values for a tensor of shape " + dst.shape.str());
  std::vector<unsigned char> staging(dst.bytes());
  dispatch(dst.dtype, [&](auto tag) { narrow<decltype(tag)>(values, staging.data()); });
  dev.copy(dst.data, staging.data(), staging.size(), CopyKind::host_to_device);
}

std::vector<double> download(Device& dev, const TensorView& src) {
  std::vector<unsigned char> staging(src.bytes());
  dev.copy(staging.data(), src.data, staging.size(), CopyKind::device_to_host);
  std::vector<double> out(static_cast<std::size_t>(src.numel()));
  dispatch(src.dtype, [&](auto tag) { widen<decltype(tag)>(staging.data(), out); });
  return out;
}

Tensor make_tensor(Device& dev, DType dtype, Shape shape, Tag tag, std::span<const double> values) {
  Tensor t(dev, dtype, shape, tag);
  upload(dev, t.view(), values);
  return t;
}

}  // namespace memtrade
