// The `quant_model` technique: the small model of impls/model, trained in fp32 on the fortunes corpus
// exactly as the precision suite's fp32 run trains it (same config, seed, batches), with every linear
// projection of every layer (q, k, v, o, gate, up, down) quantized by RTN, GPTQ or AWQ in one format;
// the embedding, the norms and lm_head stay fp32 (as GPTQ/AWQ leave embeddings and the head in fp16).
//
// Calibration: the inputs of each projection on `calib_batches` training batches, captured from the
// fp32 model (all layers from the unquantized model), or with `sequential` (GPTQ only) GPTQ's layer-by-layer
// pass: layer l's inputs from the model whose layers before l are already quantized.
// Figures: validation perplexity exp(mean loss) on `eval_batches` validation batches with the
// dequantized weights, against the fp32 model's. The timed call is that evaluation on the CPU with the
// dequantized fp32 weights, so time and memory of these cases describe the evaluation, not a quantized
// runtime (the `quant` suite measures the kernels).
//
// model = "smollm2" takes a pretrained model instead: SmolLM2-135M-Instruct from its GGUF file (every
// tensor dequantized to fp32: that model is the "fp32" reference, and its Q4_1/Q8_0 origin is why it
// is scored against itself, not against the original bf16 weights), its BPE tokenizer over the same
// fortunes corpus, split by tokens: calibration windows from the first 90%, validation windows from
// the last 10%. Its projections are quantized the same way (its tied embedding/lm_head stays fp32).
//
// Case parameters: model ("trained" or "smollm2"); for "trained" the model and training parameters of
// the precision suite (dim, layers, heads, kv_heads, ffn, context, batch, steps, lr, warmup_steps,
// seed); for "smollm2" batch (default 1) and seq (default 256) tokens per window; eval_batches,
// calib_batches, format, damp and sequential (GPTQ's), corpus_dir, corpus_sha256. Implementations: rtn (reference), gptq,
// gptq-act-order (GPTQ with its act_order option: columns by descending Hessian diagonal), awq, awq-clip
// (AWQ with its weight-clipping search on every projection but q and k, as llm-awq).
#include <cmath>
#include <mutex>

#include "datasets/corpus.hpp"
#include "harness/claims.hpp"
#include "harness/registry.hpp"
#include "harness/stats.hpp"
#include "model/gguf_model.hpp"
#include "model/train.hpp"
#include "model/train_case.hpp"
#include "impls/quant/quantizers.hpp"

namespace memtrade::quant_model {

using namespace memtrade::quant;

void register_technique(Registry& r);

namespace {

struct Trained {
  std::string model = "trained";  // or "smollm2"
  std::string source;             // what the model is, for the record's detail
  std::vector<int32_t> tokens;    // the tokenized corpus (pretrained models; empty: byte-level)
  std::size_t val_start = 0;      // first validation token
  model::Config cfg;
  model::TrainOptions opts;
  datasets::Corpus corpus;
  datasets::Split split;
  std::vector<float> params;
  std::vector<model::Trainer::LinearInputs> calib;  // per layer, concatenated over calibration batches
  std::vector<datasets::Batch> calib_batches;       // the batches they came from
  int64_t calib_rows = 0;
  double fp32_val_loss = 0;
  std::vector<double> fp32_batch_loss;  // per validation batch
  int64_t eval_batches = 0;
  uint64_t seed = 0;
};

datasets::Batch val_batch(const Trained& t, int64_t k) {
  if (!t.tokens.empty())
    return datasets::sample_batch(std::span<const int32_t>(t.tokens).subspan(t.val_start), t.opts.batch, t.opts.seq,
                                  t.seed + 1000, static_cast<uint64_t>(k));
  return datasets::sample_batch(t.split.val, t.opts.batch, t.opts.seq, t.seed + 1000, static_cast<uint64_t>(k));
}

// Calibration batch b: training text after the batches the model trained on (byte-level model), or
// windows of the first 90% of the tokens (pretrained model).
datasets::Batch calib_batch(const Trained& t, int64_t steps, int64_t b) {
  if (!t.tokens.empty())
    return datasets::sample_batch(std::span<const int32_t>(t.tokens).first(t.val_start), t.opts.batch, t.opts.seq,
                                  t.seed, static_cast<uint64_t>(b));
  return datasets::sample_batch(t.split.train, t.opts.batch, t.opts.seq, t.seed, static_cast<uint64_t>(steps + b));
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

// Captures the calibration inputs and the fp32 losses of the model in `t`.
void calibrate_and_score(Trained& t, int64_t steps, int64_t calib_batches) {
  auto dev = make_cpu_device();
  auto tr = model::make_trainer_cpu(t.cfg, t.opts, *dev, t.params);
  for (int64_t b = 0; b < calib_batches; ++b) {
    t.calib_batches.push_back(calib_batch(t, steps, b));
    const auto in = tr->linear_inputs(t.calib_batches.back());
    if (t.calib.empty()) t.calib.resize(in.size());
    for (std::size_t l = 0; l < in.size(); ++l)
      for (int k = 0; k < 4; ++k) t.calib[l][k].insert(t.calib[l][k].end(), in[l][k].begin(), in[l][k].end());
  }
  t.calib_rows = calib_batches * t.opts.batch * t.opts.seq;
  t.fp32_batch_loss = batch_losses(t, *tr);
  t.fp32_val_loss = mean(t.fp32_batch_loss);
}

// The fp32 model of the case's training parameters (trained), or the pretrained model with its tokenized
// corpus; made once per process for each set of parameters.
std::shared_ptr<const Trained> trained_model(const Case& c) {
  Json key = c.params;
  for (const char* k : {"format", "damp", "sequential"}) key.erase(k);
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Trained>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key.dump()); it != cache.end()) return it->second;
  auto t = std::make_shared<Trained>();
  const int64_t calib_batches = c.integer("calib_batches", 2);
  MT_CHECK(calib_batches > 0, "case " + c.id + ": calib_batches must be > 0");
  t->model = c.text("model", "trained");
  int64_t steps = 0;
  if (t->model == "smollm2") {
    model::PretrainedText d = model::load_smollm2_text(c);
    model::Pretrained& m = d.model;
    t->cfg = m.cfg;
    t->params = std::move(m.params);
    t->source = m.name + " (" + m.path.filename().string() + ", dequantized to fp32)";
    t->opts.batch = c.integer("batch", 1);
    t->opts.seq = c.integer("seq", 256);
    t->opts.inference_only = true;
    t->seed = static_cast<uint64_t>(c.integer("seed", 1));
    t->eval_batches = c.integer("eval_batches", 8);
    t->corpus = std::move(d.corpus);
    t->tokens = std::move(d.tokens);
    t->val_start = d.val_start;
    model::validate(t->cfg, t->opts);
  } else {
    const model::TrainCase tc = model::read_train_case(c);
    t->cfg = tc.cfg;
    t->opts = tc.opts;
    t->seed = tc.seed;
    t->eval_batches = tc.eval_batches;
    steps = tc.steps;
    t->corpus = model::load_case_corpus(tc);
    t->split = datasets::split(t->corpus);
    t->params = model::train_fp32(t->cfg, t->opts, t->split.train, steps, t->seed);
    t->source = "the precision suite's byte-level model trained in fp32 for " + std::to_string(steps) + " steps";
  }
  calibrate_and_score(*t, steps, calib_batches);
  cache[key.dump()] = t;
  return t;
}

struct ModelQuantProblem final : Problem {
  std::shared_ptr<const Trained> model;
  Spec spec;
  GptqOptions gptq;  // damp from the case; act_order per implementation
  bool sequential = false;  // GPTQ: layer l calibrated on the inputs of the model with layers < l quantized
};

std::unique_ptr<Problem> prepare(const Case& c) {
  auto p = std::make_unique<ModelQuantProblem>();
  p->spec = parse_spec(c.text("format"));
  if (c.params.contains("damp")) p->gptq.damp = c.params["damp"].get<double>();
  p->sequential = c.flag("sequential", false);
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
    const bool sequential = p.sequential && quantizer.starts_with("gptq");
    // Sequential: layer l's inputs from the model whose layers before l are already quantized (params_), as
    // GPTQ's and AutoGPTQ's layer-by-layer pass takes them; the first layer's are the fp32 model's. Each
    // calibration batch's residual stream is carried from layer to layer through the quantized layers, on a
    // device of its own, outside the tracked one.
    const std::unique_ptr<Device> host = sequential ? make_cpu_device() : nullptr;
    std::unique_ptr<model::Trainer> calib;
    std::vector<std::vector<float>> stream(t.calib_batches.size());
    if (sequential) calib = model::make_trainer_cpu(t.cfg, t.opts, *host, params_);
    for (std::size_t l = 0; l < L.layer.size(); ++l) {
      const auto& P = L.layer[l];
      model::Trainer::LinearInputs seq;
      if (sequential && l > 0) {
        calib->set_trainable(params_);  // layer l - 1 quantized
        for (std::size_t i = 0; i < stream.size(); ++i) {
          const datasets::Batch& b = t.calib_batches[i];
          calib->advance_layer(b, static_cast<int64_t>(l) - 1, stream[i]);
          auto in = calib->layer_linear_inputs(b, static_cast<int64_t>(l), stream[i]);
          for (int k = 0; k < 4; ++k) seq[k].insert(seq[k].end(), in[k].begin(), in[k].end());
        }
      }
      const auto& in = sequential && l > 0 ? seq : t.calib[l];
      // (offset, out rows, in cols, calibration input index)
      const std::tuple<int64_t, int64_t, int64_t, int> projections[] = {
          {P.wq, D, D, 0}, {P.wk, KV, D, 0}, {P.wv, KV, D, 0}, {P.wo, D, D, 1},
          {P.wg, F, D, 2}, {P.wu, F, D, 2},  {P.wd, D, F, 3}};
      for (const auto& [off, n, k, x] : projections) {
        const float* w = t.params.data() + off;
        const float* X = in[x].data();
        // awq-clip: llm-awq's clipping search on every projection but q and k (their product, not each
        // output, is what attention sees)
        const QuantResult q = quantize_named(quantizer, p.spec, w, n, k, X, t.calib_rows, p.gptq, off != P.wq && off != P.wk);
        std::copy(q.deq.begin(), q.deq.end(), params_.begin() + off);
        for (int64_t i = 0; i < n * k; ++i) {
          num += std::pow(static_cast<double>(q.deq[i]) - w[i], 2);
          den += std::pow(static_cast<double>(w[i]), 2);
        }
        weight_bytes_ += static_cast<double>(layout(p.spec, n, k).total_bytes());
        fp32_bytes_ += 4.0 * static_cast<double>(n * k);
      }
    }
    other_params_ = static_cast<double>(L.total) - fp32_bytes_ / 4.0;
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
    // The whole model as GPTQ/AWQ checkpoints store it: quantized projections, everything else fp16.
    c["model_bytes"] = weight_bytes_ + 2.0 * other_params_;
    c["model_bytes_fp16"] = 2.0 * (fp32_bytes_ / 4.0 + other_params_);
  }

  std::string detail() override {
    return p_.model->source + "; corpus " + p_.model->corpus.source + " sha256 " + p_.model->corpus.sha256 +
           (p_.model->tokens.empty() ? std::string()
                                     : " (" + std::to_string(p_.model->tokens.size()) + " tokens, validation from token " +
                                           std::to_string(p_.model->val_start) + ")") +
           "; calibration rows per projection: " + std::to_string(p_.model->calib_rows);
  }

 private:
  const ModelQuantProblem& p_;
  Device& dev_;
  std::vector<float> params_;
  std::unique_ptr<model::Trainer> trainer_;
  double loss_ = NAN, weight_rel_l2_ = 0, weight_bytes_ = 0, fp32_bytes_ = 0, other_params_ = 0;
  std::vector<double> batch_loss_;
};

std::string model_of(const Record& r) { return r.kase.params.value("model", std::string("trained")); }

// The model the claims are answered on: the pretrained one when the run has it (a model with the
// outlier features of the LLMs the claims are about), else the trained small model.
std::string claim_model(const std::vector<Record>& recs) {
  for (const auto& r : recs)
    if (r.technique == "quant_model" && r.status == "ok" && model_of(r) == "smollm2") return "smollm2";
  return "trained";
}
std::string model_text(const std::string& m) {
  return m == "smollm2" ? "SmolLM2-135M-Instruct (pretrained, from its GGUF file)"
                        : "the small byte-level model the precision suite trains";
}

// The run's record of (impl, format) on the claim's model; of a GPTQ variant run both ways, the sequential one
// (GPTQ's own layer-by-layer calibration).
const Record* find(const std::vector<Record>& recs, const std::string& impl, const std::string& format) {
  const std::string m = claim_model(recs);
  const Record* found = nullptr;
  for (const auto& r : recs)
    if (r.technique == "quant_model" && r.impl == impl && r.status == "ok" &&
        r.kase.params.value("format", "") == format && model_of(r) == m &&
        (!found || (!found->kase.params.value("sequential", false) && r.kase.params.value("sequential", false))))
      found = &r;
  return found;
}

// " (sequential)" for a GPTQ record calibrated layer by layer, for the claims' measured text.
std::string sequential_note(const Record& r) {
  return r.kase.params.value("sequential", false) ? " (sequential)" : "";
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
          "projection of " + model_text(claim_model(recs)) + ", no outlier decomposition" + note};
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
  for (const char* q : {"rtn", "gptq", "gptq-act-order", "awq"})
    if (const Record* r = find(recs, q, format)) {
      const Delta d = delta_of(*r);
      if (!d.error.empty()) return {"", "error", d.error};
      measured += describe((q + sequential_note(*r)).c_str(), d) + "; ";
      any_sensitive = any_sensitive || sensitive(d);
      if (std::isnan(best.v) || d.v < best.v) best = d;
    }
  if (measured.empty()) return {"", "out_of_scope", "needs " + format + " cases"};
  const std::string note = "perplexity, NOT MMLU accuracy (no MMLU harness here): the best quantizer's change against "
                           "band " + band.str() + " +- 2 standard errors, on " + model_text(claim_model(recs)) +
                           "; the sources report Llama-2-7B wikitext2 5.47 -> 5.73 (RTN, +4.8%), 5.69 (GPTQ, +4.0%), "
                           "5.60 (AWQ, +2.4%)";
  if (!any_sensitive)
    return {format + " perplexity vs fp32: " + measured, "inconclusive",
            note + "; no quantizer raises perplexity beyond its noise: the model is too small to show INT4's error"};
  return {format + " perplexity vs fp32: " + measured, decide(best.v, best.u, band), note};
}

// awq-robust: "AWQ is more robust than GPTQ": per INT4 format and GPTQ variant present (gptq, and
// gptq-act-order: GPTQ with its act_order option), GPTQ's perplexity over AWQ's minus one, from the paired
// per-batch validation losses (+- 2 standard errors), against `band` (> 0: AWQ better).
ClaimResult check_awq_robust(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  std::string measured;
  std::vector<std::string> verdicts;
  for (const auto& r : recs) {
    if (r.technique != "quant_model" || r.impl != "awq" || r.status != "ok" || model_of(r) != claim_model(recs)) continue;
    const std::string f = r.kase.params.value("format", "");
    if (f.rfind("int4", 0) != 0) continue;
    for (const char* variant : {"gptq", "gptq-act-order"}) {
      const Record* g = find(recs, variant, f);
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
      measured += f + ": " + (g->impl == "gptq" ? "GPTQ" : "GPTQ act_order") + sequential_note(*g) +
                  fmt("/AWQ perplexity %+.3f%%", 100 * v) + fmt(" +- %.3f%% (", 100 * u) + verdict + "); ";
      verdicts.push_back(verdict);
    }
  }
  if (verdicts.empty()) return {"", "out_of_scope", "needs gptq and awq runs of one INT4 format"};
  return {measured, combine_verdicts(verdicts),
          "band " + band.str() + " (above 0: AWQ better); paired over the validation batches of " +
              model_text(claim_model(recs)) + "; GPTQ calibrated layer by layer where the run has sequential cases, "
              "otherwise every layer on the fp32 model's activations"};
}

}  // namespace

void register_technique(Registry& r) {
  Technique t;
  t.name = "quant_model";
  t.schema.params = {text_param("model", "the model: \"trained\" (the precision suite's byte-level model) or \"smollm2\" "
                                         "(SmolLM2-135M-Instruct from its GGUF file)", "trained", {"trained", "smollm2"})};
  // The training keys a trained model needs are required only for it; smollm2 reads batch (1) and seq (256).
  for (Param p : model::train_case_params()) {
    if (p.fallback.is_null()) p.fallback = required_when("model", "trained");
    t.schema.params.push_back(std::move(p));
  }
  t.schema.params.push_back(int_param("calib_batches", "training batches whose projection inputs calibrate GPTQ/AWQ", 2));
  t.schema.params.push_back(text_param("format", "weight format of every projection (as in the quant suite)"));
  t.schema.params.push_back(num_param("damp", "GPTQ: the Hessian's dampening, a share of its mean diagonal", 0.01, 0));
  t.schema.params.push_back(bool_param("sequential",
                                       "GPTQ: calibrate layer l on the inputs of the model whose earlier layers are "
                                       "already quantized (GPTQ's layer-by-layer pass); false: every layer on the fp32 "
                                       "model's inputs",
                                       false));
  t.schema.metrics = {
      {"val_loss", "nats/token", Better::lower, Gate::ratio, 1.01, 0,
       "validation loss with quantized projections (the trained model's tokens are bytes)"},
      {"perplexity", "1", Better::lower, Gate::ratio, 1.01, 0, "exp(val_loss)"},
      {"perplexity_fp32", "1", Better::none, Gate::report, 0, 0, "the fp32 model's"},
      {"perplexity_rel_delta", "1", Better::lower, Gate::report, 0, 0, "perplexity change against fp32"},
      {"perplexity_rel_delta_se", "1", Better::none, Gate::report, 0, 0,
       "its standard error over the validation batches (paired with fp32's)"},
      {"val_loss_batch_*", "nats/token", Better::none, Gate::report, 0, 0, "validation loss of one batch"},
      {"projection_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "bytes of every quantized projection"},
      {"projection_bytes_fp32", "bytes", Better::none, Gate::report, 0, 0, "the same in fp32"},
      {"bits_per_weight", "bits", Better::lower, Gate::exact, 0, 0, "of the projections"},
      {"model_bytes", "bytes", Better::lower, Gate::exact, 0, 0,
       "the whole model: quantized projections, the embedding, lm_head and norms in fp16"},
      {"model_bytes_fp16", "bytes", Better::none, Gate::report, 0, 0, "the whole model in fp16"},
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
  t.description = "every projection of the trained small model or of SmolLM2-135M quantized (RTN, GPTQ, GPTQ act_order, AWQ, "
                  "AWQ with clipping): "
                  "validation perplexity";
  t.validate = [](const Case& c) {
    parse_spec(c.text("format"));
    if (c.text("model", "trained") == "trained") model::config_from_json(c.params);
  };
  t.prepare = prepare;
  for (const char* q : kQuantizers) {
    const std::string name = q;
    const std::string what =
        name == "gptq-act-order" ? "gptq with act_order (columns by descending Hessian diagonal, groups fitted first)"
        : name == "awq-clip"     ? "awq with its weight-clipping search (not on q and k)"
                                 : name;
    Impl i = typed_impl<ModelQuantProblem>(
        t.name, name, name == "rtn" ? Role::reference : Role::optimized, Backend::cpu,
        what + " on every projection; fp32 evaluation with the dequantized weights",
        [name](const ModelQuantProblem& prob, Device& dev) {
          return std::make_unique<ModelQuantWorkload>(prob, name, dev);
        });
    i.not_applicable = [name](const Case& c) {
      const Spec s = parse_spec(c.text("format"));
      if (name.starts_with("gptq") && s.format == Format::nf4 && s.double_quant)
        return std::string("GPTQ does not support nf4 double quantization");
      if (name == "awq-clip" && !awq_clip_applies(s))
        return "AWQ's clipping search is for the group-wise 4-bit formats, not " + spec_name(s);
      if (!name.starts_with("gptq") && c.flag("sequential", false))
        return "sequential calibration is GPTQ's; " + name + " is the same as without it";
      return std::string();
    };
    t.impls.push_back(std::move(i));
  }
  t.claims["int8-lossless"] = check_int8_lossless;
  t.claims["int4-mmlu"] = check_int4_mmlu;
  t.claims["awq-robust"] = check_awq_robust;
  // The same claims answered on the pretrained model (suite quant_model_smollm2).
  t.claims["int8-lossless-smollm2"] = check_int8_lossless;
  t.claims["int4-mmlu-smollm2"] = check_int4_mmlu;
  t.claims["awq-robust-smollm2"] = check_awq_robust;
  r.add(std::move(t));
}

}  // namespace memtrade::quant_model
