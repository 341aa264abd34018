// The `accum` technique: gradient accumulation. A case's optimizer step is `accum` micro-batches of
// `batch` sequences; the implementations take the same tokens two ways:
//   large-batch  (reference) one batch of accum x batch sequences per step
//   accumulate   accum micro-batches, gradients zeroed before the first and added up, the loss
//                normalized by the counted tokens of all micro-batches
// With `pad` > 0 the micro-batches count different numbers of tokens (padding), where normalizing each
// micro-batch by its own count and averaging (mean of means) goes wrong: mean_of_means_grad_rel_err
// measures that mistake on the same micro-batches. The timed and memory-measured call is one optimizer
// step; peak activations follow the micro-batch. `policy` and `checkpoint` compose the technique with
// the precision policies and activation checkpointing.
#include <cmath>
#include <cstdio>

#include "harness/claims.hpp"
#include "harness/stats.hpp"
#include "model/train_bench.hpp"

namespace memtrade::accum {

void register_technique(Registry& r);

namespace {

using model::TrainBench;

// accum-eq: "gradient accumulation is equivalent to a larger batch". Per case with both implementations:
// accumulate's gradient against large-batch's, in unit roundoffs of the compute dtype (`band`: within
// the rounding a reordered sum gives); where the micro-batches count different tokens (pad > 0), the
// mean-of-means normalization's gradient error in the same units (`mistake_band`: outside rounding, the
// source's condition). Exact figures of one batch; validation losses, memory and time are reported.
ClaimResult check_accum_eq(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec), mistake = claim_band(spec, "mistake_band");
  std::string measured;
  std::vector<std::string> verdicts;
  for (const auto& r : recs) {
    if (r.impl != "accumulate" || r.status != "ok") continue;
    const Record* big = same_case(recs, r, "large-batch");
    if (!big) continue;
    const double u = unit_roundoff(precision::traits(precision::parse_policy(r.kase.params.value("policy", "fp32"))).compute);
    const double diff = r.counter("grad_rel_diff_vs_reference") / u;
    verdicts.push_back(decide(diff, 0, band));
    const auto& kp = r.kase.params;
    measured += fmt("%.0f x %.0f sequences, ", kp.value("accum", 1.0), kp.value("batch", 1.0)) +
                kp.value("policy", std::string("fp32")) + ", checkpointing " + kp.value("checkpoint", std::string("none")) +
                fmt(", pad %.2f: accumulate vs large batch %.2f u", kp.value("pad", 0.0), diff);
    if (r.kase.params.value("pad", 0.0) > 0 && r.counters.count("mean_of_means_grad_rel_err")) {
      const double wrong = r.counter("mean_of_means_grad_rel_err") / u;
      verdicts.push_back(decide(wrong, 0, mistake));
      measured += fmt(", mean of means %.3g u", wrong);
    }
    measured += fmt("; val loss %+.2f%%", 100 * (r.counter("val_loss") / big->counter("val_loss") - 1)) +
                fmt(", activations x%.2f, step time x%.2f; ",
                    r.counter("peak_bytes_activations") / big->counter("peak_bytes_activations"),
                    stats::median(r.times_s) / stats::median(big->times_s));
  }
  if (verdicts.empty()) return {"", "out_of_scope", "needs accumulate and large-batch runs of one case"};
  return {measured, combine_verdicts(verdicts),
          "gradient relative L2 in unit roundoffs u of the compute dtype: token-normalized accumulation " + band.str() +
              ", mean of means with unequal token counts " + mistake.str()};
}

}  // namespace

void register_technique(Registry& r) {
  Technique t = model::train_bench_technique(
      "accum", "gradient accumulation: accum micro-batches per step against one large batch", false, true);
  model::add_train_bench_impls(
      t, {{"large-batch", Role::reference, "one batch of all the step's sequences",
           [](const TrainBench&, model::TrainOptions& o) {
             o.batch *= o.accum_steps;
             o.accum_steps = 1;
           }},
          {"accumulate", Role::optimized, "accum micro-batches, gradients added up",
           [](const TrainBench&, model::TrainOptions&) {}}});
  t.claims["accum-eq"] = check_accum_eq;
  r.add(std::move(t));
}

}  // namespace memtrade::accum
