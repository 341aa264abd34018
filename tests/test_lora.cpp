// LoRA adapters in the training step (model/lora.hpp, model/train_core.hpp): zero B leaves the model
// unchanged, merged and unmerged adapters agree, the adapters' float64 gradient matches finite
// differences, only the adapters change in training, the tracked bytes are the adapter layout's to the
// byte, and adapters round-trip through PEFT-named safetensors files (also one written by Python).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "datasets/random.hpp"
#include "impls/lora/finetune_model.hpp"
#include "impls/lora/qlora.hpp"
#include "model/lora.hpp"
#include "model/safetensors.hpp"
#include "model_fixtures.hpp"
#include "test_util.hpp"

namespace memtrade {
namespace {

namespace fs = std::filesystem;
using model::Config;
using model::LoraOptions;
using model::LoraTargets;
using model::Proj;
using model::TrainOptions;
using precision::Policy;

LoraOptions lora(int64_t r, LoraTargets t = LoraTargets::all_linear, float alpha = 8) {
  LoraOptions o;
  o.rank = r;
  o.alpha = alpha;
  o.targets = t;
  return o;
}

// Kaiming A and a nonzero B (so that the adapters change the output and A has a gradient).
std::vector<float> nonzero_adapters(const Config& c, const LoraOptions& o, uint64_t seed) {
  auto v = model::lora_init(c, o, seed);
  for (const auto& t : model::adapter_layout(c, o).tensors)
    if (t.name.ends_with("lora_B.weight"))
      for (int64_t i = 0; i < t.size; ++i) v[t.offset + i] = 0.2f * static_cast<float>(datasets::normal(seed + 7, t.offset + i));
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}
double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

TEST(Lora, OptionsAndLayout) {
  const Config c = test::tiny_model();  // dim 32, kv_dim 16, ffn 48, 2 layers
  for (LoraTargets t : {LoraTargets::qv, LoraTargets::attention, LoraTargets::all_linear})
    EXPECT_EQ(model::parse_lora_targets(model::lora_targets_name(t)), t);
  EXPECT_EQ(test::error_of([] { model::parse_lora_targets("mlp"); }),
            "lora: unknown targets \"mlp\" (expected qv, attention or all-linear)");
  const auto qv = model::adapter_layout(c, lora(4, LoraTargets::qv));
  // per layer: q A 4x32 + B 32x4, v A 4x32 + B 16x4
  EXPECT_EQ(qv.total, 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4));
  EXPECT_EQ(qv.tensors.front().name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(qv.tensors.back().name, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  const auto all = model::adapter_layout(c, lora(4));
  EXPECT_EQ(all.tensors.size(), 2u * 7 * 2);
  EXPECT_EQ(all.tensors[13].name, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(test::error_of([&] { model::adapter_layout(c, lora(17)); }), "lora: rank 17 exceeds k_proj's smaller side 16");
  EXPECT_EQ(test::error_of([&] { model::adapter_layout(c, lora(0)); }), "lora: rank must be positive, got 0");
  TrainOptions o = test::train_options(Policy::fp32);
  o.lora = lora(4);
  o.offload = true;
  EXPECT_NE(test::error_of([&] { model::validate(c, o); }).find("LoRA with offload is not supported"), std::string::npos);
}

// B = 0 (the initialization): the adapted model's logits are the base model's, bit for bit (y + 0 = y).
TEST(Lora, ZeroBLeavesTheOutputUnchanged) {
  const Config c = test::tiny_model();
  const auto w = test::test_weights(c, 3);
  const auto batch = test::random_tokens(2, 16, 5);
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    auto dev = make_cpu_device();
    TrainOptions o = test::train_options(p);
    const auto base = model::make_trainer_cpu(c, o, *dev, w)->logits(batch);
    o.lora = lora(8);
    auto t = model::make_trainer_cpu(c, o, *dev, w);
    EXPECT_GT(max_abs(t->trainable_params()), 0.0);  // A is not zero
    EXPECT_EQ(t->logits(batch), base) << precision::policy_name(p);
  }
}

// The adapted model equals the base with W + s B A merged in (float64 to the rounding of the merged
// weights to fp32); fp32 adapted and fp32 merged agree within the fp32 rule; unmerging restores the base
// to that rounding.
TEST(Lora, MergedAndUnmergedAgree) {
  const Config c = test::tiny_model();
  const auto w = test::test_weights(c, 3);
  const auto batch = test::random_tokens(2, 16, 5);
  for (LoraTargets tg : {LoraTargets::qv, LoraTargets::all_linear}) {
    const LoraOptions lo = lora(4, tg);
    const auto ad = nonzero_adapters(c, lo, 9);
    const auto merged = model::merge_adapters(c, lo, w, ad);
    auto dev = make_cpu_device();
    auto logits = [&](bool f64, bool adapters) {
      TrainOptions o = test::train_options(Policy::fp32);
      o.float64 = f64;
      if (!adapters) return model::make_trainer_cpu(c, o, *dev, merged)->logits(batch);
      o.lora = lo;
      auto t = model::make_trainer_cpu(c, o, *dev, w);
      t->set_trainable(ad);
      return t->logits(batch);
    };
    const auto a64 = logits(true, true), m64 = logits(true, false), a32 = logits(false, true), m32 = logits(false, false);
    const double scale = max_abs(a64);
    EXPECT_GT(max_abs_diff(merged, w), 1e-3) << "the adapters change the weights";
    // Merged weights are rounded to fp32 once: relative 2^-24 per weight, a few ulps through the model.
    EXPECT_LE(max_abs_diff(a64, m64), 1e-5 * scale);
    // fp32 paths: each within the fp32 rule of the float64 oracle, and of each other.
    const double e_a = max_abs_diff(a32, a64), e_m = max_abs_diff(m32, a64);
    EXPECT_LE(e_a, 1e-4 * scale);
    EXPECT_LE(e_m, 1e-4 * scale);
    EXPECT_LE(max_abs_diff(a32, m32), e_a + e_m + 1e-5 * scale);
    const auto back = model::unmerge_adapters(c, lo, merged, ad);
    for (std::size_t i = 0; i < w.size(); ++i)
      ASSERT_LE(std::fabs(back[i] - w[i]), 4 * 0x1p-24 * (std::fabs(w[i]) + std::fabs(merged[i] - w[i])) + 1e-30)
          << "parameter " << i;
  }
}

// The float64 step's adapter gradient against central finite differences of its loss.
TEST(Lora, Float64AdapterGradientMatchesFiniteDifferences) {
  const Config c = test::tiny_model();
  const auto w = test::test_weights(c, 7);
  const auto batch = test::random_tokens(2, 12, 3);
  auto dev = make_cpu_device();
  TrainOptions o = test::train_options(Policy::fp32, 2, 12);
  o.float64 = true;
  o.lora = lora(3, LoraTargets::all_linear, 6);
  const auto ad = nonzero_adapters(c, o.lora, 4);
  auto make = [&](const std::vector<float>& a) {
    auto t = model::make_trainer_cpu(c, o, *dev, w);
    t->set_trainable(a);
    return t;
  };
  const auto grad = make(ad)->gradients(batch);
  ASSERT_EQ(static_cast<int64_t>(grad.size()), model::adapter_layout(c, o.lora).total);
  const double h = 1e-4;
  int checked = 0;
  for (const auto& t : model::adapter_layout(c, o.lora).tensors)
    for (int64_t i : {t.offset, t.offset + t.size - 1, t.offset + static_cast<int64_t>(datasets::uniform01(2, t.offset) * t.size)}) {
      auto loss_at = [&](double x) {
        auto a = ad;
        a[i] = static_cast<float>(x);
        return make(a)->eval_loss(batch);
      };
      const double x0 = ad[i], xp = static_cast<float>(x0 + h), xm = static_cast<float>(x0 - h);
      const double fd = (loss_at(xp) - loss_at(xm)) / (xp - xm);
      EXPECT_NEAR(grad[i], fd, 2e-5 * std::fabs(fd) + 1e-8) << t.name << " element " << i - t.offset;
      EXPECT_NE(grad[i], 0.0) << t.name;
      ++checked;
    }
  EXPECT_EQ(checked, 3 * 28);
}

// Training changes the adapters only: the base's working weights are bit-identical after three steps.
TEST(Lora, OnlyTheAdaptersTrain) {
  const Config c = test::tiny_model();
  const auto w = test::test_weights(c, 3);
  for (Policy p : {Policy::fp32, Policy::bf16_mixed, Policy::fp16_mixed, Policy::bf16_pure}) {
    auto dev = make_cpu_device();
    TrainOptions o = test::train_options(p);
    o.lora = lora(4, LoraTargets::qv);
    auto t = model::make_trainer_cpu(c, o, *dev, w);
    const auto base0 = t->params(), ad0 = t->trainable_params();
    double first = 0, last = 0;
    for (uint64_t s = 0; s < 3; ++s) {
      const datasets::Batch micro[] = {test::random_tokens(2, 16, 1)};
      const auto st = t->step(micro);
      (s == 0 ? first : last) = st.loss;
    }
    EXPECT_EQ(t->params(), base0) << precision::policy_name(p);
    EXPECT_GT(max_abs_diff(t->trainable_params(), ad0), 0.0) << precision::policy_name(p);
    if (p != Policy::fp16_mixed) {
      EXPECT_LT(last, first) << precision::policy_name(p) << ": the same batch three times";
    }
  }
}

// Checkpointing recomputes the adapters' kept products with the layer: the same gradients, bit for bit.
TEST(Lora, CheckpointedGradientsAreBitIdentical) {
  const Config c = test::tiny_model();
  const auto w = test::test_weights(c, 3);
  const auto batch = test::random_tokens(2, 16, 2);
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    auto dev = make_cpu_device();
    TrainOptions o = test::train_options(p);
    o.lora = lora(4);
    const auto ad = nonzero_adapters(c, o.lora, 5);
    auto grads = [&](model::Checkpoint cp) {
      o.checkpoint = cp;
      auto t = model::make_trainer_cpu(c, o, *dev, w);
      t->set_trainable(ad);
      return t->gradients(batch);
    };
    const auto plain = grads(model::Checkpoint::none);
    EXPECT_EQ(grads(model::Checkpoint::full), plain) << precision::policy_name(p);
    EXPECT_EQ(grads(model::Checkpoint::selective), plain) << precision::policy_name(p);
  }
}

// Tracked bytes: the base in the weight dtype, the adapters (weights), their gradients, two moments and
// (mixed) an fp32 master, to the byte; each adapted projection keeps rows x r activations.
TEST(Lora, TrackedBytesAreTheAdapterLayouts) {
  const Config c = test::tiny_model();
  const auto w = test::test_weights(c, 3);
  const int64_t P = model::param_layout(c).total;
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    const std::size_t S = p == Policy::fp32 ? 4 : 2;
    TrainOptions o = test::train_options(p);
    auto act_peak = [&](const TrainOptions& opt, auto check) {
      auto dev = make_cpu_device();
      auto t = model::make_trainer_cpu(c, opt, *dev, w);
      check(*dev);
      const datasets::Batch micro[] = {test::random_tokens(2, 16, 1)};
      dev->memory().reset_peak();
      t->step(micro);
      return dev->memory().by_tag(Tag::activations).peak;
    };
    const auto plain = act_peak(o, [](Device&) {});
    for (const LoraOptions& lo : {lora(4, LoraTargets::qv), lora(8)}) {
      o.lora = lo;
      const int64_t A = model::adapter_layout(c, lo).total;
      const auto peak = act_peak(o, [&](Device& dev) {
        auto& m = dev.memory();
        EXPECT_EQ(m.by_tag(Tag::weights).live, (P + A) * S);
        EXPECT_EQ(m.by_tag(Tag::grads).live, A * S);
        EXPECT_EQ(m.by_tag(Tag::optimizer).live, 2 * A * 4);
        EXPECT_EQ(m.by_tag(Tag::master).live, p == Policy::fp32 ? 0u : A * 4);
      });
      const int64_t sites = lo.targets == LoraTargets::qv ? 2 : 7;
      EXPECT_EQ(peak, plain + c.layers * sites * 32 * lo.rank * S) << precision::policy_name(p) << " r=" << lo.rank;
    }
  }
}

// QLoRA decodes each NF4-DQ projection before its GEMM: its logits and adapter gradients equal LoRA's
// over the decoded base bit for bit; training leaves the base as it was; the base holds NF4-DQ's bytes.
TEST(Qlora, EqualsLoraOnTheDecodedBaseBitForBit) {
  const Config c = test::tiny_model();
  const auto w = test::test_weights(c, 3);
  const auto batch = test::random_tokens(2, 16, 2);
  const auto nf4 = lora::quantized_base("nf4-dq");
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    auto dev = make_cpu_device();
    TrainOptions o = test::train_options(p);
    o.lora = lora(4);
    const auto ad = nonzero_adapters(c, o.lora, 5);
    TrainOptions oq = o;
    oq.base_format = nf4;
    auto q = model::make_trainer_cpu(c, oq, *dev, w);
    q->set_trainable(ad);
    const auto decoded = q->params();
    EXPECT_GT(max_abs_diff(decoded, w), 0.0) << "NF4 is lossy";
    auto l = model::make_trainer_cpu(c, o, *dev, decoded);
    l->set_trainable(ad);
    EXPECT_EQ(q->logits(batch), l->logits(batch)) << precision::policy_name(p);
    EXPECT_EQ(q->gradients(batch), l->gradients(batch)) << precision::policy_name(p);
    const datasets::Batch micro[] = {batch};
    const auto st = q->step(micro);
    // Each projection decoded once in the forward and once in the backward, except the last layer's
    // down_proj: the backward starts with the matrix the forward decoded last.
    EXPECT_EQ(st.base_decodes, 2 * 7 * c.layers - 1);
    EXPECT_EQ(l->step(micro).base_decodes, 0);
    EXPECT_EQ(q->trainable_params(), l->trainable_params()) << precision::policy_name(p);
    EXPECT_EQ(q->params(), decoded) << "the base is frozen";
  }
  // Decoding error of NF4-DQ at these weights (block 64 > the rows' 32-48 values: one block per row).
  const auto decoded = [&] {
    auto dev = make_cpu_device();
    TrainOptions o = test::train_options(Policy::fp32);
    o.lora = lora(4);
    o.base_format = nf4;
    return model::make_trainer_cpu(c, o, *dev, w)->params();
  }();
  const auto L = model::param_layout(c);
  for (const auto& t : L.tensors) {
    const bool proj = t.shape.size() == 2 && t.offset != L.embed && t.offset != L.head;
    if (proj) continue;
    for (int64_t i = 0; i < t.size; ++i) ASSERT_EQ(decoded[t.offset + i], w[t.offset + i]) << t.name << " is not quantized";
  }
  TrainOptions bad = test::train_options(Policy::fp32);
  bad.base_format = nf4;
  EXPECT_NE(test::error_of([&] { model::validate(c, bad); }).find("needs LoRA adapters"), std::string::npos);
}

// The fine-tuning memory model (impls/lora/finetune_model.hpp) equals the step's tracked bytes per tag, to
// the byte: full fine-tuning and LoRA, fp32 and bf16-mixed, with and without full checkpointing.
TEST(LoraMemoryModel, EqualsTheTrackedBytesToTheByte) {
  Config c = test::tiny_model();
  c.layers = 3;
  const auto w = test::test_weights(c, 3);
  int checked = 0;
  for (Policy p : {Policy::fp32, Policy::bf16_mixed})
    for (bool ckpt : {false, true})
      for (auto [lo, q] : {std::pair{LoraOptions{}, false}, {lora(4, LoraTargets::qv), false},
                           {lora(8, LoraTargets::all_linear), false}, {lora(8, LoraTargets::all_linear), true}}) {
        TrainOptions o = test::train_options(p);
        o.lora = lo;
        if (q) o.base_format = lora::quantized_base("nf4-dq");
        o.checkpoint = ckpt ? model::Checkpoint::full : model::Checkpoint::none;
        auto dev = make_cpu_device();
        auto t = model::make_trainer_cpu(c, o, *dev, w);
        const datasets::Batch micro[] = {test::random_tokens(2, 16, 1)};
        dev->memory().reset_peak();
        t->step(micro);
        lora::FinetuneSetup s;
        s.cfg = c;
        s.method = q ? lora::Method::qlora : lo.rank > 0 ? lora::Method::lora : lora::Method::full;
        s.lora = lo;
        s.batch = o.batch;
        s.seq = o.seq;
        s.weight_bytes = p == Policy::fp32 ? 4 : 2;
        s.master = p != Policy::fp32;
        s.checkpoint = ckpt;
        const auto m = lora::finetune_memory(s);
        const auto& pool = dev->memory();
        const std::string what = std::string(precision::policy_name(p)) + (ckpt ? " checkpointed" : "") + (q ? " qlora" : "") +
                                 " r=" + std::to_string(lo.rank);
        EXPECT_EQ(static_cast<double>(pool.by_tag(Tag::weights).peak), m.weights) << what;
        EXPECT_EQ(static_cast<double>(pool.by_tag(Tag::grads).peak), m.grads) << what;
        EXPECT_EQ(static_cast<double>(pool.by_tag(Tag::master).peak), m.master) << what;
        EXPECT_EQ(static_cast<double>(pool.by_tag(Tag::optimizer).peak), m.optimizer) << what;
        EXPECT_EQ(static_cast<double>(pool.by_tag(Tag::activations).peak), m.activations) << what;
        EXPECT_EQ(m.trainable, lo.rank > 0 ? model::adapter_layout(c, lo).total : model::param_layout(c).total);
        ++checked;
      }
  EXPECT_EQ(checked, 16);
  // QLoRA's base: memtrade's NF4-DQ layout, about 4.127 bits per projection weight at 4096 x 4096.
  EXPECT_NEAR(8 * lora::nf4_dq_bytes(4096, 4096) / (4096.0 * 4096.0), 4.127, 0.001);
}

TEST(Lora, AdaptersRoundTripThroughPeftFiles) {
  const Config c = test::tiny_model();
  const fs::path dir = test::scratch_dir() / "lora_roundtrip";
  fs::remove_all(dir);
  const LoraOptions lo = lora(4, LoraTargets::attention, 16);
  const auto ad = nonzero_adapters(c, lo, 3);
  model::save_adapters(dir, c, lo, ad);
  LoraOptions got;
  const auto back = model::load_adapters(dir, c, got);
  EXPECT_EQ(back, ad);
  EXPECT_EQ(got.rank, 4);
  EXPECT_EQ(got.alpha, 16.f);
  EXPECT_EQ(got.targets, LoraTargets::attention);
  // Bad input names the problem.
  {
    std::ofstream(dir / "adapter_config.json") << R"({"r": 4, "lora_alpha": 16, "target_modules": ["q_proj"]})";
    EXPECT_NE(test::error_of([&] { model::load_adapters(dir, c, got); }).find("target_modules must be"), std::string::npos);
    std::ofstream(dir / "adapter_config.json") << R"({"r": 4, "lora_alpha": 16, "use_dora": true, "target_modules": ["q_proj", "v_proj"]})";
    EXPECT_NE(test::error_of([&] { model::load_adapters(dir, c, got); }).find("DoRA"), std::string::npos);
    std::ofstream(dir / "adapter_config.json") << R"({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})";
    EXPECT_NE(test::error_of([&] { model::load_adapters(dir, c, got); }).find("has the wrong shape"), std::string::npos);
  }
  fs::remove_all(dir);
}

// A PEFT-style adapter written by Python's safetensors (PEFT's names and config fields, targets listed
// in another order)
// loads into memtrade with the values it holds.
TEST(Lora, LoadsAnAdapterWrittenByPython) {
  if (std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not available (pip install safetensors numpy)";
  const Config c = test::tiny_model();
  const fs::path dir = test::scratch_dir() / "lora_python";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path script = dir / "write.py";
  std::ofstream(script) << R"PY(
import json, sys
import numpy as np
from safetensors.numpy import save_file
d = sys.argv[1]
tensors = {}
for l in range(2):
    for name, (out, inp) in {"q_proj": (32, 32), "v_proj": (16, 32)}.items():
        p = f"base_model.model.model.layers.{l}.self_attn.{name}"
        a = (np.arange(2 * inp, dtype=np.float32).reshape(2, inp) - inp) / 64.0
        b = (np.arange(out * 2, dtype=np.float32).reshape(out, 2) + l) / 128.0
        tensors[p + ".lora_A.weight"] = a
        tensors[p + ".lora_B.weight"] = b
save_file(tensors, d + "/adapter_model.safetensors", metadata={"format": "pt"})
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4, "lora_dropout": 0.05,
           "bias": "none", "target_modules": ["v_proj", "q_proj"], "base_model_name_or_path": "x",
           "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None}, open(d + "/adapter_config.json", "w"))
)PY";
  ASSERT_EQ(std::system(("python3 '" + script.string() + "' '" + dir.string() + "'").c_str()), 0);
  LoraOptions got;
  const auto v = model::load_adapters(dir, c, got);
  EXPECT_EQ(got.rank, 2);
  EXPECT_EQ(got.scaling(), 2.f);
  EXPECT_EQ(got.targets, LoraTargets::qv);
  const auto L = model::adapter_layout(c, got);
  for (const auto& t : L.tensors) {
    const int64_t l = t.name.find("layers.1.") != std::string::npos;
    const bool a = t.name.ends_with("lora_A.weight");
    const int64_t cols = t.shape[1];
    for (int64_t i = 0; i < t.size; ++i) {
      const float want = a ? (static_cast<float>(i) - static_cast<float>(cols)) / 64.f : (static_cast<float>(i) + l) / 128.f;
      ASSERT_EQ(v[t.offset + i], want) << t.name << " element " << i;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memtrade
