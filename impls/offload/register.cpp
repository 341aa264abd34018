// Two techniques:
//
// `offload`: ZeRO-Offload on one device (model/train.hpp's TrainOptions::offload). The implementations train
// the same case:
//   device   (reference) weights, gradients, fp32 master and both moments on the device
//   offload  the device keeps the 16-bit weights (and one segment's gradients during the backward; two
//            on CUDA, where one's copy to the host overlaps the next one's backward); the fp32 master, the
//            moments and the gradients live in the host pool, AdamW runs on the host (the SIMD kernel of
//            model/cpu_adam.hpp) and the updated weights are copied back, on CUDA overlapped with it
//   offload-dpu  offload with DeepSpeed's one-step delayed parameter update from step dpu_from on: the
//            host's AdamW with a step's gradients runs on a host thread during the next step's forward and
//            backward, so gradients are taken at weights one update old (validation too: it reads the
//            device's weights, one update behind, as a DPU run's device holds them); a second host
//            gradient buffer holds the pending step's
// The timed call is one optimizer step: device and host peaks by tag, bytes copied each way, the host's
// optimizer time (measured) and the copies' time at 25 and 50 GB/s (modelled, labelled as such). With one
// micro-batch per step the gradients and updates equal the device step's bit for bit. Claims zero-stages,
// offload-60, offload-13b (the memory model of zero_model.hpp, checked against the measured bytes per
// parameter first) and offload-slow (needs a GPU: on the CPU backend device and host are one CPU).
//
// `cpu_adam`: the host AdamW kernel alone: the scalar reference (adamw_step per element, OpenMP) against
// the runtime-dispatched SIMD kernel, one step over n parameters with gradients and working weights in
// grad_dtype; GB/s and the fraction of the copy bandwidth over the bytes a step must read and write
// (master, both moments read and written, the gradient read, the weight written). Error: the updated
// master weights against a float64 AdamW (PyTorch's formula) from the same state.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/simd/targets.hpp"
#include "datasets/random.hpp"
#include "harness/claims.hpp"
#include "harness/stats.hpp"
#include "impls/offload/zero_model.hpp"
#include "model/cpu_adam.hpp"
#include "model/layers.hpp"
#include "model/train_bench.hpp"

namespace memtrade::offload {

void register_technique(Registry& r);

namespace {

using model::TrainBench;

bool mixed(const Record& r) {
  const std::string p = r.kase.params.value("policy", std::string("fp32"));
  return p == "bf16-mixed" || p == "fp16-mixed" || p == "fp16-mixed-noscale";
}

// The ok offload records (impl "offload", or "offload-dpu" with `dpu`) of mixed-precision cases (the ZeRO
// formulas' 2 + 2 + 12 bytes).
std::vector<const Record*> mixed_offload_records(const std::vector<Record>& recs, bool dpu = false) {
  std::vector<const Record*> out;
  for (const auto& r : recs)
    if (r.technique == "offload" && r.impl == (dpu ? "offload-dpu" : "offload") && r.status == "ok" && mixed(r))
      out.push_back(&r);
  return out;
}

// The memory model against this run: a mixed-precision device step holds the stage-0 bytes per parameter
// and an offloaded one ZeRO-Offload's device and host bytes, exactly. Returns "" or what differs.
std::string model_vs_measured(const std::vector<Record>& recs, int& checked) {
  const ZeroMemory stage0 = zero_model_state({1, 0, 1, false, 12});
  std::string bad;
  checked = 0;
  for (const bool dpu : {false, true}) {
    const ZeroMemory off = zero_model_state({1, 2, 1, true, 12, dpu});
    for (const Record* r : mixed_offload_records(recs, dpu)) {
      ++checked;
      if (r->counter("model_state_bytes_per_param") != off.device_bytes ||
          r->counter("host_model_state_bytes_per_param") != off.host_bytes)
        bad += r->name + fmt(" holds %.3f B/param on the device and %.3f on the host; ", r->counter("model_state_bytes_per_param"),
                             r->counter("host_model_state_bytes_per_param"));
      if (const Record* d = same_case(recs, *r, "device"); !dpu && d && d->counter("model_state_bytes_per_param") != stage0.device_bytes)
        bad += d->name + fmt(" holds %.3f B/param; ", d->counter("model_state_bytes_per_param"));
    }
  }
  return bad;
}

// zero-stages: the formulas give the paper's Fig. 1 figures (data: params, devices, expected_gb per stage;
// band: model minus paper in GB, the paper's rounding), and the single-device forms equal the measured bytes.
ClaimResult check_zero_stages(const ClaimSpec& spec, const std::vector<Record>& recs) {
  int checked = 0;
  const std::string bad = model_vs_measured(recs, checked);
  if (!bad.empty()) return {bad, "not_reproduced", "the memory model differs from the tracked bytes of this run"};
  const Band band = claim_band(spec);
  const double P = spec.data.value("params", 7.5e9);
  const auto N = spec.data.value("devices", int64_t{64});
  const Json expected = spec.data.value("expected_gb", Json::array());
  std::string measured;
  std::vector<std::string> verdicts;
  for (int stage = 0; stage < 4 && stage < static_cast<int>(expected.size()); ++stage) {
    const double gb = zero_model_state({P, stage, N, false, 12}).device_bytes / 1e9, want = expected[stage].get<double>();
    measured += fmt("stage %.0f: %.1f GB", stage, gb) + fmt(" (paper %.1f); ", want);
    verdicts.push_back(decide(gb - want, 0, band));
  }
  const ZeroMemory off = zero_model_state({P, 2, N, true, 12}), dpu = zero_model_state({P, 2, N, true, 12, true});
  measured += fmt("ZeRO-Offload: %.1f GB per device, %.0f GB on the host", off.device_bytes / 1e9, off.host_bytes / 1e9) +
              fmt(" (%.0f GB with the delayed parameter update)", dpu.host_bytes / 1e9);
  if (checked == 0) verdicts.push_back("inconclusive");
  return {measured, combine_verdicts(verdicts),
          fmt("P = %.3g, N = %.0f, K = 12; ", P, static_cast<double>(N)) +
              (checked ? "the single-device forms (stage 0: 16 B/param; offload: 2 on the device, 14 on the host, 16 with "
                         "the delayed update) equal the tracked bytes of " + std::to_string(checked) + " mixed-precision offload cases"
                       : std::string("no mixed-precision offload case ran to check the formulas against"))};
}

// offload-60: the device's model-state saving, measured bytes per parameter of offload against device.
ClaimResult check_offload_60(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  std::string measured;
  std::vector<std::string> verdicts;
  for (const Record* r : mixed_offload_records(recs)) {
    const Record* d = same_case(recs, *r, "device");
    if (!d) continue;
    const double saving = 1 - r->counter("model_state_bytes_per_param") / d->counter("model_state_bytes_per_param");
    verdicts.push_back(decide(saving, 0, band));
    measured += r->kase.params.value("policy", std::string("?")) +
                fmt(": model state %.1f -> %.1f B/param (-%.1f%%)", d->counter("model_state_bytes_per_param"),
                    r->counter("model_state_bytes_per_param"), 100 * saving) +
                fmt(", whole device peak -%.0f%% on this model; ", 100 * (1 - r->counter("peak_bytes") / d->counter("peak_bytes")));
  }
  if (verdicts.empty()) return {"", "out_of_scope", "needs device and offload runs of a mixed-precision case"};
  return {measured, combine_verdicts(verdicts),
          "model-state bytes per parameter on the device between steps (tracked tags weights, grads, master, "
          "optimizer); band " + band.str() + "; the whole peak also holds activations, which offload does not move"};
}

// offload-13b: the measured device and host bytes per parameter of an offloaded mixed-precision step,
// scaled to the claim's model (data: params, gpu_bytes; source_gpu_bytes for the source's card).
ClaimResult check_offload_13b(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  int checked = 0;
  const std::string bad = model_vs_measured(recs, checked);
  if (!bad.empty()) return {bad, "not_reproduced", "the memory model differs from the tracked bytes of this run"};
  const auto rs = mixed_offload_records(recs);
  if (rs.empty()) return {"", "out_of_scope", "needs an offload run of a mixed-precision case"};
  const double P = spec.data.value("params", 13e9), source = spec.data.value("source_gpu_bytes", 32e9);
  const double dev = rs[0]->counter("model_state_bytes_per_param") * P,
               host = rs[0]->counter("host_model_state_bytes_per_param") * P;
  return {fmt("%.3g parameters: %.1f GB of model state on the device", P, dev / 1e9) +
              fmt(", %.0f GB on the host; room left for activations on the source's %.0f GB card: ", host / 1e9, source / 1e9) +
              fmt("%.1f GB", (source - dev) / 1e9),
          decide(dev, 0, band),
          "measured bytes per parameter (" + rs[0]->name + ") times the claim's parameters; band " + band.str() +
              " of device model state alone: activations and buffers come on top, so a model state over the card "
              "rules the claim out"};
}

// offload-slow: the offloaded step's time over the device step's, where a device and a host are two
// machines (CUDA). On the CPU backend the "device" is the host: the ratio measures only the extra copies,
// and the modelled PCIe time is reported beside it. offload-dpu's ratio is reported, not decided (the
// claim is about the plain step).
ClaimResult check_offload_slow(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  const double noise = spec.data.value("noise", 0.05);
  std::string measured;
  std::vector<std::string> verdicts;
  for (const auto& r : recs) {
    if (r.technique != "offload" || (r.impl != "offload" && r.impl != "offload-dpu") || r.status != "ok") continue;
    const Record* d = same_case(recs, r, "device");
    if (!d) continue;
    const auto [ratio, u] = time_ratio(r, *d, noise);
    const double step = stats::median(d->times_s);
    measured += std::string(backend_name(r.backend)) + " " + r.kase.params.value("policy", std::string("?")) +
                ": " + r.impl + fmt("/device x%.2f +- %.2f", ratio, u) +
                fmt(" (host optimizer %.0f%% of the device step, modelled PCIe 4 copies %.0f%%); ",
                    100 * r.counter("offload_host_optimizer_s") / step, 100 * r.counter("offload_modelled_pcie4_s") / step);
    if (r.backend == Backend::cuda && r.impl == "offload") verdicts.push_back(decide(ratio, u, band));
  }
  if (verdicts.empty())
    return {measured, "out_of_scope",
            "needs a GPU: on the CPU backend the device and the host are the same CPU, so there is no link to cross and "
            "no device compute to overlap with the host's optimizer"};
  return {measured, combine_verdicts(verdicts), "CUDA cases; band " + band.str()};
}

// ---- cpu_adam ----

struct AdamProblem final : Problem {
  int64_t n = 0;
  DType dtype = DType::f32;
  model::AdamStep step;
  std::vector<float> p0, m0, v0, grad;  // grad: values exact in dtype
  std::vector<double> oracle;           // master after one float64 step
};

std::unique_ptr<Problem> prepare_adam(const Case& c) {
  auto p = std::make_unique<AdamProblem>();
  p->n = c.integer("n");
  p->dtype = parse_dtype(c.text("grad_dtype", "fp32"));
  MT_CHECK(p->dtype == DType::f32 || p->dtype == DType::bf16 || p->dtype == DType::f16,
           "case " + c.id + ": grad_dtype must be fp32, bf16 or fp16");
  auto& s = p->step;
  s.lr = 1e-3f;
  s.beta1 = 0.9f;
  s.beta2 = 0.999f;
  s.weight_decay = 0.01f;
  model::adam_bias_corrections(s.beta1, s.beta2, 10, s.bc1, s.bc2);  // a step past the first
  const int64_t n = p->n;
  p->p0.resize(n);
  p->m0.resize(n);
  p->v0.resize(n);
  p->grad.resize(n);
  p->oracle.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    p->p0[i] = static_cast<float>(0.02 * datasets::normal(1, i));
    p->m0[i] = static_cast<float>(1e-3 * datasets::normal(2, i));
    p->v0[i] = static_cast<float>(1e-6 * std::fabs(datasets::normal(3, i)));
    const auto g = static_cast<float>(1e-3 * datasets::normal(4, i));
    p->grad[i] = p->dtype == DType::bf16 ? to_f32(to_bf16(g)) : p->dtype == DType::f16 ? to_f32(to_f16(g)) : g;
    // PyTorch's AdamW in float64 from the same fp32 state.
    double w = p->p0[i], m = p->m0[i], v = p->v0[i];
    const double gd = p->grad[i], lr = s.lr, b1 = s.beta1, b2 = s.beta2;
    w *= 1 - lr * static_cast<double>(s.weight_decay);
    m = b1 * m + (1 - b1) * gd;
    v = b2 * v + (1 - b2) * gd * gd;
    p->oracle[i] = w - (lr / static_cast<double>(s.bc1)) * m / (std::sqrt(v) / std::sqrt(static_cast<double>(s.bc2)) + s.eps);
  }
  return p;
}

class AdamWorkload final : public Workload {
 public:
  AdamWorkload(const AdamProblem& p, Device& dev, bool simd) : p_(p), simd_(simd) {
    auto& pool = dev.memory();
    const int64_t n = p.n;
    const std::size_t es = dtype_size(p.dtype);
    master_ = Buffer(pool, n * sizeof(float), Tag::master);
    m_ = Buffer(pool, n * sizeof(float), Tag::optimizer);
    v_ = Buffer(pool, n * sizeof(float), Tag::optimizer);
    grad_ = Buffer(pool, n * es, Tag::grads);
    weights_ = Buffer(pool, n * es, Tag::weights);
    std::memcpy(master_.data(), p.p0.data(), n * sizeof(float));
    std::memcpy(m_.data(), p.m0.data(), n * sizeof(float));
    std::memcpy(v_.data(), p.v0.data(), n * sizeof(float));
    for (int64_t i = 0; i < n; ++i) {
      if (p.dtype == DType::bf16) grad_.as<bf16_t>()[i] = to_bf16(p.grad[i]);
      else if (p.dtype == DType::f16) grad_.as<f16_t>()[i] = to_f16(p.grad[i]);
      else grad_.as<float>()[i] = p.grad[i];
    }
    run();  // the step the error is taken from; later calls keep stepping (timing only)
    const float* w = master_.as<float>();
    err_ = error_stats(std::vector<double>(w, w + n), p.oracle);
  }

  void run() override {
    switch (p_.dtype) {
      case DType::bf16: return step<bf16_t>();
      case DType::f16: return step<f16_t>();
      default: return step<float>();
    }
  }
  ErrorStats error() override { return err_; }
  Work work() const override {
    Work w;
    const double es = static_cast<double>(dtype_size(p_.dtype));
    w.bytes = static_cast<double>(p_.n) * (3 * 4 * 2 + es + es);  // master, m, v read and written; grad in; weight out
    w.flops = static_cast<double>(p_.n) * 18;
    w.items = static_cast<double>(p_.n);
    w.item_unit = "params";
    // In training the forward and backward run between two optimizer steps and evict the optimizer state:
    // each step reads it from memory. Warm, 10.5M parameters (210 MB of state) sat in a 260 MiB L3 and
    // showed 1.4x the copy ceiling.
    w.cold_cache = true;
    return w;
  }
  std::string detail() override { return simd_ ? "SIMD target " + simd::target_name() : "scalar, OpenMP"; }

 private:
  template <class T>
  void step() {
    using Fn = void (*)(const model::AdamStep&, float*, float*, float*, const T*, T*, int64_t);
    const Fn f = simd_ ? &model::cpu_adamw<T, T> : &model::cpu_adamw_scalar<T, T>;
    f(p_.step, master_.as<float>(), m_.as<float>(), v_.as<float>(), grad_.as<T>(), weights_.as<T>(), p_.n);
  }

  const AdamProblem& p_;
  const bool simd_;
  Buffer master_, m_, v_, grad_, weights_;
  ErrorStats err_;
};

void register_offload(Registry& r) {
  Technique t = model::train_bench_technique(
      "offload", "ZeRO-Offload on one device: fp32 master, moments and gradients on the host, AdamW on the CPU", false, true,
      {int_param("dpu_from", "offload-dpu: the first optimizer step (from 0) whose update is delayed by one step", 2, 0)});
  model::add_train_bench_impls(
      t, {{"device", Role::reference, "all state on the device", [](const TrainBench&, model::TrainOptions&) {}},
          {"offload", Role::optimized, "optimizer state and gradients on the host",
           [](const TrainBench&, model::TrainOptions& o) { o.offload = true; }},
          {"offload-dpu", Role::optimized,
           "offload, the host's AdamW one step late on a host thread beside the next forward and backward",
           [](const TrainBench& b, model::TrainOptions& o) {
             o.offload = true;
             o.delayed_update_from = b.kase.integer("dpu_from", 2);
           }}});
  t.claims["zero-stages"] = check_zero_stages;
  t.claims["offload-60"] = check_offload_60;
  t.claims["offload-13b"] = check_offload_13b;
  t.claims["offload-slow"] = check_offload_slow;
  r.add(std::move(t));
}

void register_cpu_adam(Registry& r) {
  Technique t;
  t.name = "cpu_adam";
  t.description = "the host AdamW of ZeRO-Offload: scalar reference against runtime-dispatched SIMD";
  t.schema.params = {
      int_param("n", "parameters updated per step"),
      text_param("grad_dtype", "storage type of the gradient and the working weights", "fp32", {"fp32", "bf16", "fp16"}),
  };
  t.prepare = prepare_adam;
  t.impls.push_back(typed_impl<AdamProblem>(t.name, "scalar", Role::reference, Backend::cpu,
                                            "adamw_step per element, OpenMP over elements",
                                            [](const AdamProblem& p, Device& d) { return std::make_unique<AdamWorkload>(p, d, false); }));
  t.impls.push_back(typed_impl<AdamProblem>(t.name, "simd", Role::optimized, Backend::cpu,
                                            "fused tiles in portable SIMD (Highway, dispatched at run time), OpenMP over tiles",
                                            [](const AdamProblem& p, Device& d) { return std::make_unique<AdamWorkload>(p, d, true); }));
  r.add(std::move(t));
}

}  // namespace

void register_technique(Registry& r) {
  register_offload(r);
  register_cpu_adam(r);
}

}  // namespace memtrade::offload
