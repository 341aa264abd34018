// The `quant_model` technique: the small model of impls/model, trained in fp32 on the fortunes corpus
// exactly as the precision suite's fp32 run trains it (same config, seed, batches), with every linear
// projection of every layer (q, k, v, o, gate, up, down) quantized by RTN, GPTQ or AWQ in one format;
// the embedding, the norms and lm_head stay fp32 (as GPTQ/AWQ leave embeddings and the head in fp16).
//
// Calibration: the inputs of each projection on `calib_batches` training batches, captured from the
// fp32 model (all layers from the unquantized model, not GPTQ's sequential layer-by-layer pass).
// Figures: validation perplexity exp(mean loss) on `eval_batches` validation batches with the
// dequantized weights, against the fp32 model's. The timed call is that evaluation on the CPU with the
// dequantized fp32 weights, so time and memory of these cases describe the evaluation, not a quantized
// runtime (the `quant` suite measures the kernels).
//
// Case parameters: the model and training parameters of the precision suite (dim, layers, heads,
// kv_heads, ffn, context, batch, steps, lr, warmup_steps, seed), eval_batches, calib_batches, format.
// Implementations: rtn (reference), gptq, awq.
#include <cmath>
#include <mutex>

#include "datasets/corpus.hpp"
#include "harness/claims.hpp"
#include "harness/registry.hpp"
#include "harness/stats.hpp"
#include "model/train.hpp"
#include "model/train_case.hpp"
#include "impls/quant/quantizers.hpp"

namespace memtrade::quant_model {

using namespace memtrade::quant;

void register_technique(Registry& r);

namespace {

struct Trained {
  model::Config cfg;
  model::TrainOptions opts;
  datasets::Corpus corpus;
  datasets::Split split;
  std::vector<float> params;
  std::vector<model::Trainer::LinearInputs> calib;  // per layer, concatenated over calibration batches
  int64_t calib_rows = 0;
  double fp32_val_loss = 0;
  std::vector<double> fp32_batch_loss;  // per validation batch
  int64_t eval_batches = 0;
  uint64_t seed = 0;
};

datasets::Batch val_batch(const Trained& t, int64_t k) {
  return datasets::sample_batch(t.split.val, t.opts.batch, t.opts.seq, t.seed + 1000, static_cast<uint64_t>(k));
}

std::vector<double> batch_losses(const Trained& t, model::Trainer& tr) {
  std::vector<double> out;
  for (int64_t k = 0; k < t.eval_batches; ++k) out.push_back(tr.eval_loss(val_batch(t, k)));
  return out;
}

// Not stats::mean, which rejects NaN: a non-finite batch loss must reach the record as a NaN loss (the
// error check counts it), not abort the case.
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// Trains (or reuses, within this process) the fp32 model of the case's training parameters.
std::shared_ptr<const Trained> trained_model(const Case& c) {
  Json key = c.params;
  key.erase("format");
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Trained>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key.dump()); it != cache.end()) return it->second;
  auto t = std::make_shared<Trained>();
  const model::TrainCase tc = model::read_train_case(c);
  t->cfg = tc.cfg;
  t->opts = tc.opts;
  t->seed = tc.seed;
  t->eval_batches = tc.eval_batches;
  const int64_t steps = tc.steps, calib_batches = c.integer("calib_batches", 2);
  MT_CHECK(calib_batches > 0, "case " + c.id + ": calib_batches must be > 0");
  t->corpus = model::load_case_corpus(tc);
  t->split = datasets::split(t->corpus);
  t->params = model::train_fp32(t->cfg, t->opts, t->split.train, steps, t->seed);
  auto dev = make_cpu_device();
  auto tr = model::make_trainer_cpu(t->cfg, t->opts, *dev, t->params);
  for (int64_t b = 0; b < calib_batches; ++b) {
    // Calibration batches come after the training batches, so they are text the model has not seen.
    const auto in = tr->linear_inputs(
        datasets::sample_batch(t->split.train, t->opts.batch, t->opts.seq, t->seed, static_cast<uint64_t>(steps + b)));
    if (t->calib.empty()) t->calib.resize(in.size());
    for (std::size_t l = 0; l < in.size(); ++l)
      for (int k = 0; k < 4; ++k) t->calib[l][k].insert(t->calib[l][k].end(), in[l][k].begin(), in[l][k].end());
  }
  t->calib_rows = calib_batches * t->opts.batch * t->opts.seq;
  t->fp32_batch_loss = batch_losses(*t, *tr);
  t->fp32_val_loss = mean(t->fp32_batch_loss);
  cache[key.dump()] = t;
  return t;
}

struct ModelQuantProblem final : Problem {
  std::shared_ptr<const Trained> model;
  Spec spec;
};

std::unique_ptr<Problem> prepare(const Case& c) {
  auto p = std::make_unique<ModelQuantProblem>();
  p->spec = parse_spec(c.text("format"));
  p->model = trained_model(c);
  return p;
}

class ModelQuantWorkload final : public Workload {
 public:
  ModelQuantWorkload(const ModelQuantProblem& p, const std::string& quantizer, Device& dev) : p_(p), dev_(dev) {
    if (dev.backend() != Backend::cpu) throw Skip("model-level quantization is evaluated on the CPU");
    const Trained& t = *p.model;
    params_ = t.params;
    const auto L = model::param_layout(t.cfg);
    const int64_t D = t.cfg.dim, KV = t.cfg.kv_dim(), F = t.cfg.ffn;
    double num = 0, den = 0;
    for (std::size_t l = 0; l < L.layer.size(); ++l) {
      const auto& P = L.layer[l];
      const auto& in = t.calib[l];
      // (offset, out rows, in cols, calibration input index)
      const std::tuple<int64_t, int64_t, int64_t, int> projections[] = {
          {P.wq, D, D, 0}, {P.wk, KV, D, 0}, {P.wv, KV, D, 0}, {P.wo, D, D, 1},
          {P.wg, F, D, 2}, {P.wu, F, D, 2},  {P.wd, D, F, 3}};
      for (const auto& [off, n, k, x] : projections) {
        const float* w = t.params.data() + off;
        const float* X = in[x].data();
        QuantResult q = quantizer == "gptq"  ? quantize_gptq(p.spec, w, n, k, X, t.calib_rows)
                        : quantizer == "awq" ? quantize_awq(p.spec, w, n, k, X, t.calib_rows)
                                             : quantize_rtn(p.spec, w, n, k);
        std::copy(q.deq.begin(), q.deq.end(), params_.begin() + off);
        for (int64_t i = 0; i < n * k; ++i) {
          num += std::pow(static_cast<double>(q.deq[i]) - w[i], 2);
          den += std::pow(static_cast<double>(w[i]), 2);
        }
        weight_bytes_ += static_cast<double>(layout(p.spec, n, k).total_bytes());
        fp32_bytes_ += 4.0 * static_cast<double>(n * k);
      }
    }
    weight_rel_l2_ = std::sqrt(num / den);
    trainer_ = model::make_trainer_cpu(t.cfg, t.opts, dev, params_);
  }

  void run() override {
    batch_loss_ = batch_losses(*p_.model, *trainer_);
    loss_ = mean(batch_loss_);
  }

  // The error figures are the weight reconstruction error of all quantized projections (relative L2
  // against the fp32 weights); perplexities are counters.
  ErrorStats error() override {
    ErrorStats e;
    e.rel_l2 = weight_rel_l2_;
    e.n = params_.size();
    if (!std::isfinite(loss_)) e.nan_count = 1;
    return e;
  }

  Work work() const override {
    Work w;
    const auto& t = *p_.model;
    const double tokens = static_cast<double>(t.eval_batches * t.opts.batch * t.opts.seq);
    w.items = tokens;
    w.item_unit = "tokens";
    return w;
  }

  void add_counters(std::map<std::string, double>& c) override {
    const double ref = p_.model->fp32_val_loss;
    c["val_loss"] = loss_;
    c["perplexity"] = std::exp(loss_);
    c["perplexity_fp32"] = std::exp(ref);
    c["perplexity_rel_delta"] = std::exp(loss_ - ref) - 1.0;
    // The noise of that figure: the standard error of the mean per-batch loss difference against fp32 on
    // the same validation batches (paired), carried through exp.
    const auto& f = p_.model->fp32_batch_loss;
    const std::size_t k = batch_loss_.size();
    if (k >= 2 && f.size() == k) {
      std::vector<double> d(k);
      for (std::size_t i = 0; i < k; ++i) d[i] = batch_loss_[i] - f[i];
      const double m = mean(d);
      double ss = 0;
      for (double x : d) ss += (x - m) * (x - m);
      c["perplexity_rel_delta_se"] = std::exp(loss_ - ref) * std::sqrt(ss / static_cast<double>(k - 1) / static_cast<double>(k));
    }
    for (std::size_t i = 0; i < k; ++i) {
      char key[48];
      std::snprintf(key, sizeof key, "val_loss_batch_%03zu", i);
      c[key] = batch_loss_[i];
    }
    c["projection_bytes"] = weight_bytes_;
    c["projection_bytes_fp32"] = fp32_bytes_;
    c["bits_per_weight"] = 8.0 * weight_bytes_ / (fp32_bytes_ / 4.0);
  }

  std::string detail() override {
    return "corpus " + p_.model->corpus.source + " sha256 " + p_.model->corpus.sha256 +
           "; calibration rows per projection: " + std::to_string(p_.model->calib_rows);
  }

 private:
  const ModelQuantProblem& p_;
  Device& dev_;
  std::vector<float> params_;
  std::unique_ptr<model::Trainer> trainer_;
  double loss_ = NAN, weight_rel_l2_ = 0, weight_bytes_ = 0, fp32_bytes_ = 0;
  std::vector<double> batch_loss_;
};

std::string fmt(const char* f, double a, double b = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

const Record* find(const std::vector<Record>& recs, const std::string& impl, const std::string& format) {
  for (const auto& r : recs)
    if (r.technique == "quant_model" && r.impl == impl && r.status == "ok" && r.kase.params.value("format", "") == format)
      return &r;
  return nullptr;
}

// Perplexity change against fp32 with its uncertainty (two standard errors over the validation
// batches), or an error when the "quantized" weights are the fp32 weights: a quantizer that did nothing
// must not answer a claim about quantization.
struct Delta {
  double v = NAN, u = NAN;
  std::string error;
};
Delta delta_of(const Record& r) {
  Delta d;
  d.v = r.counter("perplexity_rel_delta", NAN);
  d.u = 2 * r.counter("perplexity_rel_delta_se", NAN);
  if (!(r.counter("rel_l2_err", 0) > 1e-9))
    d.error = r.impl + " " + r.kase.params.value("format", std::string()) +
              ": the quantized weights equal the fp32 weights (reconstruction error 0): nothing was quantized";
  return d;
}
std::string describe(const char* what, const Delta& d) {
  return std::string(what) + fmt(" %+.3f%% +- %.3f%%", 100 * d.v, 100 * d.u);
}
// A model shows quantization error when the change is positive beyond its uncertainty.
bool sensitive(const Delta& d) { return d.v - d.u > 0; }

// int8-lossless: "INT8 is nearly lossless": INT8 RTN's perplexity change against `band`. Only a model
// that reacts to quantization can show that INT8 does not: when the probe format (INT4 RTN) does not
// raise perplexity beyond its noise, the verdict is inconclusive.
ClaimResult check_int8_lossless(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  const std::string probe_format = spec.data.value("probe_format", "int4-g128");
  const Record* r = find(recs, "rtn", "int8");
  if (!r) return {"", "out_of_scope", "needs the int8 rtn case"};
  const Delta d = delta_of(*r);
  if (!d.error.empty()) return {"", "error", d.error};
  std::string measured = describe("int8 RTN perplexity vs fp32", d);
  std::string verdict = decide(d.v, d.u, band), note;
  if (const Record* probe = find(recs, "rtn", probe_format)) {
    const Delta p = delta_of(*probe);
    measured += "; " + describe((probe_format + " RTN").c_str(), p);
    if (!sensitive(p)) {
      verdict = "inconclusive";
      note = "; " + probe_format + " does not raise perplexity beyond its noise: the model is too small to show "
             "quantization error, so it cannot show that INT8 avoids it";
    }
  } else {
    verdict = "inconclusive";
    note = "; no " + probe_format + " RTN run to show the model reacts to quantization";
  }
  return {measured, verdict,
          "band " + band.str() + " +- 2 standard errors over the validation batches; per-channel absmax INT8 of every "
          "projection of the small trained byte-level model, no outlier decomposition" + note};
}

// int4-mmlu: "INT4 loses 0.5-1% on MMLU", answered with perplexity (no MMLU harness here): the best
// quantizer's perplexity change in the format against `band`; inconclusive while no quantizer raises
// perplexity beyond its noise (a model too small to show INT4's error).
ClaimResult check_int4_mmlu(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  const std::string format = spec.data.value("format", "int4-g128");
  std::string measured;
  Delta best;
  bool any_sensitive = false;
  for (const char* q : {"rtn", "gptq", "awq"})
    if (const Record* r = find(recs, q, format)) {
      const Delta d = delta_of(*r);
      if (!d.error.empty()) return {"", "error", d.error};
      measured += describe(q, d) + "; ";
      any_sensitive = any_sensitive || sensitive(d);
      if (std::isnan(best.v) || d.v < best.v) best = d;
    }
  if (measured.empty()) return {"", "out_of_scope", "needs " + format + " cases"};
  const std::string note = "perplexity, NOT MMLU accuracy (no MMLU harness here): the best quantizer's change against "
                           "band " + band.str() + " +- 2 standard errors; the sources report Llama-2-7B wikitext2 5.47 "
                           "-> 5.73 (RTN), 5.69 (GPTQ), 5.60 (AWQ)";
  if (!any_sensitive)
    return {format + " perplexity vs fp32: " + measured, "inconclusive",
            note + "; no quantizer raises perplexity beyond its noise: the model is too small to show INT4's error"};
  return {format + " perplexity vs fp32: " + measured, decide(best.v, best.u, band), note};
}

// awq-robust: "AWQ is more robust than GPTQ": per INT4 format, GPTQ's perplexity over AWQ's minus one,
// from the paired per-batch validation losses (+- 2 standard errors), against `band` (> 0: AWQ better).
ClaimResult check_awq_robust(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  std::string measured;
  std::vector<std::string> verdicts;
  for (const auto& r : recs) {
    if (r.technique != "quant_model" || r.impl != "awq" || r.status != "ok") continue;
    const std::string f = r.kase.params.value("format", "");
    if (f.rfind("int4", 0) != 0) continue;
    const Record* g = find(recs, "gptq", f);
    if (!g) continue;
    for (const Record* x : {&r, g})
      if (const Delta d = delta_of(*x); !d.error.empty()) return {"", "error", d.error};
    std::vector<double> diff;  // per batch: GPTQ's loss minus AWQ's
    for (const auto& [k, v] : r.counters)
      if (k.rfind("val_loss_batch_", 0) == 0 && g->counters.count(k)) diff.push_back(g->counters.at(k) - v);
    if (diff.size() < 2) return {"", "error", "awq-robust needs the per-batch validation losses (val_loss_batch_*)"};
    const double m = stats::mean(diff), se = stats::stddev(diff) / std::sqrt(static_cast<double>(diff.size()));
    const double v = std::exp(m) - 1, u = 2 * se * std::exp(m);
    const std::string verdict = decide(v, u, band);
    measured += f + fmt(": GPTQ/AWQ perplexity %+.3f%%", 100 * v) + fmt(" +- %.3f%% (", 100 * u) + verdict + "); ";
    verdicts.push_back(verdict);
  }
  if (verdicts.empty()) return {"", "out_of_scope", "needs gptq and awq runs of one INT4 format"};
  return {measured, combine_verdicts(verdicts),
          "band " + band.str() + " (above 0: AWQ better); paired over the validation batches; GPTQ here is not "
          "sequential (all layers calibrated on fp32 activations)"};
}

}  // namespace

void register_technique(Registry& r) {
  Technique t;
  t.name = "quant_model";
  t.schema.params = model::train_case_params();
  t.schema.params.push_back(int_param("calib_batches", "training batches whose projection inputs calibrate GPTQ/AWQ", 2));
  t.schema.params.push_back(text_param("format", "weight format of every projection (as in the quant suite)"));
  t.schema.metrics = {
      {"val_loss", "nats/byte", Better::lower, Gate::ratio, 1.01, 0, "validation loss with quantized projections"},
      {"perplexity", "1", Better::lower, Gate::ratio, 1.01, 0, "exp(val_loss)"},
      {"perplexity_fp32", "1", Better::none, Gate::report, 0, 0, "the fp32 model's"},
      {"perplexity_rel_delta", "1", Better::lower, Gate::report, 0, 0, "perplexity change against fp32"},
      {"perplexity_rel_delta_se", "1", Better::none, Gate::report, 0, 0,
       "its standard error over the validation batches (paired with fp32's)"},
      {"val_loss_batch_*", "nats/byte", Better::none, Gate::report, 0, 0, "validation loss of one batch"},
      {"projection_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "bytes of every quantized projection"},
      {"projection_bytes_fp32", "bytes", Better::none, Gate::report, 0, 0, "the same in fp32"},
      {"bits_per_weight", "bits", Better::lower, Gate::exact, 0, 0, "of the projections"},
  };
  // error() is the weights' relative L2 reconstruction error. RTN (the reference) rounds each weight to
  // the nearest code, so its error is bounded by the format's step: at most 0.5 for 4-bit formats on
  // Gaussian-like weights, a broken quantizer is far above; GPTQ and AWQ trade weight error for output
  // error and stay within 2x of RTN's.
  t.error_rule.judge = [](const Case&, const Problem&, const Impl& impl, const ErrorStats& e, const ErrorStats& ref) {
    if (!e.finite()) return Verdict{false, "non-finite loss"};
    const double bound = impl.role == Role::reference ? 0.5 : 2 * ref.rel_l2 + 1e-6;
    char buf[160];
    std::snprintf(buf, sizeof buf, "weight rel_l2 %.3e vs bound %.3e", e.rel_l2, bound);
    return Verdict{e.rel_l2 <= bound, buf};
  };
  t.description = "every projection of the trained small model quantized (RTN, GPTQ, AWQ): validation perplexity";
  t.validate = [](const Case& c) {
    parse_spec(c.text("format"));
    model::config_from_json(c.params);
  };
  t.prepare = prepare;
  for (const char* q : {"rtn", "gptq", "awq"}) {
    const std::string name = q;
    Impl i = typed_impl<ModelQuantProblem>(
        t.name, name, name == "rtn" ? Role::reference : Role::optimized, Backend::cpu,
        name + " on every projection; fp32 evaluation with the dequantized weights",
        [name](const ModelQuantProblem& prob, Device& dev) {
          return std::make_unique<ModelQuantWorkload>(prob, name, dev);
        });
    i.not_applicable = [name](const Case& c) {
      const Spec s = parse_spec(c.text("format"));
      return name == "gptq" && s.format == Format::nf4 && s.double_quant
                 ? std::string("GPTQ does not support nf4 double quantization")
                 : std::string();
    };
    t.impls.push_back(std::move(i));
  }
  t.claims["int8-lossless"] = check_int8_lossless;
  t.claims["int4-mmlu"] = check_int4_mmlu;
  t.claims["awq-robust"] = check_awq_robust;
  r.add(std::move(t));
}

}  // namespace memtrade::quant_model
