// The model of model/ run the way inference runs it: one token per step for a batch of requests,
// through a KV cache (prefill token by token, then decode). Each step appends the token's K and V at
// every layer (quantized on write by the cache's storage type) and attends over the request's cache with
// the decode kernel; the matrix products are fp32 GEMMs over the batch's rows, the layer math that of
// model/layers.hpp, so with an fp32 cache the logits equal the full-sequence forward's up to fp32
// summation order. Weights live in the device's pool (tag weights), step buffers are tag workspace.
//
// With a weight format (impls/quant/formats.hpp), every projection is stored quantized by RTN and
// multiplied by the quant technique's kernels (matvec at batch 1, panel-dequantizing matmul above), and
// lm_head is stored in int8 per channel (as GGUF files keep the output matrix in Q8_0); the embedding
// rows are read from fp32. That is the decode loop of a quantized runtime: its tokens per second and
// perplexity through the cache, per weight format and KV type.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <vector>

#include "datasets/corpus.hpp"
#include "impls/kvcache/kv_cache.hpp"
#include "impls/quant/formats.hpp"
#include "model/model.hpp"

namespace memtrade::kvcache {

class Decoder {
 public:
  Decoder(Device& dev, const model::Config& c, std::span<const float> params, KvCache& cache,
          std::optional<quant::Spec> weights = std::nullopt);
  // Bytes of the weights the decode step reads (every projection and lm_head as stored).
  double weight_bytes_read() const { return weight_bytes_; }
  // Bytes of every weight as the decoder stores it (those read per token, the fp32 embedding and norms).
  double weight_bytes_stored() const;
  // Appends tokens[i] to request reqs[i] (Error when the cache refuses) and writes the logits of each
  // request's next token, [reqs x vocab].
  void step(std::span<const int64_t> reqs, std::span<const int32_t> tokens, float* logits);
  const model::Config& config() const { return c_; }

 private:
  // One linear layer [out x in]: dense fp32 rows in weights_, or a quantized blob.
  struct Linear {
    const float* dense = nullptr;
    quant::QLayout layout;
    Buffer blob;
  };
  // dense: the fp32 rows in weights_ (no format); source: the caller's fp32 values to quantize.
  Linear linear(const float* dense, const float* source, int64_t out, int64_t in, const std::optional<quant::Spec>& spec);
  // Y [B x out] (= or +=) X [B x in] W^T.
  void apply(const Linear& w, const float* X, int64_t B, int64_t out, int64_t in, float* Y, bool accumulate);

  Device& dev_;
  model::Config c_;
  model::ParamLayout L_;
  Buffer weights_;
  KvCache& cache_;
  const float *embed_ = nullptr, *final_norm_ = nullptr;
  std::vector<const float*> attn_norm_, mlp_norm_;
  std::vector<std::array<Linear, 7>> layers_;  // q, k, v, o, gate, up, down
  Linear head_;
  double weight_bytes_ = 0;
};

// Cross-entropy of one row of logits against its target, in double (log-sum-exp shifted by the max).
double token_loss(const float* logits, int64_t vocab, int32_t target);

// Teacher forcing through the cache: each row of the batch becomes a request that reads its inputs one
// token at a time; returns the loss of every (row, position) against its target, row-major, then
// releases the requests.
std::vector<double> teacher_forced_losses(Decoder& d, KvCache& cache, const datasets::Batch& b);

}  // namespace memtrade::kvcache
