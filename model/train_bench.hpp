// One training case as the training-memory techniques (checkpoint, accum) measure it: the case's model,
// corpus and options, the float64 gradient of its first step as the oracle, and a workload that trains
// under the options an implementation sets and whose timed call is one optimizer step.
//
// A step is `accum` micro-batches of `batch` sequences (a trainer whose batch is the whole step, accum
// 1, gets the same tokens concatenated). With `pad` > 0 the micro-batches count different numbers of
// tokens, as variable-length documents padded to one length do: micro-batch i of k ignores the last
// round(pad * seq * i / (k - 1)) targets of each sequence. Validation runs on the same tokens whatever
// the trainer's batch shape.
//
// Fine-tuning (`pretrain_steps` > 0): the model is first trained in fp32 on the corpus's training split
// for pretrain_steps steps at `lr` (train_fp32, the model the inference techniques load), then the
// implementations fine-tune it at `ft_lr` on text it has not seen: the validation split (the last 10% of
// the corpus, the fortune files at the end of the alphabet) in blocks of 4 KiB, every fifth block for
// validation and the others for training (so both sample the same files).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/train_case.hpp"

namespace memtrade::model {

// The keys every training-memory suite shares: train_case_params() plus policy, accum, pad, pretrain_steps
// and ft_lr.
std::vector<Param> train_bench_params();
// `checkpoint`: the activation checkpointing policy, for the techniques that compose with it.
Param checkpoint_param();
// The counters TrainBenchWorkload reports. Gradients that must equal the reference implementation's bit
// for bit (checkpointing, one-micro-batch offload) gate their difference at zero; others (accumulation
// reorders sums) report it.
std::vector<Metric> train_bench_metrics(bool grads_bit_identical);

struct TrainBench : Problem {
  Case kase;                    // the case, for a technique's own keys
  TrainCase tc;                 // tc.opts: micro-batch shape, policy and accum_steps from the case
  datasets::Corpus corpus;
  datasets::Split split;
  std::vector<float> init;        // the initial or (fine-tuning) the pretrained weights
  std::span<const uint8_t> train_data, val_data;  // the split's parts, or the fine-tuning text's
  std::vector<uint8_t> ft_train, ft_val;          // fine-tuning: the held-out text's blocks
  int64_t pretrain_steps = 0;
  std::vector<double> oracle_grad;  // float64 gradient of step 0's micro-batches, token-normalized
  double grad_condition = 1;        // fine-tuning: gradient_condition of the pretrained weights
  double pad = 0;
  // Gradients of step 0 of each backend's reference implementation (registered first), for the others
  // to compare with.
  mutable std::map<Backend, std::vector<double>> reference_grad;
  // Validation loss of each backend's reference implementation after training, for the others' ratio.
  mutable std::map<Backend, double> reference_val;
  // float64 step-0 gradients of LoRA adapters, per adapter configuration (lora_key).
  mutable std::map<std::string, std::vector<double>> lora_oracle;

  // The case's options, with its `checkpoint` key (none when absent) and `every` (every-k's k; absent or 0:
  // round(sqrt(layers))) applied.
  TrainOptions options() const;
  std::vector<datasets::Batch> micro_batches(int64_t step) const;
  std::vector<datasets::Batch> val_micro_batches() const;  // eval_batches x accum micro-batches
};

// Reads the case (train_bench_params) and computes the oracle; throws Error naming the problem.
std::unique_ptr<TrainBench> prepare_train_bench(const Case& c);

// A training step's gradient against the float64 step: a policy's error follows its compute dtype, so
// it is bounded by kGradErrorUnits unit roundoffs of that dtype. One step's gradient passes through a
// few dozen roundings per value (GEMM outputs, norms, softmax, the stored activations): errors of a few
// u are expected and 32 u is a failure. NaN or Inf fails.
// `condition` widens the bound where the gradient is smaller than at initialization (a trained model fits
// its data, and its gradient is a sum of larger, cancelling terms, while the rounding errors stay at the
// scale of the terms): the float64 gradient's L2 norm at initialization over its norm at the trained
// weights, on the same batch (gradient_condition); at most 1 changes nothing.
constexpr double kGradErrorUnits = 32;
Verdict gradient_verdict(precision::Policy p, const ErrorStats& e, double condition = 1);

// ||float64 gradient at `init`|| / ||grad|| (grad: the float64 gradient of `micro` at the trained weights).
double gradient_condition(const Config& c, const TrainOptions& o, std::span<const float> init,
                          std::span<const datasets::Batch> micro, std::span<const double> grad);

// `k` micro-batches as one batch of k times their sequences.
datasets::Batch concatenate(std::span<const datasets::Batch> micro);

// Parameters the optimizer updates under `o`: every parameter, or the LoRA adapters.
int64_t trainable_params(const Config& c, const TrainOptions& o);

// FLOPs of one training step per token: train_flops_per_token, less the frozen base's weight gradients
// (2 x its matrix parameters) and plus the adapters' forward and backward (6 x their parameters) under LoRA.
double step_flops_per_token(const Config& c, const TrainOptions& o);

// FLOPs of one layer's forward per token: 2 x the layer's matrix parameters plus causal attention
// (scores and values) 2 x seq x dim.
double layer_forward_flops_per_token(const Config& c, int64_t seq);

// A technique over TrainBench: the schema (train_bench_params, plus `checkpoint` when checkpoint_key, plus
// extra), the metrics, the gradient rule against the float64 step and prepare.
Technique train_bench_technique(std::string name, std::string description, bool grads_bit_identical,
                                bool checkpoint_key, std::vector<Param> extra = {});

// One implementation on each backend: `adjust` sets the options it differs by (from TrainBench::options()).
// The role-reference implementation must come first: the others' gradients are compared with its.
struct BenchImpl {
  std::string name;
  Role role;
  std::string description;
  std::function<void(const TrainBench&, TrainOptions&)> adjust;
};
void add_train_bench_impls(Technique& t, const std::vector<BenchImpl>& impls);

// Trains bench.tc.steps steps under `o` (batch, accum_steps, checkpointing, policy as the implementation
// sets them), then evaluates; run() is one further optimizer step.
class TrainBenchWorkload final : public Workload {
 public:
  TrainBenchWorkload(const TrainBench& bench, const TrainOptions& o, Device& dev, bool reference);
  void run() override;
  ErrorStats error() override { return err_; }
  Work work() const override;
  void add_counters(std::map<std::string, double>& c) override;
  std::string detail() override;

 private:
  std::vector<datasets::Batch> step_batches(int64_t step) const;  // in the trainer's shape

  const TrainBench& b_;
  TrainOptions o_;
  Device& dev_;
  std::unique_ptr<Trainer> trainer_;
  ErrorStats err_;
  std::map<std::string, double> counters_;
  int64_t next_ = 0, recomputed_ = 0;
};

}  // namespace memtrade::model
