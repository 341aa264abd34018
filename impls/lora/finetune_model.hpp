// Memory of one fine-tuning step of a Llama-shaped model, by tag, as memtrade's training step holds it
// (model/train_core.hpp): full fine-tuning, LoRA (frozen 16/32-bit base) and QLoRA (frozen NF4-DQ base),
// with or without full activation checkpointing. Exact for memtrade's own step (tested to the byte on
// small models); for full-size models it is what the same step would hold, not a measurement:
//   weights      the base (P x S; QLoRA: the projections in NF4 with double quantization, memtrade's blob
//                layout, embedding / lm_head / norms x S) plus the adapters (A x S)
//   grads        trainable x S
//   master       trainable x 4 under mixed precision
//   optimizer    trainable x 8 (AdamW's fp32 moments)
//   activations  the end of the forward, the step's peak: per layer S R (6 D + 2 KV + 2 F) + R x 8 (two
//                fp32 RMS factors per row) + H R x 4 (the attention's fp32 log-sum-exp) + S R r per adapted
//                projection; then the final norm's input and output (2 S R D), its RMS factors (4 R) and
//                the logits (S R V). Full checkpointing keeps only the input (S R D) of every layer but the
//                last.
// R = batch x seq rows, S the weight dtype's bytes, trainable = P (full) or the adapters. Not modelled:
// transient workspace (GEMM staging, a QLoRA matrix dequantized for its GEMM, backward buffers), the
// framework's allocator slack and the CUDA context.
#pragma once

#include <cstdint>
#include <string>

#include "model/lora.hpp"
#include "model/model.hpp"

namespace memtrade::lora {

enum class Method { full, lora, qlora };
const char* method_name(Method m);

struct FinetuneSetup {
  model::Config cfg;
  Method method = Method::full;
  model::LoraOptions lora;   // rank and targets for lora / qlora
  int64_t batch = 1, seq = 1;
  int64_t weight_bytes = 2;  // S: 2 (bf16 / fp16) or 4 (fp32)
  bool master = true;        // fp32 master copy of the trainable parameters (mixed precision)
  bool checkpoint = false;   // full activation checkpointing
};

struct FinetuneMemory {
  double weights = 0, grads = 0, master = 0, optimizer = 0, activations = 0;
  double base_weights = 0, adapter_weights = 0;  // the split of `weights`
  int64_t params = 0, trainable = 0;
  double total() const { return weights + grads + master + optimizer + activations; }
};

// Throws Error for an invalid config or adapter options (adapter_layout's rules).
FinetuneMemory finetune_memory(const FinetuneSetup& s);

// Bytes of a frozen NF4-DQ projection [rows x cols] in memtrade's blob layout (block 64, absmax in 8 bits
// per block of 256 absmax values).
double nf4_dq_bytes(int64_t rows, int64_t cols);

}  // namespace memtrade::lora
