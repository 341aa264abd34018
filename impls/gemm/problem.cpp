#include <cmath>

#include "common/blas.hpp"
#include "datasets/random.hpp"
#include "impls/gemm/gemm.hpp"

namespace memtrade::gemm {

Shape3 case_shape(const Case& c) {
  const int64_t n = c.integer("n");
  Shape3 s{c.integer("m", n), n, c.integer("k", n)};
  if (s.m < 1 || s.n < 1 || s.k < 1)
    throw Error("gemm case " + c.id + ": impossible shape m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                " k=" + std::to_string(s.k) + " (all must be >= 1)");
  if (s.m > (1 << 20) || s.n > (1 << 20) || s.k > (1 << 20))
    throw Error("gemm case " + c.id + ": dimensions above 2^20 are not supported");
  const DType t = parse_dtype(c.text("dtype"));
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16)
    throw Error("gemm case " + c.id + ": dtype must be fp32, bf16 or fp16");
  return s;
}

std::unique_ptr<GemmProblem> prepare(const Case& c) {
  auto p = std::make_unique<GemmProblem>();
  p->s = case_shape(c);
  p->dtype = parse_dtype(c.text("dtype"));
  const auto [m, n, k] = p->s;
  p->a.resize(m * k);
  p->b.resize(k * n);
  // Uniform in [-1, 1) scaled by 1/sqrt(k): outputs of order 1 at every size.
  const double scale = 1.0 / std::sqrt(static_cast<double>(k));
  datasets::fill_uniform(p->a, 101, -scale, scale);
  datasets::fill_uniform(p->b, 202, -1.0, 1.0);
  // Round to the case dtype so the oracle sees exactly the values every implementation sees.
  auto round_to = [&](std::vector<double>& v) {
    for (auto& x : v) {
      if (p->dtype == DType::f32) x = static_cast<float>(x);
      else if (p->dtype == DType::bf16) x = to_f32(to_bf16(static_cast<float>(x)));
      else x = to_f32(to_f16(static_cast<float>(x)));
    }
  };
  round_to(p->a);
  round_to(p->b);
  const int64_t nrows = m <= 512 ? m : 128;
  for (int64_t i = 0; i < nrows; ++i) p->rows.push_back(nrows == m ? i : i * (m - 1) / (nrows - 1));
  // The oracle: OpenBLAS's float64 GEMM on the covered rows, independent of the reference's loops.
  const auto rows = static_cast<int64_t>(p->rows.size());
  std::vector<double> a_rows(rows * k);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(&p->a[p->rows[r] * k], k, &a_rows[r * k]);
  p->oracle.resize(rows * n);
  blas::dgemm(false, false, rows, n, k, 1.0, a_rows.data(), k, p->b.data(), n, 0.0, p->oracle.data(), n);
  return p;
}

GemmWorkload::GemmWorkload(const GemmProblem& p, Device& dev)
    : p_(p), dev_(dev),
      a_(make_tensor(dev, p.dtype, {p.s.m, p.s.k}, Tag::io, p.a)),
      b_(make_tensor(dev, p.dtype, {p.s.k, p.s.n}, Tag::io, p.b)),
      c_(dev, p.dtype, {p.s.m, p.s.n}, Tag::io) {}

ErrorStats GemmWorkload::error() {
  const auto out = download(dev_, c_.view());
  std::vector<double> got(p_.rows.size() * p_.s.n);
  for (std::size_t r = 0; r < p_.rows.size(); ++r)
    std::copy_n(&out[p_.rows[r] * p_.s.n], p_.s.n, &got[r * p_.s.n]);
  return error_stats(got, p_.oracle);
}

Work GemmWorkload::work() const {
  const auto [m, n, k] = p_.s;
  Work w;
  w.flops = 2.0 * m * n * k;
  w.bytes = static_cast<double>((m * k + k * n + m * n) * dtype_size(p_.dtype));
  w.gemm_dtype = dtype_name(p_.dtype);
  return w;
}

}  // namespace memtrade::gemm
