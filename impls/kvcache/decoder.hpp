// The model of model/ run the way inference runs it: one token per step for a batch of requests,
// through a KV cache (prefill token by token, then decode). Each step appends the token's K and V at
// every layer (quantized on write by the cache's storage type) and attends over the request's cache with
// the decode kernel; the matrix products are fp32 GEMMs over the batch's rows, the layer math that of
// model/layers.hpp, so with an fp32 cache the logits equal the full-sequence forward's up to fp32
// summation order. Weights live in the device's pool (tag weights), step buffers are tag workspace.
#pragma once

#include <span>
#include <vector>

#include "datasets/corpus.hpp"
#include "impls/kvcache/kv_cache.hpp"
#include "model/model.hpp"

namespace memtrade::kvcache {

class Decoder {
 public:
  Decoder(Device& dev, const model::Config& c, std::span<const float> params, KvCache& cache);
  // Appends tokens[i] to request reqs[i] (Error when the cache refuses) and writes the logits of each
  // request's next token, [reqs x vocab].
  void step(std::span<const int64_t> reqs, std::span<const int32_t> tokens, float* logits);
  const model::Config& config() const { return c_; }

 private:
  Device& dev_;
  model::Config c_;
  model::ParamLayout L_;
  Buffer weights_;
  KvCache& cache_;
};

// Teacher forcing through the cache: each row of the batch becomes a request that reads its inputs one
// token at a time; returns the loss of every (row, position) against its target, row-major, then
// releases the requests.
std::vector<double> teacher_forced_losses(Decoder& d, KvCache& cache, const datasets::Batch& b);

}  // namespace memtrade::kvcache
