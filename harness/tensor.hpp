// A small tensor: a view (pointer, dtype, shape, backend) and an owning Tensor
// whose storage is a tracked Buffer. Row-major, contiguous.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "harness/allocator.hpp"
#include "harness/device.hpp"
#include "common/dtype.hpp"

namespace memtrade {

inline constexpr int kMaxRank = 4;

struct Shape {
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;
  Shape() = default;
  Shape(std::initializer_list<int64_t> d);  // throws Error on rank > 4 or a dimension < 1
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const;
  std::string str() const;  // "[2, 3]"
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Backend backend = Backend::cpu;
  int64_t numel() const { return shape.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(Device& dev, DType dtype, Shape shape, Tag tag);
  const TensorView& view() const { return view_; }
  void* data() const { return view_.data; }
  template <class T>
  T* as() const { return view_.as<T>(); }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  int64_t numel() const { return view_.numel(); }
  std::size_t bytes() const { return view_.bytes(); }

 private:
  Buffer storage_;
  TensorView view_;
};

// Host values (float64) rounded to the tensor's dtype and copied to its device.
// The host staging buffer is temporary and outside any measured region.
void upload(Device& dev, const TensorView& dst, std::span<const double> values);
// The tensor's values, widened to float64 on the host.
std::vector<double> download(Device& dev, const TensorView& src);
// A tensor made and filled in one step.
Tensor make_tensor(Device& dev, DType dtype, Shape shape, Tag tag, std::span<const double> values);

}  // namespace memtrade
