// The `precision` technique: the model of model/ trained for N steps under each precision policy
// from the same initialization and data (byte-level language modelling on the fortunes corpus).
//
// Per case and policy the workload, when it is made:
//   1. computes the gradient of one batch at the initial weights and compares it with the float64
//      reference step's gradient (the case's error figures: rel_l2_err etc.);
//   2. trains `steps` optimizer steps and evaluates the validation loss; records the loss curve, the
//      loss-scale trajectory, skipped steps and the fp16 underflow fraction of the weight gradients.
//      A run whose loss turns non-finite stops there and is recorded as diverged (not an error).
// Its run() (what is timed and memory-measured) is one further optimizer step: peak bytes per tag and
// tokens/s are those of a training step.
//
// Case parameters: the model config (dim, layers, heads, kv_heads, ffn, context; see model.hpp), batch,
// steps, lr, warmup_steps, weight_decay, eval_batches, seed, growth_interval (loss scaler), and
// optionally corpus_sha256 (the run fails with a clear error if the installed corpus differs).
#include <cmath>
#include <optional>

#include "datasets/corpus.hpp"
#include "harness/claims.hpp"
#include "harness/stats.hpp"
#include "model/train.hpp"
#include "model/train_bench.hpp"
#include "model/train_case.hpp"
#include "precision/policies.hpp"

namespace memtrade::precision {

void register_technique(Registry& r);

namespace {

using model::TrainCase;

struct PrecisionProblem final : Problem {
  TrainCase tc;
  datasets::Corpus corpus;
  datasets::Split split;
  std::vector<float> init;
  datasets::Batch probe;
  std::vector<double> oracle_grad;            // float64 gradient of `probe` at `init`
  // The fp32 policy's validation loss per backend, once it has run (it is registered first).
  mutable std::map<Backend, double> fp32_val;

  datasets::Batch train_batch(int64_t step) const {
    return datasets::sample_batch(split.train, tc.opts.batch, tc.opts.seq, tc.seed, static_cast<uint64_t>(step));
  }
  datasets::Batch val_batch(int64_t k) const {
    return datasets::sample_batch(split.val, tc.opts.batch, tc.opts.seq, tc.seed + 1000, static_cast<uint64_t>(k));
  }
};

std::unique_ptr<Problem> prepare(const Case& c) {
  auto p = std::make_unique<PrecisionProblem>();
  p->tc = model::read_train_case(c);
  p->corpus = model::load_case_corpus(p->tc);
  p->split = datasets::split(p->corpus);
  p->init = model::init_params(p->tc.cfg, p->tc.seed);
  p->probe = p->train_batch(0);
  auto dev = make_cpu_device();
  model::TrainOptions o = p->tc.opts;
  o.float64 = true;
  p->oracle_grad = model::make_trainer_cpu(p->tc.cfg, o, *dev, p->init)->gradients(p->probe);
  return p;
}

class TrainWorkload final : public Workload {
 public:
  TrainWorkload(const PrecisionProblem& p, Policy policy, Device& dev) : p_(p), policy_(policy), dev_(dev) {
    model::TrainOptions o = p.tc.opts;
    o.policy = policy;
    trainer_ = dev.backend() == Backend::cpu ? model::make_trainer_cpu(p.tc.cfg, o, dev, p.init)
                                             : model::make_trainer_cuda(p.tc.cfg, o, dev, p.init);
    const auto g = trainer_->gradients(p.probe);
    err_ = error_stats(g, p.oracle_grad);
    train();
  }

  void run() override {
    const datasets::Batch micro[] = {p_.train_batch(next_++)};
    trainer_->step(micro);
  }

  ErrorStats error() override { return err_; }

  Work work() const override {
    Work w;
    const double tokens = static_cast<double>(p_.tc.opts.batch * p_.tc.opts.seq);
    w.flops = model::train_flops_per_token(p_.tc.cfg, p_.tc.opts.seq) * tokens;
    // The CPU runs every GEMM in fp32 (16-bit operands are widened); cuBLAS takes the compute dtype.
    w.gemm_dtype = dev_.backend() == Backend::cpu ? "fp32" : dtype_name(traits(policy_).compute);
    w.items = tokens;
    w.item_unit = "tokens";
    return w;
  }

  void add_counters(std::map<std::string, double>& c) override {
    for (const auto& [k, v] : counters_) c[k] = v;
    const auto& pool = dev_.memory();
    const double state = static_cast<double>(pool.by_tag(Tag::weights).live + pool.by_tag(Tag::grads).live +
                                             pool.by_tag(Tag::master).live + pool.by_tag(Tag::optimizer).live);
    c["model_state_bytes_per_param"] = state / static_cast<double>(model::param_layout(p_.tc.cfg).total);
  }

  std::string detail() override {
    return "corpus " + p_.corpus.source + " sha256 " + p_.corpus.sha256 + "; " + std::to_string(p_.tc.steps) +
           " steps of " + std::to_string(p_.tc.opts.batch) + "x" + std::to_string(p_.tc.opts.seq) + " tokens";
  }

 private:
  void train() {
    const int64_t steps = p_.tc.steps;
    const int64_t every = std::max<int64_t>(1, steps / 40);
    int64_t nonzero = 0, under = 0, applied_non_finite = 0;
    double first = NAN, last = NAN;
    std::optional<int64_t> diverged;
    float min_scale = trainer_->scaler().scale();
    for (int64_t s = 0; s < steps; ++s) {
      const datasets::Batch micro[] = {p_.train_batch(s)};
      const model::StepStats st = trainer_->step(micro);
      nonzero += st.grad_nonzero;
      under += st.grad_underflow_fp16;
      if (st.non_finite && st.applied) ++applied_non_finite;
      min_scale = std::min(min_scale, st.loss_scale);
      if (s == 0) first = st.loss;
      last = st.loss;
      if (s % every == 0 || s == steps - 1) {
        char key[64];
        std::snprintf(key, sizeof key, "curve_loss_step_%05lld", static_cast<long long>(s));
        if (std::isfinite(st.loss)) counters_[key] = st.loss;
        std::snprintf(key, sizeof key, "curve_scale_step_%05lld", static_cast<long long>(s));
        counters_[key] = st.loss_scale;
      }
      if (!std::isfinite(st.loss)) {
        diverged = s;
        break;
      }
    }
    next_ = steps;
    const auto& sc = trainer_->scaler();
    counters_["steps"] = static_cast<double>(steps);
    counters_["params"] = static_cast<double>(model::param_layout(p_.tc.cfg).total);
    counters_["skipped_steps"] = static_cast<double>(sc.skipped_steps());
    counters_["non_finite_steps_applied"] = static_cast<double>(applied_non_finite);
    counters_["loss_scale_final"] = sc.scale();
    counters_["loss_scale_min"] = min_scale;
    counters_["grad_underflow_fp16"] = nonzero > 0 ? static_cast<double>(under) / static_cast<double>(nonzero) : 0.0;
    counters_["diverged"] = diverged ? 1.0 : 0.0;
    if (diverged) counters_["diverged_at_step"] = static_cast<double>(*diverged);
    if (std::isfinite(first)) counters_["train_loss_first"] = first;
    if (std::isfinite(last)) counters_["train_loss_last"] = last;
    if (diverged) return;
    double val = 0;
    for (int64_t k = 0; k < p_.tc.eval_batches; ++k) val += trainer_->eval_loss(p_.val_batch(k));
    val /= static_cast<double>(p_.tc.eval_batches);
    if (!std::isfinite(val)) {
      counters_["diverged"] = 1.0;
      return;
    }
    counters_["val_loss"] = val;
    if (policy_ == Policy::fp32) p_.fp32_val[dev_.backend()] = val;
    if (const auto it = p_.fp32_val.find(dev_.backend()); it != p_.fp32_val.end()) {
      counters_["val_loss_delta_vs_fp32"] = val - it->second;
      counters_["val_loss_rel_delta_vs_fp32"] = (val - it->second) / it->second;
      if (policy_ != Policy::fp32) counters_["val_loss_vs_fp32"] = val / it->second;
    }
  }

  const PrecisionProblem& p_;
  const Policy policy_;
  Device& dev_;
  std::unique_ptr<model::Trainer> trainer_;
  ErrorStats err_;
  std::map<std::string, double> counters_;
  int64_t next_ = 0;
};

// The ok record of a policy at the largest model (most parameters) the run has for it; among equal
// models, the one whose step keeps the most activation bytes (the longest context), where the claims
// about activations are claimed to hold.
const Record* policy_record(const std::vector<Record>& recs, const char* policy) {
  const Record* best = nullptr;
  auto key = [](const Record& r) { return std::pair(r.counter("params"), r.counter("peak_bytes_activations")); };
  for (const auto& r : recs)
    if (r.impl == policy && r.status == "ok" && (!best || key(r) > key(*best))) best = &r;
  return best;
}

double state_bytes(const Record& r) {
  return r.counter("peak_bytes_weights") + r.counter("peak_bytes_grads") + r.counter("peak_bytes_master") +
         r.counter("peak_bytes_optimizer");
}

// Model state plus activations: what the training step itself must hold. The CPU backend's GEMM staging
// buffers (16-bit operands widened to fp32; tag workspace) are left out: a GPU reads 16-bit operands
// directly. Each tag's own peak; the state tags are constant during a step.
double state_and_activations(const Record& r) { return state_bytes(r) + r.counter("peak_bytes_activations"); }

// mp-half: "mixed precision halves memory": model state plus activations of bf16-mixed over fp32's
// (exact tracked bytes), decided against the band.
ClaimResult check_mp_half(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  const Record* f = policy_record(recs, "fp32");
  const Record* m = f ? same_case(recs, *f, "bf16-mixed") : nullptr;
  if (!f || !m) return {"", "out_of_scope", "needs fp32 and bf16-mixed runs of one case"};
  const double both = state_and_activations(*m) / state_and_activations(*f);
  const double act = m->counter("peak_bytes_activations") / f->counter("peak_bytes_activations");
  const double state = state_bytes(*m) / state_bytes(*f);
  const double act_share = f->counter("peak_bytes_activations") / state_and_activations(*f);
  return {fmt("bf16-mixed/fp32: state + activations %.2f (activations %.2f, model state %.2f), ", both, act, state) +
              fmt("whole peak %.2f; activations are %.0f%% of fp32's state + activations",
                  m->counter("peak_bytes") / f->counter("peak_bytes"), 100 * act_share),
          decide(both, 0, band),
          "case " + f->kase.id + "; band " + band.str() + "; the saving is the activations' share times one half: model "
          "state stays 16 B/param (the fp32 master copy adds back what the 16-bit weights save). The whole peak also "
          "holds the CPU's fp32 staging of 16-bit GEMM operands, which a GPU does not need"};
}

// mp-16B: model-state bytes per parameter of the mixed policies, from the tracked allocator (exact).
ClaimResult check_mp_16b(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  std::string measured;
  std::vector<std::string> verdicts;
  for (const char* p : {"fp32", "bf16-mixed", "fp16-mixed", "bf16-pure"}) {
    const Record* r = policy_record(recs, p);
    if (!r) continue;
    const double b = r->counter("model_state_bytes_per_param");
    measured += std::string(p) + fmt(" %.2f B/param; ", b);
    if (std::string(p) == "bf16-mixed" || std::string(p) == "fp16-mixed") verdicts.push_back(decide(b, 0, band));
  }
  if (verdicts.empty()) return {measured, "out_of_scope", "no mixed-precision run"};
  return {measured, combine_verdicts(verdicts),
          "weights + grads + master + moments live bytes / parameters (ZeRO's 2 + 2 + 12); band " + band.str()};
}

// mp-40: the saving of bf16-mixed over fp32 in model state plus activations (exact).
ClaimResult check_mp_40(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  const Record* f = policy_record(recs, "fp32");
  const Record* m = f ? same_case(recs, *f, "bf16-mixed") : nullptr;
  if (!f || !m) return {"", "out_of_scope", "needs fp32 and bf16-mixed runs of one case"};
  const double saving = 1.0 - state_and_activations(*m) / state_and_activations(*f);
  const double act_share = f->counter("peak_bytes_activations") / state_and_activations(*f);
  return {fmt("saving %.0f%% of state + activations, with activations %.0f%% of fp32's", 100 * saving, 100 * act_share),
          decide(saving, 0, band),
          "case " + f->kase.id + "; band " + band.str() + "; model state saves 0% (16 B/param either way), so the "
          "saving is half the activation share: ~40% needs activations near 80% of memory (long sequences, large "
          "batches)"};
}

// fp16-range: "FP16 needs loss scaling, BF16 does not". Two quantities, each +- `noise` (the spread of
// validation loss between runs that differ only in rounding): how much worse fp16 without scaling ends
// than fp16 with dynamic scaling (relative validation loss; `needs_band`, e.g. >= 2%: training needs the
// scaling), and bf16-mixed's validation loss relative to fp32 (`band`, e.g. within 2%: bf16 does not).
// The claim is only testable where fp16's range is exercised: when fewer than `min_underflow` of the
// unscaled run's nonzero weight-gradient values underflow in fp16, the verdict is inconclusive.
ClaimResult check_fp16_range(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band bf16_band = claim_band(spec), needs_band = claim_band(spec, "needs_band");
  const double noise = spec.data.value("noise", 0.005), min_underflow = spec.data.value("min_underflow", 0.01);
  const Record* f = policy_record(recs, "fp32");
  if (!f) return {"", "out_of_scope", "needs an fp32 run"};
  const Record* n = same_case(recs, *f, "fp16-mixed-noscale");
  const Record* s = same_case(recs, *f, "fp16-mixed");
  const Record* b = same_case(recs, *f, "bf16-mixed");
  if (!n || !s || !b) return {"", "out_of_scope", "needs fp16-mixed, fp16-mixed-noscale and bf16-mixed runs"};
  auto val = [](const Record* r) { return r->counter("diverged") > 0 ? INFINITY : r->counter("val_loss", INFINITY); };
  const double excess = (val(n) - val(s)) / val(s);  // +inf when unscaled fp16 diverged
  const double bf16 = (val(b) - val(f)) / val(f);
  const double un = n->counter("grad_underflow_fp16"), us = s->counter("grad_underflow_fp16");
  std::string verdict = combine_verdicts({decide(excess, noise, needs_band), decide(bf16, noise, bf16_band)});
  std::string why;
  if (un < min_underflow) {
    verdict = "inconclusive";
    why = fmt("; only %.2g%% of the unscaled run's gradient values underflow (< %.2g%%): this model does not exercise "
              "fp16's range",
              100 * un, 100 * min_underflow);
  }
  return {fmt("fp16 without scaling ends %+.2f%% from fp16 with scaling; bf16-mixed %+.2f%% from fp32; ", 100 * excess,
              100 * bf16) +
              fmt("underflow: unscaled %.2e, scaled %.2e of nonzero weight-gradient values", un, us) +
              fmt(" (%.0f skipped steps)", s->counter("skipped_steps")),
          verdict,
          "case " + f->kase.id + "; needs scaling: excess " + needs_band.str() + ", bf16 " + bf16_band.str() + fmt(", each +- %.2g", noise) + why};
}

}  // namespace

void register_technique(Registry& r) {
  Technique t;
  t.name = "precision";
  t.description = "training under fp32, bf16-mixed, fp16-mixed (dynamic loss scaling), fp16-mixed-noscale, bf16-pure";
  t.validate = [](const Case& c) { model::read_train_case(c); };
  t.schema.params = model::train_case_params();
  t.schema.metrics = {
      {"steps", "1", Better::none, Gate::report, 0, 0, "optimizer steps trained"},
      {"params", "1", Better::none, Gate::exact, 0, 0, "model parameters"},
      {"model_state_bytes_per_param", "bytes", Better::lower, Gate::exact, 0, 0,
       "weights + master + grads + optimizer state, per parameter"},
      // 1.05: a training trajectory follows its rounding, and equally valid summation orders (OpenBLAS's
      // kernel set, the thread count) moved the lora quick run's validation losses by up to 4.2% (full:
      // 2.432 to 2.524) over the configurations the next rule lists; a broken or diverging run is far outside
      // it (and `diverged` gates at zero).
      {"val_loss", "nats/byte", Better::lower, Gate::ratio, 1.05, 0, "validation loss after training"},
      // The policy against the same run's fp32, tighter than val_loss's 1.05: over OpenBLAS's SkylakeX, Haswell
      // and Prescott kernels, 1 or 2 threads, AVX-512 or AVX2, this ratio moved by at most 1.5% (bf16-pure).
      {"val_loss_vs_fp32", "1", Better::lower, Gate::ratio, 1.03, 0, "val_loss over the same run's fp32 val_loss"},
      {"val_loss_delta_vs_fp32", "nats/byte", Better::lower, Gate::report, 0, 0, "val_loss minus fp32's"},
      {"val_loss_rel_delta_vs_fp32", "1", Better::lower, Gate::report, 0, 0, "that difference relative to fp32"},
      {"train_loss_first", "nats/byte", Better::none, Gate::report, 0, 0, "loss of the first step"},
      {"train_loss_last", "nats/byte", Better::lower, Gate::report, 0, 0, "loss of the last step"},
      {"diverged", "1", Better::lower, Gate::zero, 0, 0, "1 when the loss turned non-finite"},
      {"diverged_at_step", "step", Better::none, Gate::report, 0, 0, "where it did"},
      {"non_finite_steps_applied", "1", Better::lower, Gate::zero, 0, 0, "updates applied with a non-finite gradient"},
      {"skipped_steps", "1", Better::lower, Gate::report, 0, 0, "steps the loss scaler skipped"},
      {"loss_scale_final", "1", Better::none, Gate::report, 0, 0, "loss scale after training"},
      {"loss_scale_min", "1", Better::none, Gate::report, 0, 0, "smallest loss scale used"},
      {"grad_underflow_fp16", "1", Better::lower, Gate::report, 0, 0,
       "fraction of nonzero weight gradients that round to zero in fp16"},
      {"curve_loss_step_*", "nats/byte", Better::none, Gate::report, 0, 0, "training-loss curve (40 points)"},
      {"curve_scale_step_*", "1", Better::none, Gate::report, 0, 0, "loss-scale curve"},
  };
  // The gradient of one step against the float64 step: a policy's error follows its compute dtype, so
  // each policy is bounded by a multiple of that dtype's unit roundoff (not by the fp32 reference).
  t.error_rule.judge = [](const Case&, const Problem&, const Impl& impl, const ErrorStats& e, const ErrorStats&) {
    return model::gradient_verdict(parse_policy(impl.name), e);
  };
  t.prepare = prepare;
  for (Backend be : {Backend::cpu, Backend::cuda})
    for (Policy p : all_policies)
      t.impls.push_back(typed_impl<PrecisionProblem>(
          t.name, policy_name(p), p == Policy::fp32 ? Role::reference : Role::optimized, be,
          std::string(be == Backend::cpu ? "CPU" : "CUDA") + " training step, policy " + policy_name(p),
          [p](const PrecisionProblem& prob, Device& dev) { return std::make_unique<TrainWorkload>(prob, p, dev); }));
  t.claims["mp-half"] = check_mp_half;
  t.claims["mp-16B"] = check_mp_16b;
  t.claims["mp-40"] = check_mp_40;
  t.claims["fp16-range"] = check_fp16_range;
  r.add(std::move(t));
}

}  // namespace memtrade::precision
