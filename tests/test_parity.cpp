// One parity test for every implementation, as ggml's test-backend-ops checks every op of every
// backend: each technique x implementation x backend x case of its suite's `test` profile runs once and
// its error against the float64 oracle is judged by the technique's ErrorRule (FlashAttention's rule
// against the reference on the same case by default; the reference itself within a bound derived from
// the dtype). A new implementation is covered by being registered. CUDA implementations skip with the
// reason when there is no device. Also: every counter an implementation reports is declared, and every
// suite file passes its technique's schema.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "app/techniques.hpp"
#include "harness/results.hpp"
#include "harness/runner.hpp"
#include "harness/suite.hpp"
#include "impls/kvcache/kv_cache.hpp"
#include "impls/quant/calibration.hpp"
#include "impls/quant/formats.hpp"
#include "impls/quant/quantizers.hpp"
#include "test_util.hpp"

using namespace memtrade;

namespace {

struct ParityCase {
  std::string technique, suite;
  Case kase;
  std::string impl;
  Backend backend;
};

void PrintTo(const ParityCase& c, std::ostream* os) {
  *os << c.suite << "/" << c.kase.id << "/" << c.impl << " (" << backend_name(c.backend) << ")";
}

std::vector<ParityCase> all_cases() {
  std::vector<ParityCase> out;
  for (const auto& s : load_all_suites(default_suites_dir())) {
    const Technique& t = registry().get(s.technique);
    const Profile* test = nullptr;
    for (const auto& p : s.profiles)
      if (p.name == "test") test = &p;
    if (!test) continue;
    for (const auto& c : test->cases)
      for (const auto& i : t.impls) {
        bool applicable = true;
        try {
          applicable = i.not_applicable(c).empty();
        } catch (const std::exception&) {
        }
        if (applicable) out.push_back({t.name, s.name, c, i.name, i.backend});
      }
  }
  return out;
}

std::string test_name(const testing::TestParamInfo<ParityCase>& info) {
  std::string n = info.param.suite + "_" + info.param.kase.id + "_" + info.param.impl + "_" +
                  std::string(backend_name(info.param.backend));
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n + "_" + std::to_string(info.index);
}

const Impl& impl_of(const Technique& t, const std::string& name, Backend be) {
  for (const auto& i : t.impls)
    if (i.name == name && i.backend == be) return i;
  throw Error("no implementation " + name);
}

// Problems and the reference's error, once per case (the problem is shared as the runner shares it).
struct Prepared {
  std::unique_ptr<Problem> problem;
  std::optional<ErrorStats> reference;  // empty: no CPU reference implementation covers the case
  std::map<std::string, double> reference_counters;
};

Prepared& prepared(const Technique& t, const Case& c) {
  static std::map<std::string, Prepared> cache;
  const std::string key = t.name + "/" + c.suite + "/" + c.id;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  Prepared p;
  t.validate(c);
  p.problem = t.prepare(c);
  for (const auto& i : t.impls)
    if (i.role == Role::reference && i.backend == Backend::cpu && i.not_applicable(c).empty()) {
      auto dev = make_cpu_device();
      auto w = i.make(c, *p.problem, *dev);
      w->run();
      p.reference = w->error();
      w->add_counters(p.reference_counters);
      break;
    }
  return cache[key] = std::move(p);
}

bool declared(const Technique& t, const std::string& counter) {
  if (t.schema.metric(counter)) return true;
  for (const auto& m : harness_metrics())
    if (m.matches(counter)) return true;
  return false;
}

class Parity : public testing::TestWithParam<ParityCase> {};

}  // namespace

TEST_P(Parity, ErrorAgainstTheFloat64OracleWithinTheTechniquesRule) {
  const ParityCase& pc = GetParam();
  const Technique& t = registry().get(pc.technique);
  const Impl& impl = impl_of(t, pc.impl, pc.backend);
  std::unique_ptr<Device> dev;
  try {
    dev = pc.backend == Backend::cpu ? make_cpu_device() : make_cuda_device();
  } catch (const Skip& e) {
    GTEST_SKIP() << e.what();
  }
  for (TrackedAllocator* a : {&dev->memory(), &dev->host()}) a->set_guard_bytes(64);
  Prepared& prep = prepared(t, pc.kase);
  std::unique_ptr<Workload> w;
  try {
    w = impl.make(pc.kase, *prep.problem, *dev);
  } catch (const Skip& e) {
    GTEST_SKIP() << e.what();
  }
  w->run();
  dev->synchronize();
  const ErrorStats e = w->error();
  std::map<std::string, double> counters;
  w->add_counters(counters);
  Impl judged_as = impl;
  ErrorStats ref = e;
  std::map<std::string, double> ref_counters = counters;
  if (impl.role == Role::reference || !prep.reference) {
    judged_as.role = Role::reference;  // no reference covers this case: the implementation is judged as one
  } else {
    ref = *prep.reference;
    ref_counters = prep.reference_counters;
  }
  const Verdict v = judge_outputs(t, pc.kase, *prep.problem, judged_as, e, counters, ref, ref_counters);
  RecordProperty("verdict", v.why);  // the margin, in --gtest_output=json
  EXPECT_TRUE(v.pass) << pc.suite << "/" << pc.kase.id << "/" << pc.impl << " (" << backend_name(pc.backend)
                      << "): " << v.why;

  for (const auto& [k, v] : counters)
    EXPECT_TRUE(declared(t, k)) << "counter '" << k << "' of " << pc.impl << " is not declared in technique "
                                << t.name << "'s schema";
  w.reset();
  EXPECT_EQ(dev->memory().total().live, 0u) << "the workload did not free what it allocated";
  for (TrackedAllocator* a : {&dev->memory(), &dev->host()})
    for (const auto& v : a->guard_violations()) ADD_FAILURE() << v;
}

INSTANTIATE_TEST_SUITE_P(EveryImplementation, Parity, testing::ValuesIn(all_cases()), test_name);

TEST(Parity, EveryRegisteredCpuImplementationIsCovered) {
  const auto cases = all_cases();
  for (const auto& t : registry().all())
    for (const auto& i : t.impls) {
      bool found = false;
      for (const auto& c : cases) found = found || (c.technique == t.name && c.impl == i.name && c.backend == i.backend);
      EXPECT_TRUE(found) << t.name << "/" << i.name << " (" << backend_name(i.backend)
                         << ") runs on no case of its suite's test profile";
    }
}

TEST(Parity, EverySuiteFilePassesItsTechniquesSchema) {
  for (const auto& s : load_all_suites(default_suites_dir())) {
    try {
      check_suite(registry(), s);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

namespace {

// Runs the test profile of a suite file written into a scratch directory (CPU, no probe) and returns the
// results file's path.
std::string run_scratch_suite(const std::string& name, const std::string& json, const std::string& filter = "") {
  namespace fs = std::filesystem;
  const fs::path dir = test::scratch_dir() / name;
  fs::create_directories(dir);
  std::ofstream(dir / (name + ".json")) << json;
  RunOptions o;
  o.suites = {name};
  o.profile = "test";
  o.backend = "cpu";
  o.suites_dir = dir;
  o.out = (dir / "results.json").string();
  o.verbose = false;
  o.probe = false;
  o.filter = filter;
  run_suites(registry(), o);
  return o.out.string();
}

}  // namespace

// quant_model's `sequential` (GPTQ's layer-by-layer calibration) on the test profile's tiny model: with one
// layer its inputs are the fp32 model's either way, so sequential GPTQ gives the same weights and
// perplexity to the bit; with two, the second layer is calibrated on the quantized first layer's outputs
// and its weights differ. RTN and AWQ do not take it (not run).
TEST(QuantModel, SequentialGptqCalibratesLaterLayersOnTheQuantizedModel) {
  const std::string out = run_scratch_suite("quant_model_sequential", R"({"suite": "quant_model_sequential",
    "technique": "quant_model", "x_param": "layers",
    "profiles": {"test": {"repetitions": 1, "min_time_s": 0.0001, "grid": [{"dim": [32], "layers": [1, 2],
      "heads": [2], "kv_heads": [1], "ffn": [64], "context": [16], "batch": [2], "steps": [20], "lr": [0.003],
      "warmup_steps": [2], "eval_batches": [2], "seed": [1], "calib_batches": [2], "format": ["int4-g32"],
      "sequential": [false, true]}]}}})");
  std::map<std::string, const Summary*> by;  // "layers/sequential/impl"
  const LoadedResults loaded = load_results(out);
  for (const auto& s : loaded.cases) {
    if (s.status != "ok" || s.counters.count("rel_l2_err") == 0) continue;
    by[std::to_string(s.params.at("layers").get<int>()) + "/" + (s.params.at("sequential").get<bool>() ? "seq" : "fp32") +
       "/" + s.impl] = &s;
  }
  for (const std::string impl : {"gptq", "gptq-act-order"}) {
    SCOPED_TRACE(impl);
    for (const char* k : {"1/fp32/", "1/seq/", "2/fp32/", "2/seq/"}) ASSERT_TRUE(by.count(k + impl)) << k;
    const auto err = [&](const std::string& k) { return by.at(k + impl)->counters.at("rel_l2_err"); };
    const auto ppl = [&](const std::string& k) { return by.at(k + impl)->counters.at("perplexity"); };
    EXPECT_EQ(err("1/seq/"), err("1/fp32/"));
    EXPECT_EQ(ppl("1/seq/"), ppl("1/fp32/"));
    EXPECT_NE(err("2/seq/"), err("2/fp32/"));
  }
  for (const std::string impl : {"rtn", "awq"}) {
    EXPECT_TRUE(by.count("2/fp32/" + impl)) << impl;
    EXPECT_FALSE(by.count("2/seq/" + impl)) << impl << " does not take sequential calibration";
  }
}

// The quant technique's calibration settings reach the quantizers: `gptq-act-order` is GPTQ with
// act_order on the case's calib_rows calibration rows (the first min(calib_rows, 256) of the draw and
// the rows after the measured and held-out ones), with the channels shared_factors makes correlated.
// RTN's held-out error does not depend on calib_rows (the held-out rows do not move).
TEST(Quant, CalibrationParametersReachTheQuantizers) {
  // the counters compared are the quantizers', the same for every implementation: the reference's suffice
  const std::string out = run_scratch_suite("quant_calibration", R"({"suite": "quant_calibration", "technique": "quant",
    "x_param": "n", "profiles": {"test": {"repetitions": 1, "min_time_s": 0.0001, "grid": [{"n": [16], "k": [64],
      "m": [1], "format": ["int4-g32"], "quantizer": ["rtn", "gptq", "gptq-act-order"], "calib_rows": [256, 300],
      "shared_factors": [4]}]}}})", "/reference$");
  std::map<std::string, double> weight_err, held;  // by "quantizer/calib_rows", reference records
  for (const auto& s : load_results(out).cases) {
    if (s.status != "ok" || s.impl != "reference") continue;
    const std::string key = s.params.at("quantizer").get<std::string>() + "/" + std::to_string(s.params.at("calib_rows").get<int>());
    weight_err[key] = s.counters.at("weight_rel_l2_err");
    held[key] = s.counters.at("heldout_output_mse");
  }
  ASSERT_EQ(weight_err.size(), 6u);
  EXPECT_EQ(held.at("rtn/256"), held.at("rtn/300"));
  const int64_t N = 16, K = 64, calib = 300, measured = 1, held_rows = 256;
  const auto W = quant::synthetic_weights(N, K, 11);
  const auto all = quant::synthetic_activations(256 + measured + held_rows + (calib - 256), K, 13, 0.01, 50, 4);
  std::vector<float> X(all.begin(), all.begin() + 256 * K);
  X.insert(X.end(), all.begin() + (256 + measured + held_rows) * K, all.end());
  const quant::Spec spec = quant::parse_spec("int4-g32");
  quant::GptqOptions act;
  act.act_order = true;
  auto rel_l2 = [&](const std::vector<float>& deq) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < W.size(); ++i) {
      num += std::pow(static_cast<double>(deq[i]) - W[i], 2);
      den += std::pow(static_cast<double>(W[i]), 2);
    }
    return std::sqrt(num / den);
  };
  const double plain = rel_l2(quant::quantize_gptq(spec, W.data(), N, K, X.data(), calib).deq);
  const double ordered = rel_l2(quant::quantize_gptq(spec, W.data(), N, K, X.data(), calib, act).deq);
  ASSERT_NE(plain, ordered);
  EXPECT_EQ(weight_err.at("gptq/300"), plain);
  EXPECT_EQ(weight_err.at("gptq-act-order/300"), ordered);
}

// The kvcache decode cases' bytes read per step, from which their bandwidth is computed, are what the kernels
// read: every request's records, and for the KIVI types the fp16 residual of the tokens after the last
// complete group (37 = 32 in records + 5 in the residual), on every CPU layout (the KIVI types do not offload).
TEST(KvCache, DecodeBytesReadCountTheResidualsFp16TokensNotRecords) {
  const std::string out = run_scratch_suite("kvcache_bytes", R"({"suite": "kvcache_bytes", "technique": "kvcache",
    "x_param": "context", "profiles": {"test": {"repetitions": 1, "min_time_s": 0.0001, "grid": [{"batch": [3],
      "context": [37, 64], "heads": [4], "kv_heads": [2], "head_dim": [32], "kv_dtype": ["bf16", "int4-kivi"],
      "block": [8], "hot_tokens": [16]}]}}})");
  int checked = 0;
  for (const auto& s : load_results(out).cases) {
    if (s.status != "ok") {
      ADD_FAILURE() << s.name << ": " << s.status << " " << s.detail;
      continue;
    }
    const std::string dtype = s.params.at("kv_dtype").get<std::string>();
    const int64_t context = s.params.at("context").get<int64_t>(), batch = 3;
    const kvcache::KvShape shape{1, 2, 32, kvcache::parse_kv_type(dtype)};
    const int64_t records = shape.kivi() ? context / 32 * 32 : context;
    const double expect = static_cast<double>(
        batch * (records * shape.entry_bytes() + (context - records) * shape.residual_entry_bytes()));
    EXPECT_EQ(s.counters.at("kv_bytes_read"), expect) << s.name;
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 3 + 2 * 2) << "bf16: contiguous, paged, paged-offload; int4-kivi: the first two";
}
