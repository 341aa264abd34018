// Every claim check on synthetic records, for each verdict it can take, with the shipped suite files'
// measurable forms (bands, conditions), and do-nothing controls (a flash that is naive, a mixed policy
// that keeps fp32, a loss scaler that does nothing, a quantizer that returns the weights) that must
// never give `reproduced`.
#include <gtest/gtest.h>

#include <cmath>

#include "app/techniques.hpp"
#include "harness/claims.hpp"
#include "harness/suite.hpp"
#include "impls/attention/attention.hpp"
#include "impls/lora/finetune_model.hpp"
#include "impls/quant/formats.hpp"
#include "model/model.hpp"

using namespace memtrade;

namespace {

ClaimSpec shipped(const std::string& id) {
  for (const auto& s : load_all_suites(default_suites_dir()))
    for (const auto& c : s.claims)
      if (c.id == id) return c;
  throw Error("no claim " + id);
}

ClaimResult check(const std::string& technique, const std::string& id, const std::vector<Record>& recs) {
  return registry().get(technique).claims.at(id)(shipped(id), recs);
}

Record rec(const std::string& technique, const std::string& impl, Json params, double x) {
  Record r;
  r.technique = technique;
  r.impl = impl;
  r.kase.params = std::move(params);
  r.kase.id = case_id(r.kase.params);
  r.kase.x = x;
  return r;
}

// ---- attention ----

Record attn(const char* impl, int64_t n, double extra, double seconds, const char* status = "ok") {
  Record r = rec("attention", impl, Json{{"h", 4}, {"n", n}, {"d", 64}, {"causal", false}, {"dtype", "fp32"}, {"pass", "fwd"}},
                 static_cast<double>(n));
  r.status = status;
  r.counters["peak_extra_bytes"] = extra;
  r.times_s = {seconds, seconds * 1.001, seconds * 0.999};
  return r;
}

std::vector<Record> fa_memory(bool flash_is_naive) {
  std::vector<Record> recs;
  for (int64_t n : {512, 1024, 2048, 4096}) {
    const double naive = 16.0 * n * n, flash = flash_is_naive ? naive : 256.0 * n;
    recs.push_back(attn("naive", n, naive, 1));
    recs.push_back(attn("flash", n, flash, 1));
  }
  return recs;
}

}  // namespace

TEST(ClaimRule, DecideAgainstABandWithUncertainty) {
  const Band b{0.005, 0.01};
  EXPECT_EQ(decide(0.007, 0.001, b), "reproduced");
  EXPECT_EQ(decide(0.007, 0.004, b), "inconclusive");  // straddles both edges
  EXPECT_EQ(decide(0.02, 0.005, b), "not_reproduced");
  EXPECT_EQ(decide(-0.001, 0.001, b), "not_reproduced");
  EXPECT_EQ(decide(0.0045, 0.001, b), "inconclusive");
  EXPECT_EQ(decide(NAN, 0, b), "inconclusive");
  EXPECT_EQ(decide(16, 0, Band{16, 16}), "reproduced");
  EXPECT_EQ(decide(16.5, 0, Band{16, 16}), "not_reproduced");
  EXPECT_EQ(decide(25, 0, Band{20, std::nullopt}), "reproduced");
  EXPECT_EQ(decide(INFINITY, 0.01, Band{0.02, std::nullopt}), "reproduced");  // diverged: worse than any bound
  EXPECT_EQ(combine_verdicts({"reproduced", "reproduced"}), "reproduced");
  EXPECT_EQ(combine_verdicts({"reproduced", "not_reproduced"}), "not_reproduced");
  EXPECT_EQ(combine_verdicts({"reproduced", "inconclusive"}), "inconclusive");
  EXPECT_EQ(combine_verdicts({"not_reproduced", "inconclusive"}), "not_reproduced");
  EXPECT_EQ(combine_verdicts({}), "inconclusive");
  ClaimSpec bad;
  bad.id = "x";
  bad.data = Json{{"band", {1, 0}}};
  EXPECT_THROW(claim_band(bad), Error);
  bad.data = Json{{"band", "wide"}};
  EXPECT_THROW(claim_band(bad), Error);
  EXPECT_THROW(claim_band(bad, "needs_band"), Error);
}

TEST(Claims, EveryShippedClaimHasAMeasurableFormAndACheck) {
  for (const auto& s : load_all_suites(default_suites_dir()))
    for (const auto& c : s.claims) {
      EXPECT_TRUE(c.data.contains("quantity") && c.data["quantity"].is_string()) << c.id << ": no quantity";
      EXPECT_TRUE(c.data.contains("conditions")) << c.id << ": no conditions";
      EXPECT_NO_THROW(claim_band(c)) << c.id;
      EXPECT_TRUE(registry().get(s.technique).claims.count(c.id)) << c.id << ": no check";
    }
}

TEST(Claims, FaLinear) {
  auto r = check("attention", "fa-linear", fa_memory(false));
  EXPECT_EQ(r.verdict, "reproduced") << r.measured;
  EXPECT_NE(r.measured.find("flash slope 1.00"), std::string::npos) << r.measured;
  // A flash that is naive: quadratic, no saving.
  r = check("attention", "fa-linear", fa_memory(true));
  EXPECT_EQ(r.verdict, "not_reproduced") << r.measured;
  // Naive out of memory at 4096: that point cannot be measured, and is named.
  auto recs = fa_memory(false);
  recs[6].status = "oom";
  r = check("attention", "fa-linear", recs);
  EXPECT_EQ(r.verdict, "inconclusive") << r.measured;
  EXPECT_NE(r.note.find("naive oom"), std::string::npos) << r.note;
  EXPECT_EQ(check("attention", "fa-linear", {}).verdict, "out_of_scope");
}

TEST(Claims, FaQwen8kFromTheMemoryModelCheckedAgainstTheRun) {
  // Records whose tracked bytes are the attention model's, as the suite's cases give (the attention tests
  // check the model against the allocator).
  std::vector<Record> recs;
  for (const char* impl : {"naive", "flash"}) {
    Record r = attn(impl, 256, 0, 1);
    r.name = std::string("attention/") + r.kase.id + "/" + impl;
    const attention::Dims s = attention::case_dims(r.kase);
    const attention::MemoryModel m = std::string(impl) == "naive" ? attention::naive_memory(s, Backend::cpu)
                                                                   : attention::flash_memory(s, Backend::cpu);
    r.counters["peak_extra_bytes"] = static_cast<double>(m.extra);
    r.counters["peak_bytes"] = static_cast<double>(m.live_before + m.extra);
    recs.push_back(r);
  }
  // fp16 weights alone (7.72e9 x 2 B = 14.4 GiB) are above the claimed 9 GB.
  auto r = check("attention", "fa-qwen8k", recs);
  EXPECT_EQ(r.verdict, "not_reproduced") << r.measured;
  EXPECT_NE(r.measured.find("naive 27.2 GiB (not_reproduced), flash 18.6 GiB (not_reproduced)"), std::string::npos)
      << r.measured;
  EXPECT_NE(r.measured.find("fp16 weights 14.4, KV cache 4.0"), std::string::npos) << r.measured;
  // The verdict follows the bands: bands around the modeled figures reproduce it.
  ClaimSpec spec = shipped("fa-qwen8k");
  spec.data["band"] = {18.5, 18.7};
  spec.data["naive_band"] = {27.1, 27.3};
  EXPECT_EQ(registry().get("attention").claims.at("fa-qwen8k")(spec, recs).verdict, "reproduced");
  spec.data["naive_band"] = {13.6, 18.4};
  EXPECT_EQ(registry().get("attention").claims.at("fa-qwen8k")(spec, recs).verdict, "not_reproduced");
  // One byte off the model, or a flash that allocates naive's scores: the model is not what ran.
  auto off = recs;
  off[1].counters["peak_extra_bytes"] += 1;
  off[1].counters["peak_bytes"] += 1;
  r = check("attention", "fa-qwen8k", off);
  EXPECT_EQ(r.verdict, "error");
  EXPECT_NE(r.note.find(off[1].name), std::string::npos) << r.note;
  off = recs;
  off[1].counters = off[0].counters;
  EXPECT_EQ(check("attention", "fa-qwen8k", off).verdict, "error");
  EXPECT_EQ(check("attention", "fa-qwen8k", {}).verdict, "out_of_scope");
}

TEST(Claims, Fa2TorchIsOutOfScopeWithTheSourcesAnswer) {
  const auto r = check("attention", "fa2-torch", {});
  EXPECT_EQ(r.verdict, "out_of_scope");
  EXPECT_NE(r.note.find("FlashAttention-2 arrived in 2.2"), std::string::npos) << r.note;
}

TEST(Claims, FaShort) {
  // With 5% of run-to-run noise one run cannot place the ratio inside a 5%-wide band: at best
  // inconclusive; clearly faster or clearly much slower contradicts the claim.
  std::vector<Record> recs = {attn("naive", 512, 0, 1.0), attn("flash", 512, 0, 1.075)};
  EXPECT_EQ(check("attention", "fa-short", recs).verdict, "inconclusive");
  recs = {attn("naive", 512, 0, 1.0), attn("flash", 512, 0, 0.5), attn("naive", 1024, 0, 1.0), attn("flash", 1024, 0, 0.6)};
  auto r = check("attention", "fa-short", recs);
  EXPECT_EQ(r.verdict, "not_reproduced") << r.measured;
  EXPECT_NE(r.measured.find("n=512: flash/naive 0.50"), std::string::npos) << r.measured;
  // A flash that is naive: a ratio of 1 is neither 5-10% slower nor a contradiction.
  recs = {attn("naive", 512, 0, 1.0), attn("flash", 512, 0, 1.0)};
  EXPECT_NE(check("attention", "fa-short", recs).verdict, "reproduced");
  // Reproduced is reachable when the noise allowance is small enough to resolve the band.
  ClaimSpec precise = shipped("fa-short");
  precise.data["noise"] = 0.005;
  recs = {attn("naive", 512, 0, 1.0), attn("flash", 512, 0, 1.075)};
  EXPECT_EQ(registry().get("attention").claims.at("fa-short")(precise, recs).verdict, "reproduced");
  EXPECT_EQ(check("attention", "fa-short", {}).verdict, "out_of_scope");
}

// ---- precision ----

namespace {

// One training case under a policy; bytes per tag scale the fp32 figures.
Record policy(const char* name, double state_bytes, double activation_bytes, double val_loss, double underflow = 0) {
  Record r = rec("precision", name, Json{{"dim", 128}}, 128);
  r.counters["params"] = 1000;
  r.counters["peak_bytes_weights"] = state_bytes / 4;
  r.counters["peak_bytes_master"] = state_bytes / 4;
  r.counters["peak_bytes_grads"] = state_bytes / 4;
  r.counters["peak_bytes_optimizer"] = state_bytes / 4;
  r.counters["peak_bytes_activations"] = activation_bytes;
  r.counters["peak_bytes"] = state_bytes + activation_bytes;
  r.counters["model_state_bytes_per_param"] = state_bytes / 1000;
  r.counters["val_loss"] = val_loss;
  r.counters["diverged"] = 0;
  r.counters["grad_underflow_fp16"] = underflow;
  return r;
}

}  // namespace

TEST(Claims, MixedPrecisionMemory) {
  // fp32: 16 kB of state, 64 kB of activations; bf16-mixed halves the activations only.
  std::vector<Record> recs = {policy("fp32", 16000, 64000, 2.0), policy("bf16-mixed", 16000, 32000, 2.0),
                              policy("fp16-mixed", 16000, 32000, 2.0)};
  EXPECT_EQ(check("precision", "mp-half", recs).verdict, "reproduced");  // 48/80 = 0.6
  EXPECT_EQ(check("precision", "mp-40", recs).verdict, "reproduced");    // 40% saved
  EXPECT_EQ(check("precision", "mp-16B", recs).verdict, "reproduced");
  // Small activations: state dominates, the saving is small.
  recs = {policy("fp32", 16000, 4000, 2.0), policy("bf16-mixed", 16000, 2000, 2.0), policy("fp16-mixed", 16000, 2000, 2.0)};
  EXPECT_EQ(check("precision", "mp-half", recs).verdict, "not_reproduced");
  EXPECT_EQ(check("precision", "mp-40", recs).verdict, "not_reproduced");
  // A "mixed" policy that keeps everything in fp32 (and a second fp32 copy): never reproduced.
  recs = {policy("fp32", 16000, 64000, 2.0), policy("bf16-mixed", 20000, 64000, 2.0), policy("fp16-mixed", 20000, 64000, 2.0)};
  EXPECT_EQ(check("precision", "mp-half", recs).verdict, "not_reproduced");
  EXPECT_EQ(check("precision", "mp-40", recs).verdict, "not_reproduced");
  EXPECT_EQ(check("precision", "mp-16B", recs).verdict, "not_reproduced");
  EXPECT_EQ(check("precision", "mp-half", {}).verdict, "out_of_scope");
}

TEST(Claims, Fp16Range) {
  // Unscaled fp16 loses 20% of gradient values and ends 5% worse; scaled fp16 and bf16 match fp32.
  std::vector<Record> recs = {policy("fp32", 1, 1, 2.00), policy("fp16-mixed", 1, 1, 2.002, 1e-4),
                              policy("fp16-mixed-noscale", 1, 1, 2.10, 0.2), policy("bf16-mixed", 1, 1, 2.01)};
  EXPECT_EQ(check("precision", "fp16-range", recs).verdict, "reproduced");
  // Unscaled fp16 diverged: training needs the scaling.
  recs[2].counters["diverged"] = 1;
  EXPECT_EQ(check("precision", "fp16-range", recs).verdict, "reproduced");
  // Underflow happened but training reached the same loss: the consequence is not there.
  recs[2].counters["diverged"] = 0;
  recs[2].counters["val_loss"] = 2.003;
  EXPECT_EQ(check("precision", "fp16-range", recs).verdict, "not_reproduced");
  // A loss scaler that does nothing: fp16-mixed is the unscaled run, so there is no difference to see.
  recs = {policy("fp32", 1, 1, 2.00), policy("fp16-mixed", 1, 1, 2.10, 0.2), policy("fp16-mixed-noscale", 1, 1, 2.10, 0.2),
          policy("bf16-mixed", 1, 1, 2.01)};
  EXPECT_NE(check("precision", "fp16-range", recs).verdict, "reproduced");
  // A model whose gradients do not reach fp16's underflow range cannot show the claim.
  recs = {policy("fp32", 1, 1, 2.00), policy("fp16-mixed", 1, 1, 2.002, 0), policy("fp16-mixed-noscale", 1, 1, 2.003, 1e-4),
          policy("bf16-mixed", 1, 1, 2.01)};
  const auto r = check("precision", "fp16-range", recs);
  EXPECT_EQ(r.verdict, "inconclusive") << r.note;
  EXPECT_NE(r.note.find("does not exercise"), std::string::npos) << r.note;
}

// ---- quant_model ----

namespace {

// A model-level quantization record: perplexity change `delta` +- se, per-batch losses fp32 + offset.
Record qm(const char* quantizer, const char* format, double delta, double se, double weight_err = 0.1,
          std::vector<double> batch = {}) {
  Record r = rec("quant_model", quantizer, Json{{"format", format}}, 128);
  r.status = "ok";
  r.counters["perplexity_rel_delta"] = delta;
  r.counters["perplexity_rel_delta_se"] = se;
  r.counters["rel_l2_err"] = weight_err;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    char key[48];
    std::snprintf(key, sizeof key, "val_loss_batch_%03zu", i);
    r.counters[key] = batch[i];
  }
  return r;
}

}  // namespace

TEST(Claims, Int8LosslessAndInt4Band) {
  // The trained model's checks and SmolLM2's share the rule and the shipped bands.
  for (const std::string sfx : {"", "-smollm2"}) {
    SCOPED_TRACE("claims" + sfx);
    // A model that reacts to INT4 (+0.8%, RTN +1.5%), and INT8 within 0.1%.
    std::vector<Record> recs = {qm("rtn", "int8", 0.001, 0.0002), qm("rtn", "int4-g128", 0.015, 0.0005),
                                qm("gptq", "int4-g128", 0.009, 0.0003), qm("awq", "int4-g128", 0.008, 0.0003)};
    EXPECT_EQ(check("quant_model", "int8-lossless" + sfx, recs).verdict, "reproduced");
    EXPECT_EQ(check("quant_model", "int4-mmlu" + sfx, recs).verdict, "reproduced");
    // GPTQ with act_order takes part in the best of the quantizers: at +0.7% it is the best, still in the band;
    // at -0.2% it takes the INT4 result outside it.
    recs.push_back(qm("gptq-act-order", "int4-g128", 0.007, 0.0003));
    EXPECT_EQ(check("quant_model", "int4-mmlu" + sfx, recs).verdict, "reproduced");
    recs.back().counters["perplexity_rel_delta"] = -0.002;
    EXPECT_EQ(check("quant_model", "int4-mmlu" + sfx, recs).verdict, "not_reproduced");
    recs.pop_back();
    // INT8 loses 5%: not lossless. INT4's best loses 3%: outside the 0.5-1% band.
    recs[0].counters["perplexity_rel_delta"] = 0.05;
    for (int i : {2, 3}) recs[i].counters["perplexity_rel_delta"] = 0.03;
    EXPECT_EQ(check("quant_model", "int8-lossless" + sfx, recs).verdict, "not_reproduced");
    EXPECT_EQ(check("quant_model", "int4-mmlu" + sfx, recs).verdict, "not_reproduced");
    // A model too small to show quantization error (INT4 lowers perplexity within noise): inconclusive.
    recs = {qm("rtn", "int8", 0.0, 0.0002), qm("rtn", "int4-g128", -0.001, 0.0005), qm("gptq", "int4-g128", -0.0003, 0.0003),
            qm("awq", "int4-g128", -0.0011, 0.0003)};
    EXPECT_EQ(check("quant_model", "int8-lossless" + sfx, recs).verdict, "inconclusive");
    EXPECT_EQ(check("quant_model", "int4-mmlu" + sfx, recs).verdict, "inconclusive");
    // A quantizer that returns the weights unchanged: an error, never reproduced.
    recs = {qm("rtn", "int8", 0.0, 0.0001, 0.0), qm("rtn", "int4-g128", 0.0, 0.0001, 0.0),
            qm("gptq", "int4-g128", 0.0, 0.0001, 0.0), qm("awq", "int4-g128", 0.0, 0.0001, 0.0)};
    EXPECT_EQ(check("quant_model", "int8-lossless" + sfx, recs).verdict, "error");
    EXPECT_EQ(check("quant_model", "int4-mmlu" + sfx, recs).verdict, "error");
    EXPECT_EQ(check("quant_model", "int4-mmlu" + sfx, {}).verdict, "out_of_scope");
  }
}

TEST(Claims, AwqRobust) {
  for (const std::string sfx : {"", "-smollm2"}) {
    SCOPED_TRACE("claims" + sfx);
    const std::vector<double> base = {2.0, 2.1, 1.9, 2.05, 1.95, 2.02, 1.98, 2.01};
    auto shifted = [&](double d, double jitter) {
      std::vector<double> v = base;
      for (std::size_t i = 0; i < v.size(); ++i) v[i] += d + jitter * ((i % 3) - 1.0);
      return v;
    };
    // GPTQ's loss 0.01 above AWQ's on every batch: AWQ better beyond the noise.
    std::vector<Record> recs = {qm("awq", "int4-g128", 0.01, 0.001, 0.1, shifted(0.0, 0.0)),
                                qm("gptq", "int4-g128", 0.02, 0.001, 0.1, shifted(0.01, 0.001))};
    EXPECT_EQ(check("quant_model", "awq-robust" + sfx, recs).verdict, "reproduced");
    recs[1] = qm("gptq", "int4-g128", 0.0, 0.001, 0.1, shifted(-0.01, 0.001));
    EXPECT_EQ(check("quant_model", "awq-robust" + sfx, recs).verdict, "not_reproduced");
    recs[1] = qm("gptq", "int4-g128", 0.0, 0.001, 0.1, shifted(0.0005, 0.02));  // a tiny gap inside the noise
    EXPECT_EQ(check("quant_model", "awq-robust" + sfx, recs).verdict, "inconclusive");
    // GPTQ with act_order is judged as well (the AWQ paper's GPTQ-R): AWQ must beat both variants.
    recs[1] = qm("gptq", "int4-g128", 0.02, 0.001, 0.1, shifted(0.01, 0.001));
    recs.push_back(qm("gptq-act-order", "int4-g128", 0.0, 0.001, 0.1, shifted(-0.01, 0.001)));
    const ClaimResult both = check("quant_model", "awq-robust" + sfx, recs);
    EXPECT_EQ(both.verdict, "not_reproduced") << both.measured;
    EXPECT_NE(both.measured.find("GPTQ act_order/AWQ"), std::string::npos) << both.measured;
    recs[2] = qm("gptq-act-order", "int4-g128", 0.02, 0.001, 0.1, shifted(0.02, 0.001));
    EXPECT_EQ(check("quant_model", "awq-robust" + sfx, recs).verdict, "reproduced");
    recs.pop_back();
    // A GPTQ variant run both ways: the sequential (layer-by-layer) record answers, wherever it is in the run.
    Record seq = qm("gptq", "int4-g128", 0.0, 0.001, 0.1, shifted(-0.01, 0.001));
    seq.kase.params["sequential"] = true;
    for (const bool seq_first : {false, true}) {
      std::vector<Record> both_ways = {recs[0], qm("gptq", "int4-g128", 0.02, 0.001, 0.1, shifted(0.01, 0.001))};
      both_ways.insert(seq_first ? both_ways.begin() + 1 : both_ways.end(), seq);
      const ClaimResult r = check("quant_model", "awq-robust" + sfx, both_ways);
      EXPECT_EQ(r.verdict, "not_reproduced") << seq_first;
      EXPECT_NE(r.measured.find("GPTQ (sequential)/AWQ"), std::string::npos) << r.measured;
    }
    // AWQ that returns the weights: an error.
    recs[0].counters["rel_l2_err"] = 0;
    EXPECT_EQ(check("quant_model", "awq-robust" + sfx, recs).verdict, "error");
  }
}

// ---- quant ----

TEST(Claims, Int4SevenBillionFromTheValidatedMemoryModel) {
  auto r = check("quant", "int4-7b", {});
  EXPECT_EQ(r.verdict, "reproduced") << r.measured;
  EXPECT_NE(r.note.find("memory model"), std::string::npos);
  // A measured blob that disagrees with the layout: the model is wrong, which is an error.
  Record blob = rec("quant", "packed", Json{{"n", 4096}, {"k", 4096}, {"format", "int4-g128"}}, 4096);
  blob.counters["weight_bytes"] =
      static_cast<double>(quant::layout(quant::parse_spec("int4-g128"), 4096, 4096).total_bytes());
  r = check("quant", "int4-7b", {blob});
  EXPECT_EQ(r.verdict, "reproduced") << r.note;
  EXPECT_NE(r.note.find("validated against 1 measured"), std::string::npos) << r.note;
  blob.counters["weight_bytes"] += 64;
  EXPECT_EQ(check("quant", "int4-7b", {blob}).verdict, "error");
}

// ---- kvcache ----

TEST(Claims, OffloadLatencyIsDecidedOnCudaOnly) {
  auto pair = [](Backend be, double paged_s, double offload_s, double pcie4_s) {
    std::vector<Record> recs;
    for (const char* impl : {"paged", "paged-offload"}) {
      Record r = rec("kvcache_model", impl, Json{{"kv_dtype", "fp32"}, {"seq", 512}, {"hot_tokens", 128}}, 512);
      r.backend = be;
      const double t = impl == std::string("paged") ? paged_s : offload_s;
      r.times_s = {t, t * 1.001, t * 0.999};
      if (impl != std::string("paged")) {
        r.counters["offload_modelled_pcie4_s"] = pcie4_s;
        r.counters["offload_modelled_pcie5_s"] = pcie4_s / 2;
      }
      recs.push_back(r);
    }
    return recs;
  };
  // CPU: reported with the modelled ratios, never decided.
  auto r = check("kvcache_model", "offload-latency", pair(Backend::cpu, 1.0, 3.0, 2.0));
  EXPECT_EQ(r.verdict, "out_of_scope");
  EXPECT_NE(r.measured.find("x3.00"), std::string::npos) << r.measured;
  EXPECT_NE(r.measured.find("PCIe 4 copies x3.00"), std::string::npos) << r.measured;
  EXPECT_NE(r.measured.find("PCIe 5 x2.00"), std::string::npos) << r.measured;
  EXPECT_EQ(check("kvcache_model", "offload-latency", {}).verdict, "out_of_scope");
  EXPECT_EQ(check("kvcache_model", "offload-latency", pair(Backend::cuda, 1.0, 3.0, 0)).verdict, "reproduced");
  EXPECT_EQ(check("kvcache_model", "offload-latency", pair(Backend::cuda, 1.0, 1.2, 0)).verdict, "not_reproduced");
  EXPECT_EQ(check("kvcache_model", "offload-latency", pair(Backend::cuda, 1.0, 2.02, 0)).verdict, "inconclusive");
  // Control: an "offload" that copies nothing runs as fast as paged: never reproduced.
  EXPECT_NE(check("kvcache_model", "offload-latency", pair(Backend::cuda, 1.0, 1.0, 0)).verdict, "reproduced");
}

TEST(Claims, Fp8KvPerplexityAgainstTheFp32Cache) {
  auto kv = [](const char* dt, double ppl, double se, double bytes) {
    Record r = rec("kvcache_model", "paged", Json{{"kv_dtype", dt}, {"batch", 4}, {"seq", 64}}, 64);
    r.counters["perplexity"] = ppl;
    r.counters["perplexity_rel_delta_se"] = se;
    r.counters["kv_bytes_per_token"] = bytes;
    r.counters["kv_bytes_per_token_bf16"] = 1000;
    return r;
  };
  const Record base = kv("fp32", 20.0, 0.001, 2000);
  EXPECT_EQ(check("kvcache_model", "kv-fp8", {base, kv("int8", 20.02, 0.0005, 516), kv("fp8-e4m3", 20.04, 0.0005, 516)}).verdict,
            "reproduced");
  EXPECT_EQ(check("kvcache_model", "kv-fp8", {base, kv("int8", 20.4, 0.0005, 516)}).verdict, "not_reproduced");  // +2%
  // llama.cpp's q8_0 counts as an 8-bit type: a +2% q8_0 beside a good int8 is not reproduced.
  const auto q8 = check("kvcache_model", "kv-fp8", {base, kv("int8", 20.02, 0.0005, 516), kv("q8_0", 20.4, 0.0005, 531)});
  EXPECT_EQ(q8.verdict, "not_reproduced");
  EXPECT_NE(q8.measured.find("q8_0: perplexity +2.000%"), std::string::npos) << q8.measured;
  EXPECT_EQ(check("kvcache_model", "kv-fp8", {base, kv("int8", 20.09, 0.002, 516)}).verdict, "inconclusive");
  EXPECT_EQ(check("kvcache_model", "kv-fp8", {kv("int8", 20.0, 0.001, 516)}).verdict, "out_of_scope");  // no fp32 cache
  // Control: a "quantized" cache that stores garbage is never reproduced.
  EXPECT_NE(check("kvcache_model", "kv-fp8", {base, kv("int8", 60.0, 0.01, 516)}).verdict, "reproduced");
}

TEST(Claims, OffloadSlowIsDecidedOnCudaOnly) {
  auto pair = [](Backend be, double ratio) {
    std::vector<Record> recs;
    for (const char* impl : {"device", "offload"}) {
      Record r = rec("offload", impl, Json{{"policy", "bf16-mixed"}, {"layers", 4}}, 4);
      r.backend = be;
      const double t = impl == std::string("device") ? 1.0 : ratio;
      r.times_s = {t, t, t};
      r.counters["offload_host_optimizer_s"] = 0.1;
      r.counters["offload_modelled_pcie4_s"] = 0.2;
      recs.push_back(r);
    }
    return recs;
  };
  const auto cpu = check("offload", "offload-slow", pair(Backend::cpu, 1.17));
  EXPECT_EQ(cpu.verdict, "out_of_scope");
  EXPECT_NE(cpu.measured.find("x1.17"), std::string::npos) << cpu.measured;
  EXPECT_EQ(check("offload", "offload-slow", pair(Backend::cuda, 1.6)).verdict, "not_reproduced");
  EXPECT_EQ(check("offload", "offload-slow", pair(Backend::cuda, 1.0)).verdict, "not_reproduced");  // control: no copies
  // The band (15-20%) is narrower than the 5% run-to-run allowance on either side: a ratio inside it can
  // only be inconclusive.
  EXPECT_EQ(check("offload", "offload-slow", pair(Backend::cuda, 1.17)).verdict, "inconclusive");
}

TEST(Claims, CheckpointingSavingAndTime) {
  auto step = [](const char* impl, double activations, double seconds) {
    Record r = rec("checkpoint", impl, Json{{"layers", 8}, {"dim", 128}}, 8);
    r.counters["peak_bytes_weights"] = 100;
    r.counters["peak_bytes_grads"] = 100;
    r.counters["peak_bytes_optimizer"] = 200;
    r.counters["peak_bytes_activations"] = activations;
    r.counters["recompute_flops_fraction"] = 0.28;
    r.times_s = {seconds, seconds, seconds};
    return r;
  };
  // state 400 + activations 1600 -> 400 + 400: -60% (inside 50-70%).
  const auto mem_only = check("checkpoint", "ckpt", {step("none", 1600, 1.0), step("full", 400, 2.0)});
  EXPECT_EQ(mem_only.verdict, "not_reproduced") << mem_only.measured;  // twice the time
  EXPECT_NE(mem_only.measured.find("-60%"), std::string::npos) << mem_only.measured;
  // Inside both bands, the time part is at best inconclusive: 20-30% is narrower than +- 5% around it.
  EXPECT_EQ(check("checkpoint", "ckpt", {step("none", 1600, 1.0), step("full", 400, 1.25)}).verdict, "inconclusive");
  EXPECT_EQ(check("checkpoint", "ckpt", {step("none", 1600, 1.0)}).verdict, "out_of_scope");
  // Control: a "checkpointing" that keeps every activation saves nothing.
  EXPECT_EQ(check("checkpoint", "ckpt", {step("none", 1600, 1.0), step("full", 1600, 1.25)}).verdict, "not_reproduced");
}

TEST(Claims, ZeroOffloadMemoryFromTrackedBytesPerParameter) {
  // A mixed-precision device step holds 16 B/param of model state; an offloaded one 2 on the device and
  // 14 on the host (ZeRO-Offload's split), exactly.
  auto run = [](const char* impl, double dev_bpp, double host_bpp, const char* policy = "bf16-mixed") {
    Record r = rec("offload", impl, Json{{"policy", policy}, {"layers", 4}}, 4);
    r.counters["model_state_bytes_per_param"] = dev_bpp;
    r.counters["host_model_state_bytes_per_param"] = host_bpp;
    r.counters["peak_bytes"] = dev_bpp * 1000;
    return r;
  };
  const std::vector<Record> good = {run("device", 16, 0), run("offload", 2, 14)};
  EXPECT_EQ(check("offload", "offload-60", good).verdict, "reproduced");  // -87.5%
  // 13e9 parameters x 2 bytes of 16-bit weights are 26 GB: over the claim's 24 GB card before any activation.
  const auto b13 = check("offload", "offload-13b", good);
  EXPECT_EQ(b13.verdict, "not_reproduced");
  EXPECT_NE(b13.measured.find("26.0 GB of model state on the device"), std::string::npos) << b13.measured;
  EXPECT_EQ(check("offload", "zero-stages", good).verdict, "reproduced");
  EXPECT_EQ(check("offload", "offload-60", {run("device", 16, 0)}).verdict, "out_of_scope");
  EXPECT_EQ(check("offload", "offload-13b", {run("device", 16, 0)}).verdict, "out_of_scope");
  // Control: an "offload" that moves nothing saves nothing, and disagrees with the memory model.
  const std::vector<Record> nothing = {run("device", 16, 0), run("offload", 16, 0)};
  EXPECT_EQ(check("offload", "offload-60", nothing).verdict, "not_reproduced");
  EXPECT_EQ(check("offload", "offload-13b", nothing).verdict, "not_reproduced");
  EXPECT_EQ(check("offload", "zero-stages", nothing).verdict, "not_reproduced");
  // Without a mixed-precision offload run the formulas are not checked against anything.
  EXPECT_EQ(check("offload", "zero-stages", {}).verdict, "inconclusive");
}

TEST(Claims, PagedUtilization) {
  auto serve = [](const char* impl, double utilization) {
    Record r = rec("kvcache_serving", impl, Json{{"trace", "sharegpt"}, {"block", 16}, {"budget_tokens", 65536}}, 16);
    r.counters["kv_utilization"] = utilization;
    r.counters["decode_tokens_per_step"] = 10;
    return r;
  };
  EXPECT_EQ(check("kvcache_serving", "paged", {serve("contiguous", 0.3), serve("paged", 0.98)}).verdict, "reproduced");
  EXPECT_EQ(check("kvcache_serving", "paged", {serve("contiguous", 0.3), serve("paged", 0.9)}).verdict, "not_reproduced");
  EXPECT_EQ(check("kvcache_serving", "paged", {serve("contiguous", 0.3)}).verdict, "out_of_scope");
  // Control: a "paged" cache that reserves as the contiguous one does.
  EXPECT_EQ(check("kvcache_serving", "paged", {serve("contiguous", 0.3), serve("paged", 0.3)}).verdict, "not_reproduced");
  // int4-kivi's residual is reserved by the storage type, not lost to the allocator: listed, not judged.
  Record kivi = serve("paged", 0.77);
  kivi.counters["kv_residual_tokens"] = 103;
  const auto k = check("kvcache_serving", "paged", {serve("contiguous", 0.3), serve("paged", 0.98), kivi});
  EXPECT_EQ(k.verdict, "reproduced");
  EXPECT_NE(k.measured.find("77.0%"), std::string::npos) << k.measured;
  EXPECT_NE(k.measured.find("not judged"), std::string::npos) << k.measured;
  EXPECT_EQ(check("kvcache_serving", "paged", {serve("contiguous", 0.3), kivi}).verdict, "out_of_scope");
}

TEST(Claims, KvShareFromTheValidatedPerTokenFormula) {
  auto contiguous = [](double tracked) {
    Record r = rec("kvcache", "contiguous",
                   Json{{"batch", 4}, {"context", 1024}, {"kv_heads", 8}, {"head_dim", 128}, {"kv_dtype", "bf16"}}, 1024);
    r.counters["peak_bytes_kv"] = tracked;
    return r;
  };
  const double exact = 4.0 * 1024 * 2 * 8 * 128 * 2;  // batch x context x [K, V] x kv_heads x head_dim x bf16
  // The shipped configurations are all under 70% at 32K tokens (Llama-2-7B 56%, GQA Qwen2.5-7B 11%).
  const auto r = check("kvcache", "kv-70", {contiguous(exact)});
  EXPECT_EQ(r.verdict, "not_reproduced");
  EXPECT_NE(r.measured.find("Llama-2-7B: 56%"), std::string::npos) << r.measured;
  EXPECT_EQ(check("kvcache", "kv-70", {contiguous(exact + 1)}).verdict, "error");  // the formula disagrees with the run
  EXPECT_EQ(check("kvcache", "kv-70", {}).verdict, "out_of_scope");
  ClaimSpec big = shipped("kv-70");  // a model whose weights are small beside its KV: over 70%
  big.data["models"] = Json::array({Json{{"name", "tiny"}, {"layers", 32}, {"kv_heads", 32}, {"head_dim", 128}, {"params", 1e9}}});
  EXPECT_EQ(registry().get("kvcache").claims.at("kv-70")(big, {contiguous(exact)}).verdict, "reproduced");
  // An int4-kivi request also holds its fp16 residual (32 tokens of K and V): counted, not an error.
  Record kivi = contiguous(0);
  kivi.kase.params["kv_dtype"] = "int4-kivi";
  const double kivi_exact = 4.0 * (1024 * 2 * 8 * (64 + 16) + 32 * 2 * 8 * 128 * 2);
  kivi.counters["peak_bytes_kv"] = kivi_exact;
  EXPECT_EQ(check("kvcache", "kv-70", {contiguous(exact), kivi}).verdict, "not_reproduced");
  kivi.counters["peak_bytes_kv"] = kivi_exact - 32 * 2 * 8 * 128 * 2;  // the records alone
  EXPECT_EQ(check("kvcache", "kv-70", {contiguous(exact), kivi}).verdict, "error");
}

TEST(Claims, AccumulationEqualsTheLargeBatchOnlyWithTokenNormalization) {
  const double u = std::ldexp(1.0, -24);  // fp32's unit roundoff
  auto pair = [&](double diff_u, double mean_of_means_u) {
    std::vector<Record> recs;
    for (const char* impl : {"large-batch", "accumulate"}) {
      Record r = rec("accum", impl, Json{{"policy", "fp32"}, {"accum", 4}, {"batch", 2}, {"pad", 0.5}}, 4);
      r.counters["val_loss"] = 2.0;
      r.counters["peak_bytes_activations"] = 100;
      r.times_s = {1, 1, 1};
      if (impl == std::string("accumulate")) {
        r.counters["grad_rel_diff_vs_reference"] = diff_u * u;
        r.counters["mean_of_means_grad_rel_err"] = mean_of_means_u * u;
      }
      recs.push_back(r);
    }
    return recs;
  };
  EXPECT_EQ(check("accum", "accum-eq", pair(1.0, 1e5)).verdict, "reproduced");
  EXPECT_EQ(check("accum", "accum-eq", pair(1e4, 1e5)).verdict, "not_reproduced");  // accumulation that is off
  // Control: micro-batches whose token counts make mean of means harmless show nothing about the mistake.
  EXPECT_EQ(check("accum", "accum-eq", pair(1.0, 1.0)).verdict, "not_reproduced");
  EXPECT_EQ(check("accum", "accum-eq", {}).verdict, "out_of_scope");
}

namespace {

// A CPU fp32 fine-tuning record of a small model whose tracked peaks are the memory model's, to the byte
// (`off` bytes added to the weights' peak), with a validation loss.
Record finetune(const char* impl, double val_loss, double off = 0) {
  model::Config c;
  c.vocab = 64, c.dim = 128, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 256, c.context = 64;
  Json p = model::to_json(c);
  p["policy"] = "fp32", p["batch"] = 2, p["seq"] = 16, p["checkpoint"] = "none";
  Record r = rec("lora", impl, p, 2);
  lora::FinetuneSetup s;
  s.cfg = c;
  s.batch = 2, s.seq = 16, s.weight_bytes = 4, s.master = false;
  const std::string name = impl;
  if (name != "full") {
    s.method = name.starts_with("qlora") ? lora::Method::qlora : lora::Method::lora;
    s.lora.rank = std::stoi(name.substr(name.rfind('r') + 1));
    s.lora.targets = name.find("qv") != std::string::npos ? model::LoraTargets::qv : model::LoraTargets::all_linear;
  }
  const lora::FinetuneMemory m = lora::finetune_memory(s);
  r.counters["peak_bytes_weights"] = m.weights + off;
  r.counters["peak_bytes_grads"] = m.grads;
  r.counters["peak_bytes_master"] = m.master;
  r.counters["peak_bytes_optimizer"] = m.optimizer;
  r.counters["peak_bytes_activations"] = m.activations;
  r.counters["val_loss"] = val_loss;
  r.counters["val_loss_pretrained"] = 2.66;
  return r;
}

}  // namespace

TEST(Claims, LoraR64LossFromTheTaskAndMemoryFromTheValidatedModel) {
  const std::vector<Record> close = {finetune("full", 2.52), finetune("lora-all-r64", 2.55)};
  // The shipped memory band (5-15%) is not met on Llama-2-7B at 1 x 512 with checkpointing: the adapters'
  // 160M parameters add 2.37% of the parameters but 16 B each of state, 18.7% of the step.
  const auto r = check("lora", "lora-r64", close);
  EXPECT_EQ(r.verdict, "not_reproduced");
  EXPECT_NE(r.measured.find("160M trainable parameters (2.37%)"), std::string::npos) << r.measured;
  EXPECT_NE(r.measured.find("(+18.7%)"), std::string::npos) << r.measured;
  EXPECT_NE(r.note.find("checked against 2 measured step(s)"), std::string::npos) << r.note;
  ClaimSpec wide = shipped("lora-r64");  // the loss half alone decides once the memory half holds
  wide.data["memory_band"] = Json::array({0.1, 0.2});
  auto decide_wide = [&](const std::vector<Record>& recs) { return registry().get("lora").claims.at("lora-r64")(wide, recs).verdict; };
  EXPECT_EQ(decide_wide(close), "reproduced");
  EXPECT_EQ(decide_wide({finetune("full", 2.52), finetune("lora-all-r64", 2.65)}), "not_reproduced");  // x1.052
  // Control: adapters that never train keep the pretrained loss, which full fine-tuning beats.
  EXPECT_EQ(decide_wide({finetune("full", 2.52), finetune("lora-all-r64", 2.66)}), "not_reproduced");
  // A step whose tracked bytes are not the model's makes the memory half unfounded.
  EXPECT_EQ(decide_wide({finetune("full", 2.52), finetune("lora-all-r64", 2.55, 1)}), "error");
  EXPECT_EQ(decide_wide({finetune("full", 2.52)}), "out_of_scope");
  EXPECT_EQ(decide_wide({finetune("full", 2.52), finetune("lora-qv-r64", 2.55)}), "out_of_scope");  // not all linear
}

TEST(Claims, Lora3xFromTheMemoryModel) {
  // GPT-3-sized Llama shape: tied 50257 x 12288 embedding, 96 layers of 4 d^2 attention, 3 d f MLP and two
  // norms, a final norm; LoRA r=4 on q and v: 96 x 2 x 4 (d + d) adapter parameters.
  const double d = 12288, f = 32768;
  const double params = 50257 * d + 96 * (4 * d * d + 3 * d * f + 2 * d) + d, adapters = 96 * 2 * 4 * (d + d);
  char want[64];
  std::snprintf(want, sizeof want, "trainable %.0fx fewer", params / adapters);
  const auto r = check("lora", "lora-3x", {});
  EXPECT_NE(r.measured.find(want), std::string::npos) << want << " in " << r.measured;
  // 16 B of state per trained parameter against the source's ~7: memory falls 6.9x, not 3x.
  EXPECT_EQ(r.verdict, "not_reproduced");
  ClaimSpec spec = shipped("lora-3x");
  spec.data["memory_band"] = Json::array({6, 8});
  EXPECT_EQ(registry().get("lora").claims.at("lora-3x")(spec, {}).verdict, "reproduced");
  spec.data["rank"] = 64;  // 16x the adapters: 578x fewer trainable parameters, under the band
  EXPECT_EQ(registry().get("lora").claims.at("lora-3x")(spec, {}).verdict, "not_reproduced");
}

TEST(Claims, Qlora65bFromTheValidatedMemoryModel) {
  const std::vector<Record> steps = {finetune("full", 2.52), finetune("qlora-all-r64", 2.55)};
  const auto r = check("lora", "qlora-65b", steps);
  // 65.3e9 weights, most at 4.127 bits, plus fp32 state for the adapters: 48.1 GB, over 24 and over 48.
  EXPECT_EQ(r.verdict, "not_reproduced");
  EXPECT_NE(r.measured.find("fits 48 GB (the paper): no"), std::string::npos) << r.measured;
  EXPECT_NE(r.measured.find("LLaMA-33B"), std::string::npos) << r.measured;
  EXPECT_EQ(check("lora", "qlora-65b", {finetune("full", 2.52), finetune("qlora-all-r64", 2.55, 1)}).verdict, "error");
  ClaimSpec small = shipped("qlora-65b");  // LLaMA-7B's shape fits the 24 GB band
  small.data["model"] = Json{{"name", "LLaMA-7B"}, {"vocab", 32000}, {"dim", 4096}, {"layers", 32}, {"heads", 32}, {"ffn", 11008}};
  const auto s = registry().get("lora").claims.at("qlora-65b")(small, steps);
  EXPECT_EQ(s.verdict, "reproduced");
  EXPECT_NE(s.measured.find("fits 24 GB (the seed): yes"), std::string::npos) << s.measured;
}
