// Activation checkpointing and gradient accumulation in the training step (model/train_core.hpp):
// checkpointed gradients equal the plain step's bit for bit under every precision policy, each policy's
// activation peak is the exact figure its keep/recompute rule gives, and k micro-batches of b give the
// gradient of one batch of k*b (token-normalized, also with unequal token counts) at b's memory.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "impls/offload/zero_model.hpp"
#include "model/layers.hpp"
#include "model/train_bench.hpp"
#include "host_memory_devices.hpp"
#include "model_fixtures.hpp"
#include "test_util.hpp"

namespace memtrade {
namespace {

using model::Checkpoint;
using model::Config;
using model::TrainOptions;
using precision::Policy;

Config four_layers() {
  Config c = test::tiny_model();
  c.layers = 4;
  return c;
}

TEST(Checkpoint, NamesRoundTrip) {
  for (Checkpoint c : {Checkpoint::none, Checkpoint::full, Checkpoint::every_k, Checkpoint::selective})
    EXPECT_EQ(model::parse_checkpoint(model::checkpoint_name(c)), c);
  EXPECT_EQ(test::error_of([] { model::parse_checkpoint("sqrt"); }),
            "unknown checkpointing policy \"sqrt\" (none, full, every-k, selective)");
  TrainOptions o = test::train_options(Policy::fp32);
  o.checkpoint_every = 0;
  EXPECT_EQ(test::error_of([&] { model::validate(four_layers(), o); }), "training: checkpoint_every must be >= 1, got 0");
}

struct Measured {
  std::vector<double> grads;
  std::vector<float> params_after;  // after two optimizer steps
  int64_t recomputed = 0;
  std::size_t act_peak = 0;         // tag activations, during one step
};

Measured measure(const Config& c, TrainOptions o, bool float64 = false) {
  o.float64 = float64;
  auto dev = make_cpu_device();
  auto t = model::make_trainer_cpu(c, o, *dev, test::test_weights(c, 3));
  Measured m;
  const auto probe = test::random_tokens(o.batch, o.seq, 11);
  m.grads = t->gradients(probe);
  for (uint64_t s = 0; s < 2; ++s) {
    const datasets::Batch micro[] = {test::random_tokens(o.batch, o.seq, 40 + s)};
    dev->memory().reset_peak();
    const auto st = t->step(micro);
    m.recomputed = st.recomputed_layers;
    m.act_peak = dev->memory().by_tag(Tag::activations).peak;
  }
  m.params_after = t->params();
  return m;
}

// Recomputation runs the same operations in the same order: every gradient bit and every updated
// weight equal the plain step's, under every precision policy and the float64 reference.
TEST(Checkpoint, GradientsAndUpdatesBitIdenticalUnderEveryPolicy) {
  const Config c = four_layers();
  struct P { Policy p; bool f64; };
  std::vector<P> policies = {{Policy::fp32, true}};
  for (Policy p : precision::all_policies) policies.push_back({p, false});
  for (const auto& [policy, f64] : policies) {
    TrainOptions o = test::train_options(policy);
    const Measured plain = measure(c, o, f64);
    for (auto [cp, k] : {std::pair{Checkpoint::full, 1}, {Checkpoint::every_k, 2}, {Checkpoint::every_k, 3},
                         {Checkpoint::selective, 1}}) {
      o.checkpoint = cp;
      o.checkpoint_every = k;
      const Measured m = measure(c, o, f64);
      const std::string what = std::string(f64 ? "float64" : precision::policy_name(policy)) + " / " +
                               model::checkpoint_name(cp) + " k=" + std::to_string(k);
      ASSERT_EQ(m.grads.size(), plain.grads.size());
      for (std::size_t i = 0; i < m.grads.size(); ++i)
        ASSERT_EQ(m.grads[i], plain.grads[i]) << what << " gradient " << i;
      for (std::size_t i = 0; i < m.params_after.size(); ++i)
        ASSERT_EQ(m.params_after[i], plain.params_after[i]) << what << " parameter " << i;
      EXPECT_LT(m.act_peak, plain.act_peak) << what;
    }
  }
}

// Layers run again per step: full recomputes all but the last layer; every-k all but the last segment.
TEST(Checkpoint, RecomputedLayers) {
  for (int64_t layers : {1, 4, 5}) {
    Config c = test::tiny_model();
    c.layers = layers;
    TrainOptions o = test::train_options(Policy::fp32);
    EXPECT_EQ(measure(c, o).recomputed, 0);
    o.checkpoint = Checkpoint::full;
    EXPECT_EQ(measure(c, o).recomputed, layers - 1) << layers;
    o.checkpoint = Checkpoint::every_k;
    o.checkpoint_every = 2;
    EXPECT_EQ(measure(c, o).recomputed, (layers - 1) / 2 * 2) << layers;
    o.checkpoint = Checkpoint::selective;
    EXPECT_EQ(measure(c, o).recomputed, 0);
  }
}

// The activation peak falls by exactly what each policy does not keep. The step's peak is the end of
// the forward (every kept layer plus the logits); one layer keeps, in bytes of the storage type S:
// 6 [R x D] (input, two norm outputs, q, o, residual), 2 [R x KV] (k, v), 2 [R x F] (gate, up), plus
// two fp32 RMS factors per row and the attention's fp32 log-sum-exp per (head, row).
TEST(Checkpoint, ActivationPeakFollowsTheKeepRule) {
  const Config c = four_layers();
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    TrainOptions o = test::train_options(p);
    const std::size_t s = p == Policy::fp32 ? 4 : 2, R = static_cast<std::size_t>(o.batch * o.seq);
    const std::size_t D = static_cast<std::size_t>(c.dim), KV = static_cast<std::size_t>(c.kv_dim()),
                      F = static_cast<std::size_t>(c.ffn), H = static_cast<std::size_t>(c.heads);
    const std::size_t layer = s * R * (6 * D + 2 * KV + 2 * F) + 2 * R * 4 + H * R * 4, input = s * R * D;
    const std::size_t none = measure(c, o).act_peak;
    o.checkpoint = Checkpoint::full;
    EXPECT_EQ(none - measure(c, o).act_peak, 3 * (layer - input)) << policy_name(p);
    o.checkpoint = Checkpoint::every_k;
    o.checkpoint_every = 2;  // layers 0-1 keep layer 0's input; 2-3 are the last segment
    EXPECT_EQ(none - measure(c, o).act_peak, 2 * layer - input) << policy_name(p);
    o.checkpoint = Checkpoint::selective;
    EXPECT_EQ(none - measure(c, o).act_peak, 4 * 2 * s * R * D) << policy_name(p);
  }
}

// ---- gradient accumulation ----

// Splits a batch of k*b sequences into k micro-batches of b.
std::vector<datasets::Batch> split(const datasets::Batch& whole, int64_t k) {
  const int64_t b = whole.batch / k, n = b * whole.context;
  std::vector<datasets::Batch> out(k);
  for (int64_t i = 0; i < k; ++i) {
    out[i].batch = b;
    out[i].context = whole.context;
    out[i].inputs.assign(whole.inputs.begin() + i * n, whole.inputs.begin() + (i + 1) * n);
    out[i].targets.assign(whole.targets.begin() + i * n, whole.targets.begin() + (i + 1) * n);
  }
  return out;
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

struct AccumRun {
  std::vector<double> grads;
  std::size_t act_peak = 0;
};

AccumRun accumulated(const Config& c, TrainOptions o, std::span<const datasets::Batch> micro) {
  auto dev = make_cpu_device();
  o.batch = micro[0].batch;
  o.accum_steps = static_cast<int64_t>(micro.size());
  auto t = model::make_trainer_cpu(c, o, *dev, test::test_weights(c, 5));
  AccumRun r;
  dev->memory().reset_peak();
  r.grads = t->gradients(micro);
  r.act_peak = dev->memory().by_tag(Tag::activations).peak;
  return r;
}

// k micro-batches of b give one batch of k*b's gradient (fp32: within reordering of the sums; float64:
// to rounding), with equal and unequal counted tokens; the activation peak is b's, not k*b's.
TEST(Accumulation, MicroBatchesEqualOneLargeBatch) {
  const Config c = test::tiny_model();
  const int64_t k = 4;
  auto whole = test::random_tokens(8, 16, 77);
  for (bool unequal : {false, true}) {
    if (unequal)  // padding: micro-batch i counts 32 - 7 i of its 32 targets
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < 7 * i; ++j) whole.targets[i * 32 + 31 - j] = model::kIgnoreTarget;
    const auto micro = split(whole, k);
    const datasets::Batch one[] = {whole};
    for (bool f64 : {true, false}) {
      TrainOptions o = test::train_options(Policy::fp32);
      o.float64 = f64;
      const AccumRun big = accumulated(c, o, one), acc = accumulated(c, o, micro);
      const double err = rel_l2(acc.grads, big.grads);
      EXPECT_LT(err, f64 ? 1e-14 : 1e-6) << "unequal " << unequal << " float64 " << f64;
      if (!f64) {
        o.mean_of_means = true;  // the mistake: right only when every micro-batch counts the same tokens
        const double wrong = rel_l2(accumulated(c, o, micro).grads, big.grads);
        if (unequal) EXPECT_GT(wrong, 0.05) << "mean of means";
        else EXPECT_LT(wrong, 1e-6) << "mean of means, equal counts";
      }
      const AccumRun single = accumulated(c, o, std::span(micro).first(1));
      EXPECT_EQ(acc.act_peak, single.act_peak);
      EXPECT_LT(acc.act_peak * 2, big.act_peak);
    }
  }
}

// A micro-batch may count no target (all padding); a step where none counts is an error.
TEST(Accumulation, EmptyMicroBatches) {
  const Config c = test::tiny_model();
  auto micro = split(test::random_tokens(4, 16, 3), 2);
  std::fill(micro[1].targets.begin(), micro[1].targets.end(), model::kIgnoreTarget);
  TrainOptions o = test::train_options(Policy::fp32, 2);
  o.accum_steps = 2;
  auto dev = make_cpu_device();
  auto t = model::make_trainer_cpu(c, o, *dev, test::test_weights(c, 5));
  const auto st = t->step(micro);
  EXPECT_EQ(st.tokens, 32);
  EXPECT_TRUE(std::isfinite(st.loss));
  std::fill(micro[0].targets.begin(), micro[0].targets.end(), model::kIgnoreTarget);
  EXPECT_EQ(test::error_of([&] { t->step(micro); }), "training: the micro-batches count no target (all ignored)");
}

// ---- ZeRO-Offload ----

struct OffloadRun {
  std::vector<float> params;
  std::vector<double> grads;
  std::vector<model::StepStats> steps;
};

OffloadRun train_steps(const Config& c, TrainOptions o, int64_t steps, Device& dev) {
  auto t = model::make_trainer_cpu(c, o, dev, test::test_weights(c, 9));
  OffloadRun r;
  r.grads = t->gradients(test::random_tokens(o.batch, o.seq, 12));
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<datasets::Batch> micro;
    for (int64_t k = 0; k < o.accum_steps; ++k) micro.push_back(test::random_tokens(o.batch, o.seq, 50 + 7 * s + k));
    r.steps.push_back(t->step(micro));
  }
  r.params = t->params();
  return r;
}

// One micro-batch per step: the offloaded step equals the device step bit for bit under every policy it
// applies to (the same AdamW kernel, the same gradient roundings).
TEST(Offload, EqualsTheDeviceStepBitForBit) {
  const Config c = test::tiny_model();
  for (Policy p : {Policy::fp32, Policy::bf16_mixed, Policy::fp16_mixed, Policy::fp16_mixed_noscale}) {
    for (int64_t accum : {1}) {
      TrainOptions o = test::train_options(p);
      o.accum_steps = accum;
      auto d1 = make_cpu_device(), d2 = make_cpu_device();
      const OffloadRun dev_run = train_steps(c, o, 3, *d1);
      o.offload = true;
      const OffloadRun off = train_steps(c, o, 3, *d2);
      const std::string what = std::string(precision::policy_name(p)) + " accum " + std::to_string(accum);
      ASSERT_EQ(off.grads.size(), dev_run.grads.size());
      for (std::size_t i = 0; i < off.grads.size(); ++i) ASSERT_EQ(off.grads[i], dev_run.grads[i]) << what << " gradient " << i;
      for (std::size_t i = 0; i < off.params.size(); ++i)
        ASSERT_EQ(off.params[i], dev_run.params[i]) << what << " parameter " << i;
      for (std::size_t s = 0; s < off.steps.size(); ++s) EXPECT_EQ(off.steps[s].loss, dev_run.steps[s].loss) << what;
    }
  }
}

// On a device whose copies overlap (CUDA), each gradient segment goes to the host on the copy stream while
// the next segment's backward runs in the other of two device buffers, and each updated tile goes to the
// device while the next one updates, two host tile buffers taking turns. With every copy deferred until
// its fence or a join (a copy reads its source only then), the run still equals the CPU device's bit for
// bit, with one micro-batch per step and with two (the second's segments added on the host).
TEST(Offload, OverlappedCopiesWaitForTheirFences) {
  const Config c = test::tiny_model();
  for (Policy p : {Policy::fp32, Policy::bf16_mixed})
    for (int64_t accum : {1, 2}) {
      TrainOptions o = test::train_options(p);
      o.offload = true;
      o.accum_steps = accum;
      auto d1 = make_cpu_device();
      test::DeferredCopyDevice d2;
      const OffloadRun plain = train_steps(c, o, 3, *d1);
      const OffloadRun overlapped = train_steps(c, o, 3, d2);
      const std::string what = std::string(policy_name(p)) + " accum " + std::to_string(accum);
      EXPECT_GT(d2.deferred_copies(), 0) << what << ": no copy was outstanding while the work went on";
      ASSERT_EQ(overlapped.grads, plain.grads) << what;
      ASSERT_EQ(overlapped.params.size(), plain.params.size());
      for (std::size_t i = 0; i < plain.params.size(); ++i)
        ASSERT_EQ(overlapped.params[i], plain.params[i]) << what << " parameter " << i;
      for (std::size_t s = 0; s < plain.steps.size(); ++s) EXPECT_EQ(overlapped.steps[s].loss, plain.steps[s].loss) << what;
    }
}

// Several micro-batches: the host adds each one's gradient to the sum of the previous ones (a 16-bit
// gradient rounded once more; repeated embedding rows summed per micro-batch first), where the device adds
// every contribution to the running sum. The updates stay within that rounding of the device step's.
TEST(Offload, AccumulationWithinRounding) {
  const Config c = test::tiny_model();
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    TrainOptions o = test::train_options(p);
    o.accum_steps = 3;
    auto d1 = make_cpu_device(), d2 = make_cpu_device();
    const OffloadRun dev_run = train_steps(c, o, 1, *d1);
    o.offload = true;
    const OffloadRun off = train_steps(c, o, 1, *d2);
    ASSERT_EQ(off.params.size(), dev_run.params.size());
    int64_t differ = 0;
    for (std::size_t i = 0; i < off.params.size(); ++i) {
      // AdamW's first step moves each weight by about lr (the gradient's sign): a gradient that rounds
      // differently can at most flip a near-zero one.
      ASSERT_LE(std::fabs(off.params[i] - dev_run.params[i]), 2.5 * o.lr + 1e-2f * std::fabs(dev_run.params[i]))
          << policy_name(p) << " " << i;
      differ += off.params[i] != dev_run.params[i];
    }
    EXPECT_LT(differ, static_cast<int64_t>(off.params.size()) / (p == Policy::fp32 ? 100 : 10)) << policy_name(p);
  }
}

// Where the bytes are: the device keeps the working weights (plus one segment's gradients during the
// backward), the host the fp32 master, both moments and the gradients; every step moves the gradients
// down once per micro-batch and the weights up once.
TEST(Offload, BytesPerParameterAndBytesMoved) {
  const Config c = test::tiny_model();
  const model::ParamLayout L = model::param_layout(c);
  const std::size_t P = static_cast<std::size_t>(L.total);
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    const std::size_t s = p == Policy::fp32 ? 4 : 2;
    TrainOptions o = test::train_options(p);
    o.offload = true;
    o.accum_steps = 2;
    auto dev = make_cpu_device();
    auto t = model::make_trainer_cpu(c, o, *dev, test::test_weights(c, 9));
    auto& pool = dev->memory();
    auto& host = dev->host();
    EXPECT_EQ(pool.by_tag(Tag::weights).live, P * s);
    EXPECT_EQ(pool.by_tag(Tag::grads).live + pool.by_tag(Tag::master).live + pool.by_tag(Tag::optimizer).live, 0u);
    EXPECT_EQ(host.by_tag(Tag::master).live, P * 4);
    EXPECT_EQ(host.by_tag(Tag::optimizer).live, P * 8);
    EXPECT_EQ(host.by_tag(Tag::grads).live, P * s);
    pool.reset_peak();
    const std::vector<datasets::Batch> micro = {test::random_tokens(2, 16, 1), test::random_tokens(2, 16, 2)};
    const auto st = t->step(micro);
    // The largest segment: the embedding or the head, [vocab x dim].
    EXPECT_EQ(pool.by_tag(Tag::grads).peak, static_cast<std::size_t>(c.vocab * c.dim) * s);
    EXPECT_EQ(st.bytes_to_host, static_cast<int64_t>(2 * P * s));
    EXPECT_EQ(st.bytes_to_device, static_cast<int64_t>(P * s));
    EXPECT_GT(st.host_optimizer_s, 0.0);
  }
}

// DeepSpeed's one-step delayed parameter update from step k: steps before k are the plain offloaded
// steps; step k applies nothing and leaves its gradients pending; step k + 1 takes its gradients at the
// same weights and applies step k's update, so after k + 2 steps the device holds the plain run's weights
// after k + 1 (the same update from the same gradients), bit for bit.
TEST(Offload, DelayedUpdateLandsOneStepLate) {
  const Config c = test::tiny_model();
  const int64_t k = 2;
  for (Policy p : {Policy::fp32, Policy::bf16_mixed, Policy::fp16_mixed}) {
    const std::string what = precision::policy_name(p);
    TrainOptions o = test::train_options(p);
    o.offload = true;
    auto d1 = make_cpu_device(), d2 = make_cpu_device();
    const OffloadRun plain = train_steps(c, o, k + 1, *d1);
    o.delayed_update_from = k;
    const OffloadRun dpu = train_steps(c, o, k + 2, *d2);
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_FALSE(dpu.steps[i].delayed) << what;
      EXPECT_EQ(dpu.steps[i].loss, plain.steps[i].loss) << what << " step " << i;
    }
    EXPECT_TRUE(dpu.steps[k].delayed);
    EXPECT_FALSE(dpu.steps[k].applied) << what << ": nothing was pending at the first delayed step";
    EXPECT_EQ(dpu.steps[k].bytes_to_device, 0);
    EXPECT_EQ(dpu.steps[k].loss, plain.steps[k].loss) << what << ": the same weights, the same batch";
    EXPECT_TRUE(dpu.steps[k + 1].applied) << what;
    EXPECT_EQ(dpu.steps[k + 1].bytes_to_device, static_cast<int64_t>(plain.params.size() * (p == Policy::fp32 ? 4 : 2)));
    ASSERT_EQ(dpu.params.size(), plain.params.size());
    for (std::size_t i = 0; i < dpu.params.size(); ++i) ASSERT_EQ(dpu.params[i], plain.params[i]) << what << " parameter " << i;
  }
}

// The update on a host thread beside the forward and backward gives the bits of the same update after
// them, also through skipped fp16 steps (a loss scale of 2^20 overflows until it has backed off), and
// flush_update() applies the last pending update. The host holds two gradient buffers.
TEST(Offload, DelayedUpdateOnAThreadEqualsItAfterTheBackward) {
  const Config c = test::tiny_model();
  const std::size_t P = static_cast<std::size_t>(model::param_layout(c).total);
  for (Policy p : {Policy::bf16_mixed, Policy::fp16_mixed}) {
    const std::string what = precision::policy_name(p);
    TrainOptions o = test::train_options(p);
    o.offload = true;
    o.delayed_update_from = 0;
    if (p == Policy::fp16_mixed) o.init_scale = std::ldexp(1.0, 20);
    std::vector<std::vector<float>> params;
    std::vector<std::vector<model::StepStats>> stats;
    for (const bool overlap : {true, false}) {
      o.delayed_update_overlap = overlap;
      auto dev = make_cpu_device();
      auto t = model::make_trainer_cpu(c, o, *dev, test::test_weights(c, 9));
      EXPECT_EQ(dev->host().by_tag(Tag::grads).live, 2 * P * 2) << what;
      stats.emplace_back();
      for (int64_t s = 0; s < 12; ++s) stats.back().push_back(t->step(std::vector{test::random_tokens(o.batch, o.seq, 80 + s)}));
      const auto before = t->params();
      t->flush_update();
      params.push_back(t->params());
      EXPECT_NE(params.back(), before) << what << ": flush_update applied nothing";
      t->flush_update();  // nothing pending: a no-op
      EXPECT_EQ(t->params(), params.back());
    }
    EXPECT_EQ(params[0], params[1]) << what;
    int64_t skipped = 0, applied = 0;
    for (std::size_t s = 0; s < stats[0].size(); ++s) {
      applied += stats[0][s].applied;
      EXPECT_EQ(stats[0][s].loss, stats[1][s].loss) << what << " step " << s;
      EXPECT_EQ(stats[0][s].applied, stats[1][s].applied) << what << " step " << s;
      EXPECT_EQ(stats[0][s].loss_scale, stats[1][s].loss_scale) << what << " step " << s;
      skipped += stats[0][s].non_finite;
    }
    EXPECT_GT(applied, 6) << what;
    if (p == Policy::fp16_mixed) {
      EXPECT_GT(skipped, 0) << "the loss scale never overflowed: the skip path is untested";
    }
  }
  TrainOptions o = test::train_options(Policy::fp32);
  o.delayed_update_from = 0;
  EXPECT_EQ(test::error_of([&] { model::validate(c, o); }),
            "training: the delayed parameter update (delayed_update_from) needs offload (the update runs on the host)");
}

TEST(Offload, RefusedWhereItDoesNotApplyAndOutOfHostMemoryIsOom) {
  const Config c = test::tiny_model();
  TrainOptions o = test::train_options(Policy::bf16_pure);
  o.offload = true;
  const std::string why = "training: offload keeps fp32 master weights and moments on the host; it does not apply "
                          "to bf16-pure, the float64 reference or an inference-only trainer";
  EXPECT_EQ(test::error_of([&] { model::validate(c, o); }), why);
  o.policy = Policy::fp32;
  o.float64 = true;
  EXPECT_EQ(test::error_of([&] { model::validate(c, o); }), why);
  o.float64 = false;
  auto dev = make_cpu_device();
  dev->host().set_capacity(static_cast<std::size_t>(model::param_layout(c).total) * 8);  // less than 16 B/param
  EXPECT_THROW(model::make_trainer_cpu(c, o, *dev, test::test_weights(c, 9)), OutOfMemory);
}

// The training bench's micro-batches: micro-batch i of k ignores round(pad * seq * i / (k - 1)) targets at the
// end of each sequence; validation covers eval_batches x accum micro-batches whatever the trainer's shape, so
// the large-batch and accumulating implementations evaluate the same tokens (fp32: equal validation loss to
// reordering of the sums after the same training).
TEST(TrainBench, PaddingAndValidationTokens) {
  if (!std::filesystem::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "apt-get install fortunes";
  Case c;
  c.suite = "accum";
  c.id = "bench";
  c.params = Json{{"dim", 32}, {"layers", 1}, {"heads", 2}, {"ffn", 32}, {"context", 16}, {"batch", 2},
                  {"steps", 2}, {"accum", 3}, {"pad", 0.5}, {"eval_batches", 2}};
  const auto b = model::prepare_train_bench(c);
  const auto micro = b->micro_batches(0);
  ASSERT_EQ(micro.size(), 3u);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t r = 0; r < 2; ++r) {
      int64_t ignored = 0;
      for (int64_t t = 0; t < 16; ++t) ignored += micro[i].targets[r * 16 + t] == model::kIgnoreTarget;
      EXPECT_EQ(ignored, 4 * i) << "micro-batch " << i << " row " << r;
      EXPECT_NE(micro[i].targets[r * 16 + 15 - 4 * i], model::kIgnoreTarget);
    }
  EXPECT_EQ(b->val_micro_batches().size(), 6u);
  std::map<std::string, double> big, acc;
  auto dev = make_cpu_device();
  TrainOptions o = b->options();
  model::TrainBenchWorkload(*b, o, *dev, false).add_counters(acc);
  o.batch *= o.accum_steps;
  o.accum_steps = 1;
  model::TrainBenchWorkload(*b, o, *dev, true).add_counters(big);
  EXPECT_NEAR(acc.at("val_loss"), big.at("val_loss"), 1e-5 * big.at("val_loss"));
  EXPECT_GT(acc.at("mean_of_means_grad_rel_err"), 1e-2);
  EXPECT_EQ(big.count("mean_of_means_grad_rel_err"), 0u);
}

// ZeRO's Fig. 1: 7.5B parameters on 64 devices, K = 12.
TEST(ZeroModel, StagesAndOffload) {
  using offload::zero_model_state;
  const double P = 7.5e9;
  EXPECT_DOUBLE_EQ(zero_model_state({P, 0, 64, false, 12}).device_bytes, 16 * P);
  EXPECT_DOUBLE_EQ(zero_model_state({P, 1, 64, false, 12}).device_bytes, 4 * P + 12 * P / 64);
  EXPECT_DOUBLE_EQ(zero_model_state({P, 2, 64, false, 12}).device_bytes, 2 * P + 14 * P / 64);
  EXPECT_DOUBLE_EQ(zero_model_state({P, 3, 64, false, 12}).device_bytes, 16 * P / 64);
  EXPECT_NEAR(zero_model_state({P, 1, 64, false, 12}).device_bytes / 1e9, 31.4, 0.05);
  EXPECT_NEAR(zero_model_state({P, 2, 64, false, 12}).device_bytes / 1e9, 16.6, 0.05);
  EXPECT_NEAR(zero_model_state({P, 3, 64, false, 12}).device_bytes / 1e9, 1.9, 0.05);
  const auto off = zero_model_state({1, 2, 1, true, 12});
  EXPECT_EQ(off.device_bytes, 2);
  EXPECT_EQ(off.host_bytes, 14);
  const auto dpu = zero_model_state({1, 2, 1, true, 12, true});
  EXPECT_EQ(dpu.device_bytes, 2);
  EXPECT_EQ(dpu.host_bytes, 16);
  EXPECT_EQ(test::error_of([] { zero_model_state({1, 2, 1, false, 12, true}); }),
            "zero model: the delayed parameter update needs ZeRO-Offload");
  // One device: every stage is plain data parallelism.
  for (int stage = 0; stage < 4; ++stage) EXPECT_EQ(zero_model_state({1, stage, 1, false, 12}).device_bytes, 16);
  EXPECT_EQ(test::error_of([] { zero_model_state({1, 4, 1, false, 12}); }), "zero model: stage 4 is not one of 0-3");
  EXPECT_EQ(test::error_of([] { zero_model_state({1, 3, 1, true, 12}); }),
            "zero model: ZeRO-Offload partitions like stage 2 (got stage 3)");
  EXPECT_EQ(test::error_of([] { zero_model_state({1, 0, 0, false, 12}); }),
            "zero model: params and k must be >= 0 and devices >= 1");
}

}  // namespace
}  // namespace memtrade
