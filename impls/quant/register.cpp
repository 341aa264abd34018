// The `quant` technique: a linear layer's weights stored in a quantized format, multiplied with an
// activation vector (matvec, decode) or matrix (matmul, prefill) without materializing the fp32 matrix.
//
// Case parameters: n (output rows), k (input columns), m (activation rows; 1 = matvec), format (a
// formats.hpp spec name such as "int4-g128", or "fp32" / "bf16" for the dense baselines: matvec, or up to
// m = kMatmulSmallBatch through the dense small-batch kernel, so that a quantized small batch has its
// dense counterpart), quantizer ("rtn", "gptq", "gptq-act-order": GPTQ with its act_order option,
// "awq", "awq-clip": AWQ with its weight-clipping search). Weights and calibration activations are
// synthetic (calibration.hpp: Gaussian weights, activations with 1% outlier channels 25-100x larger; the
// calibration rows and the measured rows share their outlier channels; calib_rows of them calibrate, and
// with shared_factors > 0 the channels are correlated). The trained model's figures are the quant_model
// technique's (impls/quant_model).
//
// Implementations: `reference` (dequantize each weight, float64 accumulation), `packed` on the CPU
// (packed codes read once and decoded in registers, AVX-512, OpenMP; matmul through OpenBLAS on
// dequantized panels), `packed-a16` on the CPU (int8 / int4 codes, or nf4's levels as int16, times the
// activations rounded to int16 per block of 32, in integer multiply-adds: simd/matvec_a16.hpp), `packed-a8`
// on the CPU (the same with int8 activations and byte multiply-adds, llama.cpp's Q4_0 x Q8_0:
// simd/matvec_a8.hpp; both judged with the derived bound on what their roundings can move) and `packed` on CUDA (matvec: one warp per row). Timed with cold caches (Work::cold_cache).
// Counters: weight_bytes (codes + scales + zero points, the exact blob), bits_per_weight, output error
// against the float64 product with the ORIGINAL weights (rel_l2_err: quantization + arithmetic), the
// weight reconstruction error (weight_rel_l2_err), the layer-output MSE on the calibration rows and on
// held-out rows (GPTQ and AWQ scored out of sample), GB/s over the
// weight bytes and the fraction of the machine's copy bandwidth.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/simd/targets.hpp"
#include "datasets/random.hpp"
#include "harness/claims.hpp"
#include "harness/registry.hpp"
#include "impls/quant/calibration.hpp"
#include "impls/quant/matvec.hpp"
#include "impls/quant/quantizers.hpp"
#include "impls/quant/simd/matvec_a16.hpp"
#include "impls/quant/simd/matvec_a8.hpp"

namespace memtrade::quant {

void register_technique(Registry& r);

namespace {

struct QuantCase {
  int64_t n, k, m;
  bool dense;        // fp32 / bf16 baseline
  DType dense_dtype = DType::f32;
  Spec spec;
  std::string quantizer;
  int64_t calib_rows = 256;  // rows GPTQ and AWQ calibrate on
  int64_t shared_factors = 0;  // 0: independent input channels; r: correlated through r shared factors
};

QuantCase read_case(const Case& c) {
  QuantCase q;
  q.n = c.integer("n");
  q.k = c.integer("k");
  q.m = c.integer("m", 1);
  MT_CHECK(q.n > 0 && q.k > 0 && q.m > 0, "case " + c.id + ": n, k and m must be positive");
  const std::string f = c.text("format");
  q.dense = f == "fp32" || f == "bf16";
  if (q.dense) q.dense_dtype = f == "fp32" ? DType::f32 : DType::bf16;
  else q.spec = parse_spec(f);
  q.quantizer = c.text("quantizer", "rtn");
  q.calib_rows = c.integer("calib_rows", 256);
  MT_CHECK(q.calib_rows > 0, "case " + c.id + ": calib_rows must be positive");
  q.shared_factors = c.integer("shared_factors", 0);
  MT_CHECK(q.shared_factors >= 0, "case " + c.id + ": shared_factors must not be negative");
  MT_CHECK(is_quantizer_name(q.quantizer),
           "case " + c.id + ": quantizer must be " + quantizer_names() + ", got '" + q.quantizer + "'");
  MT_CHECK(!q.dense || q.m <= kMatmulSmallBatch,
           "case " + c.id + ": the dense baselines run up to m = " + std::to_string(kMatmulSmallBatch) +
               " (a matvec, or the small-batch kernel), got m = " + std::to_string(q.m));
  if (!q.dense) layout(q.spec, q.n, q.k);  // validates the group against the shape
  MT_CHECK(q.quantizer != "awq-clip" || (!q.dense && awq_clip_applies(q.spec)),
           "case " + c.id + ": awq-clip (AWQ's clipping search) is for the group-wise 4-bit formats (int4, int4-asym, "
           "nf4 without double quantization), not " + f);
  return q;
}

struct QuantProblem final : Problem {
  QuantCase q;
  std::vector<float> w;                 // original weights [n x k]
  std::vector<float> x;                 // activations [m x k] as the kernel sees them (AWQ: divided by s)
  std::vector<double> oracle;           // [m x n] float64 product with the original weights
  QLayout L;
  std::vector<uint8_t> blob;            // the quantized weights
  std::vector<bf16_t> w_bf16;
  double weight_rel_l2 = 0, calib_mse = 0, heldout_mse = 0, awq_ratio = 0;
  // packed-a16 / packed-a8: the most their int16 / int8 activations (and nf4's integer levels) can move an output
  double a16_max_shift = 0, a8_max_shift = 0;
};

std::unique_ptr<Problem> prepare(const Case& c) {
  auto p = std::make_unique<QuantProblem>();
  const QuantCase q = p->q = read_case(c);
  p->w = synthetic_weights(q.n, q.k, 11);
  // The calibration rows and the measured input rows come from one draw, so they share the outlier
  // channels (in a model these are fixed features of the layer's input), but are different rows.
  // A third set of rows from the same draw, held out from calibration, scores GPTQ and AWQ out of
  // sample (they minimize the layer-output error on their calibration rows). Rows of the draw: the first
  // min(calib_rows, 256) calibration rows, the m measured rows, the 256 held-out rows, then any further
  // calibration rows, so the measured and held-out rows do not depend on calib_rows.
  const int64_t n_held = 256, n_first = std::min<int64_t>(q.calib_rows, 256), n_extra = q.calib_rows - n_first;
  const auto all = synthetic_activations(256 + q.m + n_held + n_extra, q.k, 13, 0.01, 50, q.shared_factors);
  const auto row = [&](int64_t i) { return all.begin() + i * q.k; };
  std::vector<float> X(row(0), row(n_first));
  X.insert(X.end(), row(256 + q.m + n_held), all.end());
  p->x.assign(row(256), row(256 + q.m));
  const std::vector<float> held(row(256 + q.m), row(256 + q.m + n_held));
  p->oracle.assign(q.m * q.n, 0.0);
  for (int64_t i = 0; i < q.m; ++i)
    for (int64_t r = 0; r < q.n; ++r) {
      double s = 0;
      for (int64_t j = 0; j < q.k; ++j) s += static_cast<double>(p->w[r * q.k + j]) * p->x[i * q.k + j];
      p->oracle[i * q.n + r] = s;
    }
  if (q.dense) {
    for (float v : p->w) p->w_bf16.push_back(to_bf16(v));
    return p;
  }
  QuantResult res = quantize_named(q.quantizer, q.spec, p->w.data(), q.n, q.k, X.data(), q.calib_rows);
  p->L = layout(q.spec, q.n, q.k);
  p->blob.assign(p->L.total_bytes(), 0);
  std::vector<float> stored = res.deq;
  if (!res.in_scale.empty()) {  // AWQ stores W * s; the runtime feeds x / s
    for (int64_t r = 0; r < q.n; ++r)
      for (int64_t j = 0; j < q.k; ++j) stored[r * q.k + j] = res.deq[r * q.k + j] * res.in_scale[j];
    for (int64_t i = 0; i < q.m; ++i)
      for (int64_t j = 0; j < q.k; ++j) p->x[i * q.k + j] /= res.in_scale[j];
    p->awq_ratio = res.awq_ratio;
  }
  const bool own_params = q.spec.format == Format::nf4 && q.spec.double_quant;
  quantize(p->L, stored.data(), p->blob.data(), own_params ? nullptr : res.params.data());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < p->w.size(); ++i) {
    num += std::pow(static_cast<double>(res.deq[i]) - p->w[i], 2);
    den += std::pow(static_cast<double>(p->w[i]), 2);
  }
  p->weight_rel_l2 = std::sqrt(num / den);
  p->calib_mse = layer_output_mse(p->w.data(), res.deq.data(), q.n, q.k, X.data(), q.calib_rows);
  p->heldout_mse = layer_output_mse(p->w.data(), res.deq.data(), q.n, q.k, held.data(), n_held);
  if (q.m == 1) {
    std::vector<float> wd(p->w.size());
    dequantize(p->L, p->blob.data(), wd.data());
    auto max_shift = [&](int bits) {
      const IntActivations a = quantize_activations(p->x.data(), q.k, bits);
      auto shift = activation_bound(a, wd.data(), q.n, q.k);
      const auto levels = nf4_level_bound(p->L, p->blob.data(), a);  // nf4's integer levels; 0 otherwise
      for (std::size_t r = 0; r < shift.size(); ++r) shift[r] += levels[r];
      return *std::max_element(shift.begin(), shift.end());
    };
    if (a16_unsupported(p->L).empty()) p->a16_max_shift = max_shift(16);
    if (a8_unsupported(p->L).empty()) p->a8_max_shift = max_shift(8);
  }
  return p;
}

class QuantWorkload final : public Workload {
 public:
  // act_bits: 16 or 8 for the integer-activation kernels (packed-a16 / packed-a8), 0 otherwise.
  QuantWorkload(const QuantProblem& p, Device& dev, bool optimized, int act_bits)
      : p_(p), dev_(dev), optimized_(optimized), act_bits_(act_bits) {
    const QuantCase& q = p.q;
    auto& pool = dev.memory();
    if (q.dense) {
      const std::size_t bytes = q.n * q.k * dtype_size(q.dense_dtype);
      w_ = Buffer(pool, bytes, Tag::weights);
      dev.copy(w_.data(), q.dense_dtype == DType::f32 ? static_cast<const void*>(p.w.data()) : p.w_bf16.data(), bytes,
               CopyKind::host_to_device);
    } else {
      w_ = Buffer(pool, p.blob.size(), Tag::weights);
      dev.copy(w_.data(), p.blob.data(), p.blob.size(), CopyKind::host_to_device);
    }
    x_ = Buffer(pool, q.m * q.k * sizeof(float), Tag::io);
    dev.copy(x_.data(), p.x.data(), q.m * q.k * sizeof(float), CopyKind::host_to_device);
    y_ = Buffer(pool, q.m * q.n * sizeof(float), Tag::io);
  }

  void run() override {
    const QuantCase& q = p_.q;
    const float* x = x_.as<float>();
    float* y = y_.as<float>();
    if (q.dense) {
      const bool cuda = dev_.backend() == Backend::cuda;
      const bool f32 = q.dense_dtype == DType::f32;
      if (cuda)
        f32 ? matvec_dense_cuda(w_.as<float>(), x, y, q.n, q.k, dev_) : matvec_dense_cuda(w_.as<bf16_t>(), x, y, q.n, q.k, dev_);
      else if (q.m == 1)
        f32 ? matvec_dense_f32(w_.as<float>(), x, y, q.n, q.k) : matvec_dense_bf16(w_.as<bf16_t>(), x, y, q.n, q.k);
      else
        f32 ? matmul_dense_f32(w_.as<float>(), x, q.m, y, q.n, q.k) : matmul_dense_bf16(w_.as<bf16_t>(), x, q.m, y, q.n, q.k);
      return;
    }
    const uint8_t* blob = w_.as<uint8_t>();
    if (dev_.backend() == Backend::cuda) {
      matvec_cuda(p_.L, blob, x, y, dev_);
    } else if (act_bits_ == 16) {
      Buffer ws(dev_.memory(), a16_workspace_bytes(q.k), Tag::workspace);
      matvec_a16(p_.L, blob, x, y, ws.data());
    } else if (act_bits_ == 8) {
      Buffer ws(dev_.memory(), a8_workspace_bytes(q.k), Tag::workspace);
      matvec_a8(p_.L, blob, x, y, ws.data());
    } else if (!optimized_) {
      if (q.m == 1) matvec_reference(p_.L, blob, x, y);
      else matmul_reference(p_.L, blob, x, q.m, y);
    } else if (q.m == 1) {
      matvec_cpu(p_.L, blob, x, y);
    } else {
      Buffer ws(dev_.memory(), matmul_workspace_bytes(p_.L, q.m), Tag::workspace);
      matmul_cpu(p_.L, blob, x, q.m, y, ws.as<float>());
    }
  }

  ErrorStats error() override {
    std::vector<float> y(p_.q.m * p_.q.n);
    dev_.copy(y.data(), y_.data(), y.size() * sizeof(float), CopyKind::device_to_host);
    return error_stats(std::vector<double>(y.begin(), y.end()), p_.oracle);
  }

  Work work() const override {
    Work w;
    const QuantCase& q = p_.q;
    w.flops = 2.0 * q.m * q.n * q.k;
    w.bytes = static_cast<double>(w_.bytes()) + 4.0 * (q.m * q.k + q.m * q.n);
    w.cold_cache = true;  // decode is memory-bound: weights must come from DRAM, as in a model's forward
    w.read_stream = q.m == 1;  // a matvec streams its weights; a matmul reuses them
    return w;
  }

  // Which kernel ran on the CPU (the SIMD target dispatch chose, or the hand-written AVX-512 4-bit path).
  std::string detail() override {
    if (dev_.backend() != Backend::cpu || !optimized_) return {};
    if (p_.q.dense) return "simd " + memtrade::simd::target_name();
    if (p_.q.m > 1) return "matmul " + matmul_cpu_path(p_.L, p_.q.m) + ", simd " + memtrade::simd::target_name();
    if (act_bits_) return "kernel a" + std::to_string(act_bits_) + "-hwy-" + memtrade::simd::target_name();
    return "kernel " + matvec_cpu_path(p_.L);
  }

  void add_counters(std::map<std::string, double>& c) override {
    const QuantCase& q = p_.q;
    c["weight_bytes"] = static_cast<double>(w_.bytes());
    c["bits_per_weight"] = 8.0 * static_cast<double>(w_.bytes()) / (static_cast<double>(q.n) * q.k);
    if (!q.dense) {
      c["weight_rel_l2_err"] = p_.weight_rel_l2;
      c["calib_output_mse"] = p_.calib_mse;
      c["heldout_output_mse"] = p_.heldout_mse;
      if (q.quantizer.starts_with("awq")) c["awq_ratio"] = p_.awq_ratio;
    }
  }

 private:
  const QuantProblem& p_;
  Device& dev_;
  const bool optimized_;
  const int act_bits_;
  Buffer w_, x_, y_;
};

// int4-7b: "INT4 takes a 7B model from 14 GB to about 4 GB", answered with the memory model: the bytes
// of Llama-2-7B (the 224 projection matrices of 32 layers in the format; embedding, lm_head and norms
// in fp16) from the exact layouts memtrade stores. The model is validated first against every measured
// weight blob of this run (weight_bytes of each ok record must equal the layout's size for its shape);
// a mismatch is an error, not a verdict. Decided against `band` (GB, INT4 g128) and `fp16_band`.
ClaimResult check_int4_7b(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec), fp16_band = claim_band(spec, "fp16_band");
  int validated = 0;
  for (const auto& r : recs) {
    if (r.technique != "quant" || r.status != "ok" || !r.counters.count("weight_bytes")) continue;
    const std::string format = r.kase.params.value("format", std::string());
    if (format == "fp32" || format == "bf16") continue;  // dense baselines have no quantized layout
    const Spec s = parse_spec(format);
    const double model = static_cast<double>(layout(s, r.kase.params.value("n", int64_t{0}), r.kase.params.value("k", int64_t{0})).total_bytes());
    if (model != r.counter("weight_bytes"))
      return {"", "error", "the memory model disagrees with a measured blob: " + r.name + fmt(" holds %.0f B, the layout says ", r.counter("weight_bytes")) + fmt("%.0f B", model)};
    ++validated;
  }
  const int64_t d = 4096, f = 11008, layers = 32, vocab = 32000;
  const double fp16_rest = 2.0 * (2.0 * vocab * d + (2 * layers + 1) * d);
  std::string measured;
  double int4_gb = NAN;
  const Json formats = spec.data.value("formats", Json::array({"int4-g128", "int8", "nf4", "nf4-dq", "fp8-e4m3"}));
  for (const auto& name : formats) {
    const Spec s = parse_spec(name.get<std::string>());
    double bytes = fp16_rest;
    for (auto [rows, cols] : {std::pair{d, d}, {d, d}, {d, d}, {d, d}, {f, d}, {f, d}, {d, f}})
      bytes += static_cast<double>(layers) * static_cast<double>(layout(s, rows, cols).total_bytes());
    measured += name.get<std::string>() + fmt(" %.2f GB; ", bytes * 1e-9);
    if (name == "int4-g128") int4_gb = bytes * 1e-9;
  }
  const double fp16_gb = (fp16_rest + 2.0 * layers * (4.0 * d * d + 3.0 * d * f)) * 1e-9;
  measured = fmt("fp16 %.2f GB; ", fp16_gb) + measured;
  return {measured, combine_verdicts({decide(fp16_gb, 0, fp16_band), decide(int4_gb, 0, band)}),
          "memory model, not a measurement on a 7B model: exact blob sizes of memtrade's layouts for the 224 "
          "projection matrices (4 x 4096^2 + 3 x 4096 x 11008 per layer) with fp16 embeddings, lm_head and norms, "
          "validated against " + std::to_string(validated) + " measured blob(s) of this run; fp16 band " +
          fp16_band.str() + " GB, INT4 g128 band " + band.str() + " GB; QLoRA measured 5,048 MB for 4-bit LLaMA-7B "
          "in memory"};
}

}  // namespace

void register_technique(Registry& r) {
  Technique t;
  t.name = "quant";
  t.description = "quantized weights (INT8, INT4, FP8, NF4; RTN, GPTQ with or without act_order, AWQ with or without "
                  "clipping) in matvec / matmul";
  t.validate = [](const Case& c) { read_case(c); };
  t.schema.params = {
      int_param("n", "output rows of the weight matrix"),
      int_param("k", "input features"),
      int_param("m", "activation rows: 1 is matvec (decode), more is matmul (prefill)", 1),
      text_param("format",
                 "fp32 | bf16 (dense baselines) | int8 | int4[-asym]-gG | fp8-e4m3 | fp8-e5m2 | nf4[-dq] "
                 "(-gG: group size G, default 128)"),
      text_param("quantizer", "how the codes are chosen (gptq-act-order: columns by descending Hessian diagonal)", "rtn",
                 std::vector<Json>(kQuantizers.begin(), kQuantizers.end())),
      int_param("calib_rows",
                "calibration rows: what GPTQ and AWQ fit (GPTQ's Hessian has rank at most this) and what every "
                "quantizer's in-sample output MSE is taken over",
                256),
      int_param("shared_factors",
                "0: independent input channels; r: each channel 90% a mix of r factors shared by all channels "
                "(correlated, as a model's hidden states; GPTQ's error feedback needs correlation to gain)",
                0, 0),
  };
  t.schema.metrics = {
      {"weight_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "bytes of the stored weight blob"},
      {"bits_per_weight", "bits", Better::lower, Gate::exact, 0, 0, "8 x weight_bytes / (n k)"},
      {"weight_rel_l2_err", "1", Better::lower, Gate::ratio, 1.05, 0, "||W_q - W|| / ||W||"},
      {"calib_output_mse", "1", Better::lower, Gate::ratio, 1.05, 0, "layer output MSE on calibration rows"},
      {"heldout_output_mse", "1", Better::lower, Gate::ratio, 1.05, 0,
       "layer output MSE on 256 held-out rows (not used to calibrate: GPTQ/AWQ out of sample)"},
      {"awq_ratio", "1", Better::none, Gate::report, 0, 0, "AWQ's chosen scale exponent"},
  };
  // The reference decodes each weight and accumulates in float64, so its error against the product with
  // the original weights is the quantization error: bounded by 3x the weights' own relative error
  // (a random x does not amplify it more) plus fp32 rounding; dense bf16 by bf16's roundoff.
  t.error_rule.reference_bound = [](const Case&, const Problem& prob) {
    const auto& p = problem_as<QuantProblem>(prob);
    if (p.q.dense) return 8 * unit_roundoff(p.q.dense_dtype);
    return 3 * p.weight_rel_l2 + 8 * unit_roundoff(DType::f32);
  };
  // packed-a16 / packed-a8 multiply int16- / int8-rounded activations: their outputs may move by up to
  // the derived activation_bound plus nf4_level_bound (max over rows) on top of the packed path's allowance.
  t.error_rule.approximation = [](const Case&, const Problem& prob, const Impl& impl) {
    const auto& p = problem_as<QuantProblem>(prob);
    return impl.name == "packed-a16" ? p.a16_max_shift : impl.name == "packed-a8" ? p.a8_max_shift : 0.0;
  };
  t.prepare = prepare;
  auto add = [&](const char* name, Role role, const char* desc, bool optimized, Backend be = Backend::cpu) {
    const std::string n = name;
    const int act_bits = n == "packed-a16" ? 16 : n == "packed-a8" ? 8 : 0;
    Impl i = typed_impl<QuantProblem>(t.name, name, role, be, desc, [optimized, act_bits](const QuantProblem& prob, Device& dev) {
      return std::make_unique<QuantWorkload>(prob, dev, optimized, act_bits);
    });
    if (act_bits)
      i.not_applicable = [act_bits](const Case& c) {
        const QuantCase q = read_case(c);
        if (q.dense) return std::string("the dense baselines have one implementation (cpu)");
        if (q.m > 1) return std::string("the integer-activation kernels are matvecs (m = 1)");
        const QLayout L = layout(q.spec, q.n, q.k);
        return act_bits == 16 ? a16_unsupported(L) : a8_unsupported(L);
      };
    else if (be == Backend::cuda)
      i.not_applicable = [](const Case& c) {
        return c.integer("m", 1) > 1 ? std::string("the CUDA kernel is a matvec (m = 1)") : std::string();
      };
    else if (!optimized)
      i.not_applicable = [](const Case& c) {
        const std::string f = c.text("format");
        return f == "fp32" || f == "bf16" ? std::string("the dense baselines have one implementation (cpu)")
                                          : std::string();
      };
    t.impls.push_back(std::move(i));
  };
  add("reference", Role::reference, "dequantize each weight, float64 accumulation", false);
  add("packed", Role::optimized, "packed codes decoded in registers (AVX-512, OpenMP); matmul via OpenBLAS panels", true);
  add("packed-a16", Role::optimized,
      "int8 / int4 codes (nf4: int16 levels) times int16-quantized activations (per 32), exact int32 pairwise products (Highway)", true);
  add("packed-a8", Role::optimized,
      "int8 / int4 codes (nf4: byte levels) times int8-quantized activations (per 32), byte multiply-adds (x86 vpmaddubsw)", true);
  add("packed", Role::optimized,
      "8 rows per block, 16-code chunks (128- / 64-bit loads) with their x values shared by the rows, decoded in registers", true,
      Backend::cuda);
  t.claims["int4-7b"] = check_int4_7b;
  r.add(std::move(t));
}

#ifndef MEMTRADE_WITH_CUDA
void matvec_cuda(const QLayout&, const uint8_t*, const float*, float*, Device&) { throw Skip(cuda_status().reason); }
void matvec_dense_cuda(const float*, const float*, float*, int64_t, int64_t, Device&) { throw Skip(cuda_status().reason); }
void matvec_dense_cuda(const bf16_t*, const float*, float*, int64_t, int64_t, Device&) { throw Skip(cuda_status().reason); }
#endif

}  // namespace memtrade::quant
