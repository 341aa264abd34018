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
// perplexity through the cache, per weight format and KV type. With int8 activations
// (set_int8_activations) the batch-1 matvecs are the quant technique's packed-a8 kernel instead: each
// projection's input rounded to int8 per block of 32 and multiplied in integer byte multiply-adds, as
// llama.cpp's quantized dot products do (W4A8 / W8A8).
//
// Weight offload (host_layers > 0): the projections of the first host_layers layers live in the host
// pool (pinned on CUDA; tag weights), as llama.cpp keeps the layers it does not offload to the GPU;
// before such a layer runs, its projections are copied into one device staging area the size of
// the largest offloaded layer, so every decode step moves every offloaded layer's bytes to the device
// once (counted by weight_bytes_to_device()). On the CPU backend the copy is a host copy.
#pragma once

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
  // fuse_projections: stack q/k/v and gate/up where the weight format allows it without changing a bit
  // (see layers_); false keeps seven projections per layer (the tests compare the two).
  Decoder(Device& dev, const model::Config& c, std::span<const float> params, KvCache& cache,
          std::optional<quant::Spec> weights = std::nullopt, int64_t host_layers = 0, bool fuse_projections = true);
  // Bytes of the weights the decode step reads (every projection and lm_head as stored).
  double weight_bytes_read() const { return weight_bytes_; }
  // Bytes of every weight as the decoder stores it (those read per token, the fp32 embedding and norms),
  // in the device and the host pool together.
  double weight_bytes_stored() const;
  // Weight offload: bytes of the projections in the host pool, of the device staging area, and copied
  // host -> device since construction or the last reset.
  int64_t weight_host_bytes() const;
  int64_t weight_staging_bytes() const { return static_cast<int64_t>(staging_.bytes()); }
  int64_t weight_bytes_to_device() const { return to_device_; }
  void reset_weight_traffic() { to_device_ = 0; }
  // Appends tokens[i] to request reqs[i] (Error when the cache refuses) and writes the logits of each
  // request's next token, [reqs x vocab].
  void step(std::span<const int64_t> reqs, std::span<const int32_t> tokens, float* logits);
  const model::Config& config() const { return c_; }
  // Batch-1 matvecs through packed-a8 (int8 activations) when on. Error when the decoder has no weight
  // format or a projection's layout is one packed-a8 does not take (quant::a8_unsupported says why).
  void set_int8_activations(bool on);
  // While set, step() raises amax[KvShape::scale_index(layer, kv, head)] (kv 0: K, 1: V) to the largest
  // |value| of each K and V head vector it caches, and key_channels[(layer * kv_heads + head) * head_dim + i]
  // to the largest |K_i| (NaN when one is NaN); nullptr stops it.
  void record_kv_amax(std::vector<float>* amax, std::vector<float>* key_channels = nullptr);

 private:
  // One linear layer [out x in]: dense fp32 rows or a quantized blob, in its own buffer (or, for a tied
  // dense head, the embedding's rows).
  struct Linear {
    bool dense = true;
    quant::QLayout layout;
    Buffer store;
    const uint8_t* at = nullptr;  // where the kernels read it now: store, the staging area or the embedding
  };
  // The source's fp32 values [out x in] stored as fp32 or in the format, in `pool`.
  Linear linear(const float* source, int64_t out, int64_t in, const std::optional<quant::Spec>& spec,
                TrackedAllocator& pool);
  // Y [B x out] (= or +=) X [B x in] W^T.
  void apply(const Linear& w, const float* X, int64_t B, int64_t out, int64_t in, float* Y, bool accumulate);
  // Copies layer l's projections from the host pool into the staging area and points them there.
  void stage(int64_t l);

  Device& dev_;
  model::Config c_;
  model::ParamLayout L_;
  Buffer weights_;
  KvCache& cache_;
  const float *embed_ = nullptr, *final_norm_ = nullptr;
  std::vector<const float*> attn_norm_, mlp_norm_;
  // Each layer's projections in the order the step applies them: q, k, v, o, gate, up, down; or, when the
  // weight format quantizes every row on its own (quant::rows_independent: the bits do not change), four:
  // qkv ([q; k; v] stacked, one matvec for the three, as vLLM's QKV projection), o, gate_up ([gate; up]),
  // down. A batch-1 step then starts 4 kernels per layer instead of 7 and rounds each input to int8 once.
  std::vector<std::vector<Linear>> layers_;
  bool fused_ = false;
  Linear head_;
  double weight_bytes_ = 0;
  int64_t host_layers_ = 0, to_device_ = 0;
  bool int8_activations_ = false;
  std::vector<float>*kv_amax_ = nullptr, *key_amax_ = nullptr;
  Buffer staging_;
};

// Cross-entropy of one row of logits against its target, in double (log-sum-exp shifted by the max).
double token_loss(const float* logits, int64_t vocab, int32_t target);

// Teacher forcing through the cache: each row of the batch becomes a request that reads its inputs one
// token at a time; returns the loss of every (row, position) against its target, row-major, then
// releases the requests.
std::vector<double> teacher_forced_losses(Decoder& d, KvCache& cache, const datasets::Batch& b);

// Static fp8-e4m3 KV scales (KvShape::static_scales) from calibration, as vLLM's k_scale / v_scale: the
// windows teacher forced through an fp32 cache by a decoder with these weights; each (layer, K or V, kv
// head) scale is its amax / 448 (1 for a head that stayed zero). Error naming the layer on a non-finite
// K or V.
std::vector<float> calibrate_kv_scales(const model::Config& c, std::span<const float> params,
                                       const std::optional<quant::Spec>& weights, const datasets::Batch& windows);

// int4-smooth's key smoothing factors (KvShape::key_smoothing), as QServe's SmoothAttention: the same
// calibration pass; each (layer, kv head, channel) factor is amax^alpha of that channel of K (QServe's
// alpha: 0.5), 1 for a channel that stayed zero. Error naming the layer on a non-finite K.
constexpr double kKeySmoothingAlpha = 0.5;
std::vector<float> calibrate_key_smoothing(const model::Config& c, std::span<const float> params,
                                           const std::optional<quant::Spec>& weights, const datasets::Batch& windows,
                                           double alpha = kKeySmoothingAlpha);

}  // namespace memtrade::kvcache
