// Small model fixtures shared by the CPU and CUDA training tests.
#pragma once

#include <cstdint>
#include <vector>

#include "datasets/random.hpp"
#include "model/model.hpp"
#include "model/train.hpp"

namespace memtrade::test {

// 2 layers, 4 query heads over 2 kv heads (GQA), head_dim 8, SwiGLU width 48, context 16.
inline model::Config tiny_model() {
  model::Config c;
  c.vocab = 256;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 48;
  c.context = 16;
  return c;
}

inline model::TrainOptions train_options(precision::Policy p, int64_t batch = 2, int64_t seq = 16) {
  model::TrainOptions o;
  o.policy = p;
  o.batch = batch;
  o.seq = seq;
  o.lr = 3e-3f;
  return o;
}

// A batch of random bytes (no corpus needed).
inline datasets::Batch random_tokens(int64_t batch, int64_t seq, uint64_t seed) {
  datasets::Batch b;
  b.batch = batch;
  b.context = seq;
  for (int64_t i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(static_cast<int32_t>(datasets::uniform01(seed, 2 * i) * 256));
    b.targets.push_back(static_cast<int32_t>(datasets::uniform01(seed, 2 * i + 1) * 256));
  }
  return b;
}

// Larger-than-init weights so that every path (attention scores, SwiGLU, norms) is far from linear.
inline std::vector<float> test_weights(const model::Config& c, uint64_t seed) {
  auto w = model::init_params(c, seed);
  const model::ParamLayout L = model::param_layout(c);
  for (const auto& t : L.tensors)
    for (int64_t i = 0; i < t.size; ++i) {
      float& x = w[t.offset + i];
      x = t.shape.size() == 1 ? 1.f + 0.3f * static_cast<float>(datasets::normal(seed + 1, t.offset + i)) : 8.f * x;
    }
  return w;
}

}  // namespace memtrade::test
