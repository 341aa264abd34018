#include "model/train_bench.hpp"

#include <cmath>
#include <cstdio>

#include "model/layers.hpp"

namespace memtrade::model {

std::vector<Param> train_bench_params() {
  auto p = train_case_params();
  std::vector<Json> policies;
  for (precision::Policy x : precision::all_policies) policies.emplace_back(precision::policy_name(x));
  p.push_back(text_param("policy", "precision policy of the training step", "fp32", policies));
  p.push_back(int_param("accum", "micro-batches per optimizer step (gradient accumulation)", 1, 1));
  p.push_back(num_param("pad", "padding: micro-batch i of k ignores the last pad*seq*i/(k-1) targets per sequence", 0.0,
                        0, 1));
  p.push_back(int_param("pretrain_steps",
                        "> 0: fine-tuning: fp32 pretraining steps on the training split first, then the implementations "
                        "train on held-out text (the validation split in 4 KiB blocks, every fifth validating)",
                        0, 0));
  p.push_back(num_param("ft_lr", "fine-tuning learning rate (0: lr)", 0.0, 0));
  return p;
}

Param checkpoint_param() {
  return text_param("checkpoint", "activation checkpointing policy of every implementation", "none",
                    {"none", "full", "every-k", "selective"});
}

std::vector<Metric> train_bench_metrics(bool grads_bit_identical) {
  const Gate diff = grads_bit_identical ? Gate::zero : Gate::report;
  std::vector<Metric> m = {
      {"steps", "1", Better::none, Gate::report, 0, 0, "optimizer steps trained before the timed step"},
      {"params", "1", Better::none, Gate::exact, 0, 0, "model parameters"},
      {"trainable_params", "1", Better::none, Gate::exact, 0, 0, "parameters the optimizer updates (LoRA: the adapters)"},
      {"trainable_fraction", "1", Better::none, Gate::exact, 0, 0, "trainable_params / params"},
      {"tokens_per_step", "tokens", Better::none, Gate::exact, 0, 0, "counted targets of the timed step"},
      {"model_state_bytes_per_param", "bytes", Better::lower, Gate::exact, 0, 0,
       "weights + master + grads + optimizer state on the device between steps, per parameter"},
      {"host_model_state_bytes_per_param", "bytes", Better::lower, Gate::exact, 0, 0,
       "the same in the host pool (offload)"},
      {"recomputed_layers", "1", Better::lower, Gate::exact, 0, 0, "layer forwards run again in the timed step"},
      {"recompute_flops_fraction", "1", Better::lower, Gate::report, 0, 0,
       "their FLOPs over the plain step's (forward + backward)"},
      {"grad_values_differ_vs_reference", "1", Better::lower, diff, 0, 0,
       "gradient values that differ from the reference implementation's"},
      {"grad_rel_diff_vs_reference", "1", Better::lower, diff, 0, 0,
       "relative L2 difference from the reference implementation's gradient"},
      {"mean_of_means_grad_rel_err", "1", Better::none, Gate::report, 0, 0,
       "with accum > 1: the gradient error if each micro-batch's mean loss were averaged (the common mistake)"},
      // 1.05: a training trajectory follows its rounding, and equally valid summation orders (OpenBLAS's
      // kernel set, the thread count) moved the lora quick run's validation losses by up to 4.2% (full:
      // 2.432 to 2.524) over the configurations the next rule lists; a broken or diverging run is far outside
      // it (and `diverged` gates at zero).
      {"val_loss", "nats/byte", Better::lower, Gate::ratio, 1.05, 0, "validation loss after training"},
      // The same run's reference implementation shares the machine's summation orders, so the ratio moves
      // far less between machines than val_loss itself: over OpenBLAS's SkylakeX, Haswell and
      // Prescott kernels, 1 or 2 threads, AVX-512 or AVX2, it moved by at most 2.2% (accum) and 0.6% (lora,
      // whose val_loss moved 4.2%)
      {"val_loss_vs_reference", "1", Better::lower, Gate::ratio, 1.03, 0,
       "val_loss over the same run's reference implementation's (it trains on the same batches)"},
      {"val_loss_flushed", "nats/byte", Better::lower, Gate::ratio, 1.05, 0,
       "delayed update: validation after the pending update is applied (val_loss reads the device's weights, "
       "one update behind)"},
      {"val_loss_flushed_vs_reference", "1", Better::lower, Gate::ratio, 1.03, 0,
       "delayed update: val_loss_flushed over the same run's reference implementation's val_loss"},
      {"train_loss_last", "nats/byte", Better::lower, Gate::report, 0, 0, "loss of the last training step"},
      {"grad_condition", "1", Better::none, Gate::report, 0, 0,
       "fine-tuning: the float64 gradient's norm at initialization over its norm at the pretrained weights (widens the error bound)"},
      {"val_loss_pretrained", "nats/byte", Better::none, Gate::report, 0, 0,
       "fine-tuning: validation loss of the pretrained model on the held-out text, before fine-tuning"},
      {"diverged", "1", Better::lower, Gate::zero, 0, 0, "1 when the loss turned non-finite"},
      {"non_finite_steps_applied", "1", Better::lower, Gate::zero, 0, 0, "updates applied with a non-finite gradient"},
      {"base_decodes", "1", Better::lower, Gate::exact, 0, 0,
       "quantized base (QLoRA): projection matrices decoded in the timed step (forward, backward, recomputation)"},
      {"base_decode_s", "s", Better::lower, Gate::report, 0, 0,
       "quantized base: wall time of those decodes in the timed step (measured)"},
      {"offload_bytes_to_host", "bytes", Better::lower, Gate::exact, 0, 0, "gradients copied to the host per step"},
      {"offload_bytes_to_device", "bytes", Better::lower, Gate::exact, 0, 0, "updated weights copied to the device per step"},
      {"offload_host_optimizer_s", "s", Better::lower, Gate::report, 0, 0,
       "wall time of the host's optimizer work in the timed step (measured)"},
  };
  for (auto& x : modelled_link_metrics("the step's copies")) m.push_back(std::move(x));
  return m;
}

Technique train_bench_technique(std::string name, std::string description, bool grads_bit_identical,
                                bool checkpoint_key, std::vector<Param> extra) {
  Technique t;
  t.name = std::move(name);
  t.description = std::move(description);
  t.schema.params = train_bench_params();
  if (checkpoint_key) t.schema.params.push_back(checkpoint_param());
  for (auto& p : extra) t.schema.params.push_back(std::move(p));
  t.schema.metrics = train_bench_metrics(grads_bit_identical);
  t.validate = [](const Case& c) { read_train_case(c); };
  t.error_rule.judge = [](const Case& c, const Problem& p, const Impl&, const ErrorStats& e, const ErrorStats&) {
    return gradient_verdict(precision::parse_policy(c.text("policy", "fp32")), e, static_cast<const TrainBench&>(p).grad_condition);
  };
  t.prepare = [](const Case& c) -> std::unique_ptr<Problem> { return prepare_train_bench(c); };
  return t;
}

void add_train_bench_impls(Technique& t, const std::vector<BenchImpl>& impls) {
  for (Backend be : {Backend::cpu, Backend::cuda})
    for (const BenchImpl& bi : impls)
      t.impls.push_back(typed_impl<TrainBench>(
          t.name, bi.name, bi.role, be, std::string(be == Backend::cpu ? "CPU" : "CUDA") + " training step, " + bi.description,
          [adjust = bi.adjust, reference = bi.role == Role::reference](const TrainBench& b, Device& dev) {
            TrainOptions o = b.options();
            adjust(b, o);
            return std::make_unique<TrainBenchWorkload>(b, o, dev, reference);
          }));
}

TrainOptions TrainBench::options() const {
  TrainOptions o = tc.opts;
  if (const double ft = kase.params.value("ft_lr", 0.0); ft > 0) o.lr = static_cast<float>(ft);
  o.checkpoint = parse_checkpoint(kase.text("checkpoint", "none"));
  const int64_t every = kase.integer("every", 0);  // every-k's k; 0 or absent: round(sqrt(layers))
  o.checkpoint_every =
      every > 0 ? every : std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(tc.cfg.layers))));
  return o;
}

int64_t trainable_params(const Config& c, const TrainOptions& o) {
  return o.lora.rank > 0 ? adapter_layout(c, o.lora).total : param_layout(c).total;
}

double step_flops_per_token(const Config& c, const TrainOptions& o) {
  const double full = train_flops_per_token(c, o.seq);
  if (o.lora.rank <= 0) return full;
  const ParamLayout L = param_layout(c);
  double matrix = c.tie_embeddings ? static_cast<double>(c.vocab * c.dim) : 0.0;
  for (const ParamTensor& t : L.tensors)
    if (t.shape.size() == 2 && t.offset != L.embed) matrix += static_cast<double>(t.size);
  return full - 2 * matrix + 6 * static_cast<double>(adapter_layout(c, o.lora).total);
}

double layer_forward_flops_per_token(const Config& c, int64_t seq) {
  const double D = static_cast<double>(c.dim), KV = static_cast<double>(c.kv_dim()), F = static_cast<double>(c.ffn);
  return 2.0 * (2 * D * D + 2 * D * KV + 3 * D * F) + 2.0 * static_cast<double>(seq) * D;
}

Verdict gradient_verdict(precision::Policy p, const ErrorStats& e, double condition) {
  if (!e.finite()) return Verdict{false, "non-finite gradient"};
  const double k = std::max(1.0, condition);
  const double bound = kGradErrorUnits * k * unit_roundoff(precision::traits(p).compute);
  char buf[200];
  std::snprintf(buf, sizeof buf, "gradient rel_l2 %.3e vs bound %.3e (%g x %.2f unit roundoffs of the compute dtype)",
                e.rel_l2, bound, kGradErrorUnits, k);
  return Verdict{e.rel_l2 <= bound, buf};
}

double gradient_condition(const Config& c, const TrainOptions& o, std::span<const float> init,
                          std::span<const datasets::Batch> micro, std::span<const double> grad) {
  auto dev = make_cpu_device();
  TrainOptions o64 = o;
  o64.float64 = true;
  const auto g0 = make_trainer_cpu(c, o64, *dev, init)->gradients(micro);
  auto norm = [](std::span<const double> v) {
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s);
  };
  return norm(g0) / norm(grad);
}

datasets::Batch concatenate(std::span<const datasets::Batch> micro) {
  MT_CHECK(!micro.empty(), "concatenate: no micro-batches");
  datasets::Batch out;
  out.context = micro[0].context;
  for (const auto& m : micro) {
    MT_CHECK(m.context == out.context, "concatenate: micro-batches of different sequence lengths");
    out.batch += m.batch;
    out.inputs.insert(out.inputs.end(), m.inputs.begin(), m.inputs.end());
    out.targets.insert(out.targets.end(), m.targets.begin(), m.targets.end());
  }
  return out;
}

std::vector<datasets::Batch> TrainBench::micro_batches(int64_t step) const {
  const int64_t k = tc.opts.accum_steps, b = tc.opts.batch, seq = tc.opts.seq;
  std::vector<datasets::Batch> out;
  for (int64_t i = 0; i < k; ++i) {
    auto m = datasets::sample_batch(train_data, b, seq, tc.seed, static_cast<uint64_t>(step * k + i));
    const auto ignored = k > 1 ? static_cast<int64_t>(std::lround(pad * static_cast<double>(seq * i) /
                                                                  static_cast<double>(k - 1)))
                               : 0;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t t = seq - std::min(ignored, seq - 1); t < seq; ++t) m.targets[r * seq + t] = kIgnoreTarget;
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<datasets::Batch> TrainBench::val_micro_batches() const {
  std::vector<datasets::Batch> out;
  for (int64_t j = 0; j < tc.eval_batches * tc.opts.accum_steps; ++j)
    out.push_back(datasets::sample_batch(val_data, tc.opts.batch, tc.opts.seq, tc.seed + 1000, static_cast<uint64_t>(j)));
  return out;
}

std::unique_ptr<TrainBench> prepare_train_bench(const Case& c) {
  auto b = std::make_unique<TrainBench>();
  b->kase = c;
  b->tc = read_train_case(c);
  b->tc.opts.policy = precision::parse_policy(c.text("policy", "fp32"));
  b->tc.opts.accum_steps = c.integer("accum", 1);
  b->pad = c.params.value("pad", 0.0);
  MT_CHECK(b->tc.opts.accum_steps >= 1, "case " + c.id + ": accum must be >= 1");
  MT_CHECK(b->pad >= 0 && b->pad <= 1, "case " + c.id + ": pad must lie in [0, 1]");
  b->corpus = load_case_corpus(b->tc);
  b->split = datasets::split(b->corpus);
  b->pretrain_steps = c.integer("pretrain_steps", 0);
  MT_CHECK(b->pretrain_steps >= 0, "case " + c.id + ": pretrain_steps must be >= 0");
  if (b->pretrain_steps > 0) {
    b->init = train_fp32(b->tc.cfg, b->tc.opts, b->split.train, b->pretrain_steps, b->tc.seed);
    constexpr std::size_t kBlock = 4096;
    for (std::size_t i = 0; i < b->split.val.size(); i += kBlock) {
      auto& dst = (i / kBlock) % 5 == 4 ? b->ft_val : b->ft_train;
      const auto part = b->split.val.subspan(i, std::min(kBlock, b->split.val.size() - i));
      dst.insert(dst.end(), part.begin(), part.end());
    }
    b->train_data = b->ft_train;
    b->val_data = b->ft_val;
    MT_CHECK(static_cast<int64_t>(b->val_data.size()) > b->tc.opts.seq + 1,
             "case " + c.id + ": the held-out text is too short for seq " + std::to_string(b->tc.opts.seq));
  } else {
    b->init = init_params(b->tc.cfg, b->tc.seed);
    b->train_data = b->split.train;
    b->val_data = b->split.val;
  }
  auto dev = make_cpu_device();
  TrainOptions o = b->tc.opts;
  o.float64 = true;
  b->oracle_grad = make_trainer_cpu(b->tc.cfg, o, *dev, b->init)->gradients(b->micro_batches(0));
  if (b->pretrain_steps > 0)
    b->grad_condition =
        gradient_condition(b->tc.cfg, b->tc.opts, init_params(b->tc.cfg, b->tc.seed), b->micro_batches(0), b->oracle_grad);
  return b;
}

TrainBenchWorkload::TrainBenchWorkload(const TrainBench& bench, const TrainOptions& o, Device& dev, bool reference)
    : b_(bench), o_(o), dev_(dev) {
  auto make = [&](const TrainOptions& opts) {
    return dev.backend() == Backend::cpu ? make_trainer_cpu(b_.tc.cfg, opts, dev, b_.init)
                                         : make_trainer_cuda(b_.tc.cfg, opts, dev, b_.init);
  };
  trainer_ = make(o_);
  const auto probe = step_batches(0);
  const auto g = trainer_->gradients(probe);
  const std::vector<double>* oracle = &b_.oracle_grad;
  if (o_.lora.rank > 0) {  // the adapters' float64 gradient under the same options, over the same base
    // (a quantized base: its decoded values, so that the error is the arithmetic's, not the format's)
    const std::string key = std::string(lora_targets_name(o_.lora.targets)) + "/" + std::to_string(o_.lora.rank) + "/" +
                            std::to_string(o_.lora.alpha) + "/" + (o_.base_format ? o_.base_format->name : "");
    auto& lo = b_.lora_oracle[key];
    if (lo.empty()) {
      auto cpu = make_cpu_device();
      TrainOptions o64 = o_;
      o64.float64 = true;
      o64.base_format = nullptr;
      lo = make_trainer_cpu(b_.tc.cfg, o64, *cpu, o_.base_format ? trainer_->params() : b_.init)->gradients(probe);
    }
    oracle = &lo;
  }
  err_ = error_stats(g, *oracle);
  const auto ref = b_.reference_grad.find(dev.backend());
  if (reference) {
    b_.reference_grad[dev.backend()] = g;
  } else if (ref != b_.reference_grad.end() && ref->second.size() == g.size()) {
    const ErrorStats d = error_stats(g, ref->second);
    int64_t differ = 0;
    for (std::size_t i = 0; i < g.size(); ++i) differ += g[i] != ref->second[i];
    counters_["grad_values_differ_vs_reference"] = static_cast<double>(differ);
    counters_["grad_rel_diff_vs_reference"] = d.rel_l2;
  }
  if (o_.accum_steps > 1) {  // the same micro-batches with each one's mean loss averaged
    TrainOptions wrong = o_;
    wrong.mean_of_means = true;
    auto t = make(wrong);
    const auto gw = t->gradients(probe);
    counters_["mean_of_means_grad_rel_err"] = error_stats(gw, b_.oracle_grad).rel_l2;
  }

  // Validation on the same tokens whatever the batch shape.
  auto validate = [&] {
    const auto val = b_.val_micro_batches();
    const int64_t group = o_.batch / b_.tc.opts.batch;  // micro-batches per trainer batch
    double sum = 0;
    int64_t n = 0;
    for (std::size_t j = 0; j + group <= val.size(); j += group, ++n)
      sum += trainer_->eval_loss(group == 1 ? val[j] : concatenate(std::span(val).subspan(j, group)));
    return sum / static_cast<double>(n);
  };
  if (b_.pretrain_steps > 0) {
    counters_["val_loss_pretrained"] = validate();
    counters_["grad_condition"] = b_.grad_condition;
  }
  // Training, then validation.
  int64_t applied_non_finite = 0;
  double last = NAN;
  bool diverged = false;
  for (int64_t s = 0; s < b_.tc.steps && !diverged; ++s) {
    const StepStats st = trainer_->step(step_batches(s));
    applied_non_finite += st.non_finite && st.applied;
    last = st.loss;
    diverged = !std::isfinite(st.loss);
  }
  next_ = b_.tc.steps;
  counters_["steps"] = static_cast<double>(b_.tc.steps);
  counters_["params"] = static_cast<double>(param_layout(b_.tc.cfg).total);
  counters_["trainable_params"] = static_cast<double>(trainable_params(b_.tc.cfg, o_));
  counters_["trainable_fraction"] = counters_["trainable_params"] / counters_["params"];
  counters_["non_finite_steps_applied"] = static_cast<double>(applied_non_finite);
  if (std::isfinite(last)) counters_["train_loss_last"] = last;
  if (!diverged) {
    const double v = validate();
    diverged = !std::isfinite(v);
    if (!diverged) {
      counters_["val_loss"] = v;
      if (reference) b_.reference_val[dev.backend()] = v;
      else if (const auto it = b_.reference_val.find(dev.backend()); it != b_.reference_val.end())
        counters_["val_loss_vs_reference"] = v / it->second;
    }
  }
  if (o_.delayed_update_from >= 0 && !diverged) {  // every training gradient applied, then validation
    trainer_->flush_update();
    const double v = validate();
    counters_["val_loss_flushed"] = v;
    if (const auto it = b_.reference_val.find(dev.backend()); it != b_.reference_val.end() && std::isfinite(v))
      counters_["val_loss_flushed_vs_reference"] = v / it->second;
    trainer_->step(step_batches(next_++));  // an update pending again, as in the timed steps that follow
  }
  counters_["diverged"] = diverged ? 1.0 : 0.0;
}

std::vector<datasets::Batch> TrainBenchWorkload::step_batches(int64_t step) const {
  auto micro = b_.micro_batches(step);
  if (o_.accum_steps == static_cast<int64_t>(micro.size())) return micro;
  MT_CHECK(o_.accum_steps == 1 && o_.batch == b_.tc.opts.batch * b_.tc.opts.accum_steps,
           "training bench: a trainer must take the step's micro-batches or all of them at once");
  return {concatenate(micro)};
}

void TrainBenchWorkload::run() {
  const StepStats st = trainer_->step(step_batches(next_++));
  recomputed_ = st.recomputed_layers;
  counters_["tokens_per_step"] = static_cast<double>(st.tokens);
  if (o_.base_format) {
    counters_["base_decodes"] = static_cast<double>(st.base_decodes);
    counters_["base_decode_s"] = st.base_decode_s;
  }
  if (o_.offload) {
    const double moved = static_cast<double>(st.bytes_to_host + st.bytes_to_device);
    counters_["offload_bytes_to_host"] = static_cast<double>(st.bytes_to_host);
    counters_["offload_bytes_to_device"] = static_cast<double>(st.bytes_to_device);
    counters_["offload_host_optimizer_s"] = st.host_optimizer_s;
    add_modelled_link_time(counters_, moved);
  }
}

Work TrainBenchWorkload::work() const {
  Work w;
  const double tokens = static_cast<double>(o_.batch * o_.seq * o_.accum_steps);
  w.flops = step_flops_per_token(b_.tc.cfg, o_) * tokens +
            layer_forward_flops_per_token(b_.tc.cfg, o_.seq) * static_cast<double>(recomputed_ * o_.batch * o_.seq);
  w.gemm_dtype = dev_.backend() == Backend::cpu ? "fp32" : dtype_name(precision::traits(o_.policy).compute);
  w.items = tokens;
  w.item_unit = "tokens";
  return w;
}

void TrainBenchWorkload::add_counters(std::map<std::string, double>& c) {
  for (const auto& [k, v] : counters_) c[k] = v;
  c["recomputed_layers"] = static_cast<double>(recomputed_);
  const double step_flops = step_flops_per_token(b_.tc.cfg, o_) * static_cast<double>(o_.batch * o_.seq * o_.accum_steps);
  c["recompute_flops_fraction"] =
      layer_forward_flops_per_token(b_.tc.cfg, o_.seq) * static_cast<double>(recomputed_ * o_.batch * o_.seq) / step_flops;
  // Model state between steps (weights, grads, master, moments), per parameter, on the device and
  // (offload) on the host.
  auto state = [&](const TrackedAllocator& pool) {
    return static_cast<double>(pool.by_tag(Tag::weights).live + pool.by_tag(Tag::grads).live +
                               pool.by_tag(Tag::master).live + pool.by_tag(Tag::optimizer).live) /
           static_cast<double>(param_layout(b_.tc.cfg).total);
  };
  c["model_state_bytes_per_param"] = state(dev_.memory());
  if (o_.offload) c["host_model_state_bytes_per_param"] = state(dev_.host());
}

std::string TrainBenchWorkload::detail() {
  return "corpus " + b_.corpus.source + " sha256 " + b_.corpus.sha256 + "; " + std::to_string(b_.tc.steps) +
         " steps of " + std::to_string(o_.accum_steps) + " x " + std::to_string(o_.batch) + "x" +
         std::to_string(o_.seq) + " tokens, policy " + precision::policy_name(o_.policy) + ", checkpointing " +
         checkpoint_name(o_.checkpoint) +
         (o_.lora.rank > 0 ? ", LoRA r=" + std::to_string(o_.lora.rank) + " on " + lora_targets_name(o_.lora.targets)
                           : std::string()) +
         (b_.pretrain_steps > 0 ? ", fine-tuning after " + std::to_string(b_.pretrain_steps) + " fp32 pretraining steps"
                                : std::string());
}

}  // namespace memtrade::model
