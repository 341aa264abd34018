// Attention reference on the CPU: the standard algorithm, materializing P = softmax(Q K^T * scale) for
// every (batch, head) as one [B, H, N, Nk] fp32 tensor, and dS of the same size in the backward pass.
// GEMMs through OpenBLAS; low-precision inputs are widened into fp32 copies first.
#include <omp.h>

#include <cmath>

#include "impls/attention/attention.hpp"
#include "impls/attention/tile_math.hpp"
#include "common/blas.hpp"
#include "harness/convert.hpp"

namespace memtrade::attention {

namespace {

// A tensor's data as fp32: the tensor itself when it is fp32, else a tracked fp32 copy.
class F32View {
 public:
  F32View(Device& dev, const Tensor& t, bool load) {
    if (t.dtype() == DType::f32) {
      ptr_ = t.as<float>();
      return;
    }
    copy_ = Buffer(dev.memory(), t.numel() * sizeof(float), Tag::workspace);
    ptr_ = copy_.as<float>();
    if (load) tensor_to_f32(t.view(), ptr_);
  }
  float* get() const { return ptr_; }
  void store(const Tensor& t) const {
    if (t.dtype() != DType::f32) tensor_from_f32(ptr_, t.view());
  }

 private:
  Buffer copy_;
  float* ptr_ = nullptr;
};

class NaiveCpu final : public AttnWorkload {
 public:
  using AttnWorkload::AttnWorkload;

  void run() override {
    const int64_t n = s_.n, nk = s_.n_kv, d = s_.d;
    const float scale = s_.scale();
    // Everything the call needs, allocated up front (naive_memory() is this list).
    F32View q(dev_, q_, true), k(dev_, k_, true), v(dev_, v_, true), o(dev_, o_, false);
    std::optional<F32View> dout, dq, dk, dv;
    if (s_.backward) {
      dout.emplace(dev_, dout_, true);
      dq.emplace(dev_, dq_, false);
      dk.emplace(dev_, dk_, false);
      dv.emplace(dev_, dv_, false);
    }
    Buffer p(dev_.memory(), static_cast<std::size_t>(s_.b * s_.h) * n * nk * sizeof(float), Tag::activations);
    Buffer ds;
    if (s_.backward) ds = Buffer(dev_.memory(), p.bytes(), Tag::workspace);

    auto head = [&](float* base, int64_t bh, int64_t rows) { return base + bh * rows * d; };
    for (int64_t b = 0; b < s_.b; ++b)
      for (int64_t h = 0; h < s_.h; ++h) {
        const int64_t bh = b * s_.h + h, bkv = b * s_.h_kv + h / s_.group();
        float* ph = p.as<float>() + bh * n * nk;
        blas::sgemm(false, true, n, nk, d, scale, head(q.get(), bh, n), d, head(k.get(), bkv, nk), d, 0.f, ph, nk);
        softmax_rows(ph);
        blas::sgemm(false, false, n, d, nk, 1.f, ph, nk, head(v.get(), bkv, nk), d, 0.f, head(o.get(), bh, n), d);
      }
    o.store(o_);
    if (!s_.backward) return;

    for (int64_t b = 0; b < s_.b; ++b)
      for (int64_t h = 0; h < s_.h; ++h) {
        const int64_t bh = b * s_.h + h, bkv = b * s_.h_kv + h / s_.group();
        const float beta = h % s_.group() == 0 ? 0.f : 1.f;  // dK, dV sum over the group's query heads
        const float* ph = p.as<float>() + bh * n * nk;
        float* dsh = ds.as<float>() + bh * n * nk;
        float* doh = head(dout->get(), bh, n);
        blas::sgemm(true, false, nk, d, n, 1.f, ph, nk, doh, d, beta, head(dv->get(), bkv, nk), d);
        blas::sgemm(false, true, n, nk, d, 1.f, doh, d, head(v.get(), bkv, nk), d, 0.f, dsh, nk);
        const float* oh = head(o.get(), bh, n);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          float delta = 0.f;
          for (int64_t c = 0; c < d; ++c) delta += doh[i * d + c] * oh[i * d + c];
          for (int64_t j = 0; j < nk; ++j) dsh[i * nk + j] = score_grad(ph[i * nk + j], dsh[i * nk + j], delta);
        }
        blas::sgemm(false, false, n, d, nk, scale, dsh, nk, head(k.get(), bkv, nk), d, 0.f, head(dq->get(), bh, n), d);
        blas::sgemm(true, false, nk, d, n, scale, dsh, nk, head(q.get(), bh, n), d, beta, head(dk->get(), bkv, nk), d);
      }
    dq->store(dq_);
    dk->store(dk_);
    dv->store(dv_);
  }

 private:
  // Row softmax in place with the causal mask; a fully masked row becomes zeros.
  void softmax_rows(float* ph) const {
    const int64_t n = s_.n, nk = s_.n_kv;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float* row = ph + i * nk;
      const int64_t visible = s_.causal ? std::clamp<int64_t>(i + (nk - n) + 1, 0, nk) : nk;
      float mx = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
      float sum = 0.f;
      for (int64_t j = 0; j < visible; ++j) sum += (row[j] = std::exp(row[j] - mx));
      const float inv = inverse_row_sum(sum);
      for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
      for (int64_t j = visible; j < nk; ++j) row[j] = 0.f;
    }
  }
};

}  // namespace

std::unique_ptr<Workload> make_naive_cpu(const AttnProblem& p, Device& dev) { return std::make_unique<NaiveCpu>(p, dev); }

MEMTRADE_IMPLEMENTATION(typed_impl("attention", "naive", Role::reference, Backend::cpu, "materialized P, OpenBLAS GEMMs",
                                   make_naive_cpu))

}  // namespace memtrade::attention
