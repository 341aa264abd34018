// The training step of the model in model.hpp: forward, hand-written backward and AdamW, under a
// precision policy, on one device. Later training techniques (activation checkpointing, gradient
// accumulation, optimizer offload, adapters) are options of this step.
//
// Storage (every buffer from the device's tracked allocator, with its tag):
//   weights      the working copy the forward/backward reads, in the policy's weight dtype
//   master       fp32 master weights (mixed policies only)
//   grads        gradients, in the weight dtype (produced by fp32-accumulating GEMMs, then rounded)
//   optimizer    AdamW's two moments (fp32, or bf16 for bf16-pure)
//   activations  what the forward keeps for the backward, in the compute dtype (per-row RMS factors
//                and the attention log-sum-exp in fp32); freed at the end of the backward
//   workspace    GEMM staging, per-thread row scratch, attention tiles, transient gradients
//   io           the batch's token ids and targets
// ZeRO-Offload (TrainOptions::offload, one device): master weights (fp32, for every policy), both moments
// and the gradients (in the weight dtype) live in the device's host pool (pinned on CUDA) with the same
// tags; the device keeps only the working weights, plus during the backward one segment's gradients
// (a layer, the head, the embedding; tag grads), which go to the host as soon as they are complete (the
// first micro-batch of a step copies, later ones add on the host). AdamW runs on the host (cpu_adam.hpp)
// and the updated weights go back to the device tile by tile. Bit-identical to the device step for one
// micro-batch per step; over several, the host adds each micro-batch's gradient to the sum of the
// previous ones (as DeepSpeed does), one more rounding of a 16-bit gradient per micro-batch and repeated
// embedding rows summed per micro-batch first.
// Delayed parameter update (DeepSpeed's DPU, TrainOptions::delayed_update_from): from that step on, the
// host's AdamW with one step's gradients runs during the next step's forward and backward (on a host
// thread), and its weights reach the device after them: every gradient is then taken at weights one
// update old, and the host holds a second gradient buffer (the pending step's; tag grads).
// Not for bf16-pure (bf16 moments, stochastic rounding) or the float64 reference.
// On the CPU, "bf16"/"fp16" compute means every stored value is rounded to 16 bits; each operation
// loads 16-bit values, computes in fp32 (OpenBLAS sgemm on fp32 copies of the operands for GEMMs,
// the FlashAttention-2 CPU kernels for attention) and rounds its output back to 16 bits.
//
// LoRA (TrainOptions::lora, lora.hpp): the base weights (tag weights, in the weight dtype) are frozen: no
// gradients, master copy or moments for them, and the backward computes no weight gradient for the
// base (input gradients still flow through it). The adapters (tag weights) have gradients, moments and,
// under mixed policies, an fp32 master copy. An adapted projection keeps s * (x A^T) [rows x r] as an
// activation for its backward. Not with offload.
// Step semantics: gradients are zeroed once per optimizer step and accumulated over accum_steps
// micro-batches; the loss gradient of every counted token is loss_scale / (counted tokens of all
// micro-batches), so accumulation equals one large batch up to rounding, also when the micro-batches
// count different numbers of tokens. A target of kIgnoreTarget (-1, padding) counts no loss. The
// common mistake, each micro-batch's mean loss averaged (mean of means), is kept as an option so that
// its error can be measured. Gradients are unscaled in fp32 before the
// update; with dynamic loss scaling a step with a non-finite gradient is skipped (LossScaler). AdamW
// decays matrices only (not norm weights); the learning rate warms up linearly over warmup_steps.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "datasets/corpus.hpp"
#include "harness/device.hpp"
#include "model/lora.hpp"
#include "model/model.hpp"
#include "precision/policies.hpp"

namespace memtrade::model {

// Activation checkpointing: which activations the forward keeps for the backward, and what the
// backward computes again. The recomputation runs the same operations in the same order on the same
// inputs, so gradients are bit-identical to `none`'s under every precision policy.
//   none       every layer keeps what its backward needs (the activations train_core.hpp lists)
//   full       each layer keeps only its input; its forward runs again in the backward
//   every_k    every k-th layer keeps its input (k = checkpoint_every); a segment of k layers runs
//              again as a whole, keeping its activations until its backward is done: about L/k + k
//              layers' worth, least near k = sqrt(L)
//   selective  every layer keeps all but the RMSNorm outputs, which the backward computes again from
//              the kept input and per-row RMS factor (cheap element-wise work, no GEMM)
// The last segment (full, every_k) is not dropped: the backward starts there and would recompute it
// at once.
enum class Checkpoint { none, full, every_k, selective };
const char* checkpoint_name(Checkpoint c);
Checkpoint parse_checkpoint(const std::string& name);  // Error naming the accepted names

// A storage format for the frozen base's projections (QLoRA's NF4): the bytes of a [rows x cols] matrix,
// and its encoding from and decoding to fp32. The trainer keeps each q/k/v/o/gate/up/down projection as
// one blob of that many bytes (tag weights) and decodes it whole, into a workspace matrix in the weight
// dtype, before each GEMM that reads it (forward and backward), as bitsandbytes does; the embedding,
// lm_head and norms stay in the weight dtype.
struct BaseFormat {
  std::string name;
  std::function<std::size_t(int64_t rows, int64_t cols)> bytes;
  std::function<void(int64_t rows, int64_t cols, const float* w, uint8_t* blob)> encode;
  std::function<void(int64_t rows, int64_t cols, const uint8_t* blob, float* w)> decode;
};

struct TrainOptions {
  precision::Policy policy = precision::Policy::fp32;
  bool float64 = false;         // the float64 reference: every value and operation in double (policy ignored)
  int64_t batch = 1, seq = 0;   // micro-batch shape; seq <= config.context
  int64_t accum_steps = 1;      // micro-batches per optimizer step
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  int64_t warmup_steps = 0;
  uint64_t seed = 0;            // stream of the stochastic rounding bits (bf16-pure)
  double init_scale = 65536.0;  // dynamic loss scaling (fp16-mixed), PyTorch's defaults
  int64_t growth_interval = 2000;
  Checkpoint checkpoint = Checkpoint::none;
  int64_t checkpoint_every = 1;  // k of every_k
  bool mean_of_means = false;    // the accumulation mistake: each micro-batch's mean loss, averaged
  bool offload = false;          // ZeRO-Offload: optimizer state, master weights and gradients on the host
  // Offload: the one-step delayed parameter update from optimizer step delayed_update_from on (counted from
  // 0; -1 never). With delayed_update_overlap the pending update runs on a host thread beside the forward and
  // backward; without, after them: the same operations in the same order, so the same bits.
  int64_t delayed_update_from = -1;
  bool delayed_update_overlap = true;
  LoraOptions lora;              // rank > 0: the base is frozen and only LoRA adapters train (lora.hpp)
  std::shared_ptr<const BaseFormat> base_format;  // with LoRA: the projections stored in it (QLoRA); null: in S
  bool inference_only = false;  // weights and the forward only: no gradients, master copy or moments
                                // (eval_loss and linear_inputs work; step and gradients throw)
};

// Throws Error naming the problem (batch/seq/accum <= 0, seq > context, lr/betas/eps out of range).
void validate(const Config& c, const TrainOptions& o);

struct StepStats {
  double loss = 0;              // mean loss over the step's tokens, from the forward pass
  bool applied = true;          // false: skipped by the loss scaler, or (delayed update) none was pending
  bool delayed = false;         // the update applied in this step was the previous step's (delayed update)
  bool non_finite = false;      // a gradient was Inf or NaN after unscaling
  float loss_scale = 1;         // the scale this step's backward used
  // Weight-matrix gradients as the fp32-accumulating GEMMs produced them (scaled by loss_scale):
  // how many were nonzero, and how many of those round to zero in fp16. For the fp16 policies this is
  // the underflow that happened; for the others, the underflow fp16 storage would have caused.
  int64_t grad_nonzero = 0, grad_underflow_fp16 = 0;
  int64_t tokens = 0;             // counted (non-ignored) targets of the step's micro-batches
  int64_t recomputed_layers = 0;  // layer forwards the backward ran again (activation checkpointing)
  // Offload: bytes copied device -> host (gradients) and host -> device (updated weights), and the wall
  // time of the host's part of the optimizer step (non-finite check, AdamW, weight copies).
  int64_t bytes_to_host = 0, bytes_to_device = 0;
  double host_optimizer_s = 0;
  // Quantized base (QLoRA): projections decoded and the wall time spent decoding them.
  int64_t base_decodes = 0;
  double base_decode_s = 0;
};

// Targets that count a loss (not kIgnoreTarget).
int64_t counted_targets(const datasets::Batch& b);

class Trainer {
 public:
  virtual ~Trainer() = default;
  // One optimizer step over accum_steps micro-batches, each [batch x seq] inputs and targets.
  virtual StepStats step(std::span<const datasets::Batch> micro) = 0;
  // Mean loss over a batch's counted targets at the current weights (forward only).
  virtual double eval_loss(const datasets::Batch& b) = 0;
  // The logits of a batch at the current weights (forward only), as fp32 [batch * seq x vocab].
  virtual std::vector<float> logits(const datasets::Batch& b) = 0;
  // Gradient of the mean loss of one batch at the current weights, through the policy's real path
  // (scaled by the loss scaler's current scale, stored in the policy's gradient type, unscaled as the
  // optimizer would), per parameter in the layout's order, as double. No update: the weights are unchanged.
  virtual std::vector<double> gradients(const datasets::Batch& b) = 0;
  // The same over micro-batches, as a step accumulates them (the loss normalized by their counted
  // tokens, or their means averaged under mean_of_means).
  virtual std::vector<double> gradients(std::span<const datasets::Batch> micro) = 0;
  // The working weights (what the forward reads), as fp32: the base model's, without adapters.
  virtual std::vector<float> params() const = 0;
  // What the optimizer updates, as fp32: every parameter (params()), or the LoRA adapters in the
  // adapter layout's order. gradients() returns gradients of these.
  virtual std::vector<float> trainable_params() const = 0;
  // Replaces the trainable values (rounded to the weight dtype; the master copy takes them as given).
  virtual void set_trainable(std::span<const float> values) = 0;
  virtual const precision::LossScaler& scaler() const = 0;
  virtual int64_t steps_taken() const = 0;
  // Applies an update still pending (the delayed parameter update holds the last step's); a no-op otherwise.
  virtual void flush_update() {}
  // The inputs of every linear layer for one batch at the current weights (forward only), as fp32
  // [batch * seq x in_features] row-major, per layer: the attention input (q/k/v projections), the
  // attention output (o_proj), the MLP input (gate/up projections), the SwiGLU output (down_proj).
  // Calibration data for weight quantization. Backends without it throw Error.
  using LinearInputs = std::array<std::vector<float>, 4>;
  virtual std::vector<LinearInputs> linear_inputs(const datasets::Batch& b);
  // The same one layer at a time, for calibration that changes the weights between layers (sequential
  // GPTQ: about 2L layer forwards in all, where linear_inputs per layer takes L full ones). `x` is batch b's
  // residual stream entering layer l, fp32 [batch * seq x dim]; empty with l = 0 for the embedding (then it
  // is filled). layer_linear_inputs gives layer l's inputs from it; advance_layer replaces it by layer l's
  // output. Both at the current weights; for a stream that came through the same weights, the values
  // linear_inputs(b)[l] has (bit for bit with fp32 or 16-bit storage; the float64 trainer rounds the stream
  // to fp32 between calls). Error for a bad layer or stream size; backends without it throw Error.
  virtual LinearInputs layer_linear_inputs(const datasets::Batch& b, int64_t l, std::vector<float>& x);
  virtual void advance_layer(const datasets::Batch& b, int64_t l, std::vector<float>& x);
};

// fp32 training on the CPU from init_params(c, seed) over `steps` batches of the training split,
// sample_batch(train, o.batch, o.seq, seed, step) for step = 0, 1, ... (the batches the precision
// suite uses): the model the inference techniques load. Returns the weights.
std::vector<float> train_fp32(const Config& c, TrainOptions o, std::span<const uint8_t> train, int64_t steps,
                              uint64_t seed);

// A trainer on the CPU, starting from `init` (fp32 values, rounded to the policy's dtypes).
std::unique_ptr<Trainer> make_trainer_cpu(const Config& c, const TrainOptions& o, Device& dev,
                                          std::span<const float> init);

// The same trainer on a CUDA device (train.cu, built with MEMTRADE_WITH_CUDA): the same buffers, tags and
// step semantics, every kernel's math from layers.hpp / precision.hpp; attention materializes the
// [T x T] probabilities (kept as activations instead of the CPU's log-sum-exp). Throws Error for
// o.float64 (the float64 reference is CPU only) or a device that is not CUDA.
std::unique_ptr<Trainer> make_trainer_cuda(const Config& c, const TrainOptions& o, Device& dev,
                                           std::span<const float> init);

// Checks a batch's shape against the options, its ids against the vocabulary and its targets against
// the vocabulary or kIgnoreTarget.
void check_batch(const Config& c, const TrainOptions& o, const datasets::Batch& b);

}  // namespace memtrade::model
