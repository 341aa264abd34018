// The `checkpoint` technique: activation checkpointing of the model's training step (model/train.hpp's
// Checkpoint), each policy an implementation of the same case:
//   none       (reference) every layer keeps its activations for the backward
//   full       each layer keeps its input; the backward runs its forward again
//   every-k    every k-th layer keeps its input (k = `every`, default round(sqrt(layers))); segments of
//              k layers run again as a whole
//   selective  the RMSNorm outputs are computed again, everything else is kept
// The timed and memory-measured call is one optimizer step (peak bytes per tag, tokens/s). Recomputation
// repeats the same operations in the same order, so every policy's gradient must equal none's bit for bit
// (grad_values_differ_vs_reference, gated at 0) under every precision policy (`policy` axis); the error
// figures compare the step's gradient with the float64 step's. Counters: layers recomputed per step and
// their share of the step's FLOPs, the validation loss after `steps` steps, model-state bytes/param.
#include <cmath>
#include <cstdio>

#include "harness/claims.hpp"
#include "harness/stats.hpp"
#include "model/train_bench.hpp"

namespace memtrade::checkpoint {

void register_technique(Registry& r);

namespace {

using model::Checkpoint;
using model::TrainBench;

// Model state plus activations: what the step itself must hold (the CPU's fp32 staging of 16-bit GEMM
// operands, tag workspace, is left out as in the precision claims: a GPU reads 16-bit operands directly).
double state_and_activations(const Record& r) {
  return r.counter("peak_bytes_weights") + r.counter("peak_bytes_grads") + r.counter("peak_bytes_master") +
         r.counter("peak_bytes_optimizer") + r.counter("peak_bytes_activations");
}

// ckpt: "checkpointing saves 50-70% of memory for 20-30% more time". On the case where the plain step's
// activations are the largest share of its memory: full checkpointing's saving of state + activations
// (exact, tracked bytes; `band`) and its step time over the plain step's (`time_band`, +- the larger of
// `noise` and the two repetition spreads). every-k's figures are reported beside them.
ClaimResult check_ckpt(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec), time_band = claim_band(spec, "time_band");
  const double noise = spec.data.value("noise", 0.05);
  const Record* plain = nullptr;
  for (const auto& r : recs)
    if (r.impl == "none" && r.status == "ok" && same_case(recs, r, "full") &&
        (!plain || r.counter("peak_bytes_activations") / state_and_activations(r) >
                       plain->counter("peak_bytes_activations") / state_and_activations(*plain)))
      plain = &r;
  if (!plain) return {"", "out_of_scope", "needs none and full runs of one case"};
  const Record* full = same_case(recs, *plain, "full");
  const double saving = 1 - state_and_activations(*full) / state_and_activations(*plain);
  const double act_saving = 1 - full->counter("peak_bytes_activations") / plain->counter("peak_bytes_activations");
  const double share = plain->counter("peak_bytes_activations") / state_and_activations(*plain);
  const auto [ratio, u] = time_ratio(*full, *plain, noise);
  const double layers = plain->kase.params.value("layers", 1.0);
  std::string measured =
      fmt("full: state + activations -%.0f%% (activations -%.0f%%, ", 100 * saving, 100 * act_saving) +
      fmt("%.0f%% of the plain step's state + activations), step time x%.2f +- %.2f", 100 * share, ratio, u) +
      fmt(" (recomputation adds %.0f%% to the step's FLOPs; one extra forward of all %.0f layers would add 33%%, the "
          "source's 4/3)", 100 * full->counter("recompute_flops_fraction"), layers);
  if (const Record* k = same_case(recs, *plain, "every-k"))
    measured += fmt("; every-k: -%.0f%%, x%.2f", 100 * (1 - state_and_activations(*k) / state_and_activations(*plain)),
                    stats::median(k->times_s) / stats::median(plain->times_s));
  if (const Record* s = same_case(recs, *plain, "selective"))
    measured += fmt("; selective: -%.0f%%, x%.2f", 100 * (1 - state_and_activations(*s) / state_and_activations(*plain)),
                    stats::median(s->times_s) / stats::median(plain->times_s));
  return {measured, combine_verdicts({decide(saving, 0, band), decide(ratio, u, time_band)}),
          "case " + plain->kase.id + " (" + std::string(backend_name(plain->backend)) + "); memory band " + band.str() +
              ", time band " + time_band.str() +
              "; the saving is bounded by the activations' share of memory: model state is not recomputable"};
}

}  // namespace

void register_technique(Registry& r) {
  Technique t = model::train_bench_technique(
      "checkpoint", "activation checkpointing of the training step: none, full, every-k, selective", true, false,
      {int_param("every", "every-k's k (layers per recomputed segment); 0: round(sqrt(layers))", 0, 0)});
  std::vector<model::BenchImpl> impls;
  for (Checkpoint cp : {Checkpoint::none, Checkpoint::full, Checkpoint::every_k, Checkpoint::selective})
    impls.push_back({model::checkpoint_name(cp), cp == Checkpoint::none ? Role::reference : Role::optimized,
                     std::string("checkpointing ") + model::checkpoint_name(cp),
                     [cp](const TrainBench&, model::TrainOptions& o) { o.checkpoint = cp; }});
  model::add_train_bench_impls(t, impls);
  t.claims["ckpt"] = check_ckpt;
  r.add(std::move(t));
}

}  // namespace memtrade::checkpoint
