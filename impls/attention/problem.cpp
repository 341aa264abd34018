#include <algorithm>
#include <cmath>

#include "datasets/random.hpp"
#include "impls/attention/attention.hpp"
#include "impls/attention/tile_math.hpp"
#include "common/blas.hpp"

namespace memtrade::attention {

float Dims::scale() const { return 1.0f / std::sqrt(static_cast<float>(d)); }

Dims case_dims(const Case& c) {
  Dims s;
  s.b = c.integer("b", 1);
  s.h = c.integer("h");
  s.h_kv = c.integer("h_kv", s.h);
  s.n = c.integer("n");
  s.n_kv = c.integer("n_kv", s.n);
  s.d = c.integer("d");
  s.causal = c.flag("causal", false);
  s.dtype = parse_dtype(c.text("dtype", "fp32"));
  const std::string pass = c.text("pass", "fwd");
  const std::string where = "attention case " + c.id + ": ";
  if (pass != "fwd" && pass != "fwd_bwd") throw Error(where + "pass must be fwd or fwd_bwd, got '" + pass + "'");
  s.backward = pass == "fwd_bwd";
  for (auto [name, v] : {std::pair{"b", s.b}, {"h", s.h}, {"h_kv", s.h_kv}, {"n", s.n}, {"n_kv", s.n_kv}, {"d", s.d}})
    if (v < 1) throw Error(where + "impossible size " + name + " = " + std::to_string(v) + " (must be >= 1)");
  const int64_t d_kv = c.integer("d_kv", s.d);
  if (d_kv != s.d)
    throw Error(where + "head dim mismatch: queries have d = " + std::to_string(s.d) + ", keys/values d_kv = " +
                std::to_string(d_kv));
  if (s.h % s.h_kv != 0)
    throw Error(where + "kv heads (" + std::to_string(s.h_kv) + ") must divide query heads (" + std::to_string(s.h) + ")");
  if (s.d > 256) throw Error(where + "head dim " + std::to_string(s.d) + " above 256 is not supported");
  if (s.n > (1 << 20) || s.n_kv > (1 << 20)) throw Error(where + "sequence lengths above 2^20 are not supported");
  if (s.dtype != DType::f32 && s.dtype != DType::bf16 && s.dtype != DType::f16)
    throw Error(where + "dtype must be fp32, bf16 or fp16");
  return s;
}

double flops(const Dims& s) {
  double f = 4.0 * s.b * s.h * static_cast<double>(s.n) * s.n_kv * s.d;
  if (s.causal) f /= 2;
  return s.backward ? f * 3.5 : f;  // forward + backward (2.5x forward)
}

void reference_head_f64(const Dims& s, const double* q, const double* k, const double* v, const double* dout,
                        const std::vector<int64_t>& rows, double* o, double* dq, double* dk, double* dv) {
  const int64_t r = static_cast<int64_t>(rows.size()), nk = s.n_kv, d = s.d;
  // Written apart from the code under test (not Dims::scale nor tile_math's causal_allows), so that a
  // bug there is not copied into the oracle: the softmax scale, and the bottom-right-aligned causal
  // mask (query i sits at key position i + nk - n and sees keys up to it).
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto visible = [&](int64_t i, int64_t j) { return j <= i + (nk - s.n); };
  std::vector<double> qr(r * d), p(r * nk);
  for (int64_t i = 0; i < r; ++i) std::copy_n(q + rows[i] * d, d, &qr[i * d]);
  blas::dgemm(false, true, r, nk, d, scale, qr.data(), d, k, d, 0.0, p.data(), nk);
  for (int64_t i = 0; i < r; ++i) {
    double* row = &p[i * nk];
    double mx = -INFINITY;
    for (int64_t j = 0; j < nk; ++j) {
      if (s.causal && !visible(rows[i], j)) row[j] = -INFINITY;
      mx = std::max(mx, row[j]);
    }
    if (mx == -INFINITY) {  // fully masked row: defined as zero
      std::fill_n(row, nk, 0.0);
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < nk; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < nk; ++j) row[j] /= sum;
  }
  blas::dgemm(false, false, r, d, nk, 1.0, p.data(), nk, v, d, 0.0, o, d);
  if (!dq) return;
  // Backward: dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = scale dS K; dK, dV need every row.
  std::vector<double> dor(r * d), ds(r * nk);
  for (int64_t i = 0; i < r; ++i) std::copy_n(dout + rows[i] * d, d, &dor[i * d]);
  blas::dgemm(false, true, r, nk, d, 1.0, dor.data(), d, v, d, 0.0, ds.data(), nk);
  for (int64_t i = 0; i < r; ++i) {
    double delta = 0;
    for (int64_t c = 0; c < d; ++c) delta += dor[i * d + c] * o[i * d + c];
    for (int64_t j = 0; j < nk; ++j) ds[i * nk + j] = p[i * nk + j] * (ds[i * nk + j] - delta);
  }
  blas::dgemm(false, false, r, d, nk, scale, ds.data(), nk, k, d, 0.0, dq, d);
  if (dk) {
    blas::dgemm(true, false, nk, d, r, scale, ds.data(), nk, qr.data(), d, 1.0, dk, d);
    blas::dgemm(true, false, nk, d, r, 1.0, p.data(), nk, dor.data(), d, 1.0, dv, d);
  }
}

void check_inputs(const AttnProblem& p) {
  const std::pair<const char*, const std::vector<double>*> inputs[] = {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"dout", &p.dout}};
  for (const auto& [name, values] : inputs)
    for (std::size_t i = 0; i < values->size(); ++i)
      if (!std::isfinite((*values)[i]))
        throw Error(std::string("attention input ") + name + "[" + std::to_string(i) + "] is " +
                    (std::isnan((*values)[i]) ? "NaN" : "infinite") + " (in the case's dtype " +
                    std::string(dtype_name(p.s.dtype)) + "): inputs must be finite");
}

std::unique_ptr<AttnProblem> prepare(const Case& c) {
  auto p = std::make_unique<AttnProblem>();
  const Dims s = p->s = case_dims(c);
  // Scores have standard deviation logit_scale (q ~ N(0, logit_scale^2), k ~ N(0, 1), scale 1/sqrt(d)).
  const double logit_scale = c.params.contains("logit_scale") ? c.params["logit_scale"].get<double>() : 1.0;
  p->q.resize(s.q_elems());
  p->k.resize(s.kv_elems());
  p->v.resize(s.kv_elems());
  datasets::fill_normal(p->q, 11, 0.0, logit_scale);
  datasets::fill_normal(p->k, 12);
  datasets::fill_normal(p->v, 13);
  if (s.backward) {
    p->dout.resize(s.q_elems());
    datasets::fill_normal(p->dout, 14);
  }
  auto round_to = [&](std::vector<double>& v) {
    for (auto& x : v) {
      if (s.dtype == DType::f32) x = static_cast<float>(x);
      else if (s.dtype == DType::bf16) x = to_f32(to_bf16(static_cast<float>(x)));
      else x = to_f32(to_f16(static_cast<float>(x)));
    }
  };
  for (auto* v : {&p->q, &p->k, &p->v, &p->dout}) round_to(*v);
  check_inputs(*p);

  // Full oracle up to 4096 x 4096 scores per head; beyond, 64 evenly spaced query rows (O and dQ only).
  p->full_oracle = s.n * s.n_kv <= 4096LL * 4096LL;
  const int64_t nrows = p->full_oracle ? s.n : std::min<int64_t>(64, s.n);
  for (int64_t i = 0; i < nrows; ++i) p->rows.push_back(nrows == s.n ? i : i * (s.n - 1) / (nrows - 1));
  const int64_t r = nrows, d = s.d;
  p->o.assign(s.b * s.h * r * d, 0.0);
  if (s.backward) {
    p->dq.assign(s.b * s.h * r * d, 0.0);
    if (p->full_oracle) {
      p->dk.assign(s.kv_elems(), 0.0);
      p->dv.assign(s.kv_elems(), 0.0);
    }
  }
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t kvh = h / s.group();
      const int64_t qoff = (b * s.h + h) * s.n * d, kvoff = (b * s.h_kv + kvh) * s.n_kv * d;
      const int64_t ooff = (b * s.h + h) * r * d;
      reference_head_f64(s, &p->q[qoff], &p->k[kvoff], &p->v[kvoff], s.backward ? &p->dout[qoff] : nullptr, p->rows,
                         &p->o[ooff], s.backward ? &p->dq[ooff] : nullptr,
                         s.backward && p->full_oracle ? &p->dk[kvoff] : nullptr,
                         s.backward && p->full_oracle ? &p->dv[kvoff] : nullptr);
    }
  return p;
}

AttnWorkload::AttnWorkload(const AttnProblem& p, Device& dev)
    : p_(p), s_(p.s), dev_(dev),
      q_(make_tensor(dev, s_.dtype, {s_.b, s_.h, s_.n, s_.d}, Tag::io, p.q)),
      k_(make_tensor(dev, s_.dtype, {s_.b, s_.h_kv, s_.n_kv, s_.d}, Tag::io, p.k)),
      v_(make_tensor(dev, s_.dtype, {s_.b, s_.h_kv, s_.n_kv, s_.d}, Tag::io, p.v)),
      o_(dev, s_.dtype, {s_.b, s_.h, s_.n, s_.d}, Tag::io) {
  if (s_.backward) {
    dout_ = make_tensor(dev, s_.dtype, {s_.b, s_.h, s_.n, s_.d}, Tag::io, p.dout);
    dq_ = Tensor(dev, s_.dtype, {s_.b, s_.h, s_.n, s_.d}, Tag::grads);
    dk_ = Tensor(dev, s_.dtype, {s_.b, s_.h_kv, s_.n_kv, s_.d}, Tag::grads);
    dv_ = Tensor(dev, s_.dtype, {s_.b, s_.h_kv, s_.n_kv, s_.d}, Tag::grads);
  }
}

ErrorStats AttnWorkload::error() {
  // Gather the oracle's query rows from a [B, H, N, D] tensor.
  auto rows_of = [&](const Tensor& t) {
    const auto all = download(dev_, t.view());
    if (p_.full_oracle) return all;
    const int64_t r = static_cast<int64_t>(p_.rows.size()), d = s_.d;
    std::vector<double> out(s_.b * s_.h * r * d);
    for (int64_t bh = 0; bh < s_.b * s_.h; ++bh)
      for (int64_t i = 0; i < r; ++i)
        std::copy_n(&all[(bh * s_.n + p_.rows[i]) * d], d, &out[(bh * r + i) * d]);
    return out;
  };
  per_tensor_.clear();
  ErrorStats worst = error_stats(rows_of(o_), p_.o);
  auto note = [&](const char* name, const ErrorStats& e) {
    per_tensor_[std::string("rel_l2_err_") + name] = e.rel_l2;
    per_tensor_[std::string("max_abs_err_") + name] = e.max_abs;
    if (!(e.rel_l2 <= worst.rel_l2)) worst = e;  // NaN-safe: a non-finite error always wins
  };
  note("o", worst);
  if (s_.backward) {
    note("dq", error_stats(rows_of(dq_), p_.dq));
    if (p_.full_oracle) {
      note("dk", error_stats(download(dev_, dk_.view()), p_.dk));
      note("dv", error_stats(download(dev_, dv_.view()), p_.dv));
    }
  }
  return worst;
}

std::vector<std::vector<double>> AttnWorkload::outputs() {
  std::vector<std::vector<double>> out{download(dev_, o_.view())};
  if (s_.backward)
    for (const Tensor* t : {&dq_, &dk_, &dv_}) out.push_back(download(dev_, t->view()));
  return out;
}

void AttnWorkload::add_counters(std::map<std::string, double>& counters) {
  for (const auto& [k, v] : per_tensor_) counters[k] = v;
  counters["oracle_rows"] = static_cast<double>(p_.rows.size());
}

Work AttnWorkload::work() const {
  const double e = static_cast<double>(dtype_size(s_.dtype));
  double bytes = (2.0 * s_.q_elems() + 2.0 * s_.kv_elems()) * e;
  if (s_.backward) bytes += (2.0 * s_.q_elems() + 2.0 * s_.kv_elems()) * e;
  Work w;
  w.flops = flops(s_);
  w.bytes = bytes;
  w.gemm_dtype = dtype_name(s_.dtype);
  return w;
}

namespace {
std::size_t live_tensors(const Dims& s) {
  const std::size_t e = dtype_size(s.dtype);
  std::size_t bytes = (2 * s.q_elems() + 2 * s.kv_elems()) * e;        // q, k, v, o
  if (s.backward) bytes += (2 * s.q_elems() + 2 * s.kv_elems()) * e;  // dout, dq, dk, dv
  return bytes;
}
}  // namespace

MemoryModel naive_memory(const Dims& s, Backend backend) {
  MemoryModel m{live_tensors(s), 0};
  if (backend == Backend::cuda) m.live_before += 32u << 20;  // the cuBLAS workspace
  const std::size_t scores = static_cast<std::size_t>(s.b * s.h) * s.n * s.n_kv * sizeof(float);
  m.extra = scores * (s.backward ? 2 : 1);  // P, and dS in the backward pass
  if (s.dtype != DType::f32)                // fp32 copies of every tensor the call reads or writes
    m.extra += (2 * s.q_elems() + 2 * s.kv_elems()) * sizeof(float) * (s.backward ? 2 : 1);
  return m;
}

int64_t cpu_flash_slots(const Dims& s) {
  const int64_t q_items = s.b * s.h * ((s.n + kCpuBlockQ - 1) / kCpuBlockQ);
  const int64_t k_items = s.b * s.h_kv * ((s.n_kv + kCpuBlockK - 1) / kCpuBlockK);
  return std::min<int64_t>(kCpuSlots, s.backward ? std::max(q_items, k_items) : q_items);
}

MemoryModel flash_memory(const Dims& s, Backend backend) {
  MemoryModel m{live_tensors(s), 0};
  if (s.backward) m.extra += 2 * static_cast<std::size_t>(s.rows()) * sizeof(float);  // lse and delta
  if (backend == Backend::cpu) m.extra += cpu_flash_slots(s) * cpu_flash_slot_bytes(s.d);
  return m;
}

}  // namespace memtrade::attention
