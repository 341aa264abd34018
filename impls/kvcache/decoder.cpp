#include "impls/kvcache/decoder.hpp"

#include <cmath>
#include <cstring>

#include "common/blas.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "model/layers.hpp"

namespace memtrade::kvcache {

using namespace memtrade::model;

Decoder::Decoder(Device& dev, const Config& c, std::span<const float> params, KvCache& cache)
    : dev_(dev), c_(c), L_(param_layout(c)), cache_(cache) {
  MT_CHECK(static_cast<int64_t>(params.size()) == L_.total, "decoder: the parameters do not match the config");
  const KvShape& s = cache.shape();
  MT_CHECK(s.layers == c.layers && s.kv_heads == c.kv_heads && s.head_dim == c.head_dim(),
           "decoder: the cache's shape does not match the model");
  MT_CHECK(dev.backend() == Backend::cpu, "decoder: CPU only");
  weights_ = Buffer(dev.memory(), params.size() * sizeof(float), Tag::weights);
  std::memcpy(weights_.data(), params.data(), params.size() * sizeof(float));
}

void Decoder::step(std::span<const int64_t> reqs, std::span<const int32_t> tokens, float* logits) {
  MT_CHECK(reqs.size() == tokens.size() && !reqs.empty(), "decoder: one token per request");
  const int64_t B = static_cast<int64_t>(reqs.size()), D = c_.dim, KV = c_.kv_dim(), F = c_.ffn, V = c_.vocab,
                H = c_.heads, hd = c_.head_dim();
  const float* W = weights_.as<float>();
  auto& pool = dev_.memory();
  Buffer xb(pool, B * D * 4, Tag::workspace), xnb(pool, B * D * 4, Tag::workspace), qb(pool, B * D * 4, Tag::workspace),
      kb(pool, B * KV * 4, Tag::workspace), vb(pool, B * KV * 4, Tag::workspace), ob(pool, B * D * 4, Tag::workspace),
      gb(pool, B * F * 4, Tag::workspace), ub(pool, B * F * 4, Tag::workspace), rms(pool, B * 4, Tag::workspace);
  float *x = xb.as<float>(), *xn = xnb.as<float>(), *q = qb.as<float>(), *k = kb.as<float>(), *v = vb.as<float>(),
        *o = ob.as<float>(), *g = gb.as<float>(), *u = ub.as<float>(), *r = rms.as<float>();
  std::vector<int64_t> pos(B);
  for (int64_t b = 0; b < B; ++b) {
    MT_CHECK(tokens[b] >= 0 && tokens[b] < V, "decoder: token " + std::to_string(tokens[b]) + " is outside the vocabulary");
    MT_CHECK(cache_.append(reqs[b]), "decoder: the KV cache has no room for request " + std::to_string(reqs[b]));
    pos[b] = cache_.length(reqs[b]) - 1;
    std::memcpy(x + b * D, W + L_.embed + static_cast<int64_t>(tokens[b]) * D, D * 4);
  }
  auto rope = [&](float* t, int64_t heads, int64_t p) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      float cs, sn;
      rope_cos_sin(p, i, hd, c_.rope_theta, cs, sn);
      for (int64_t h = 0; h < heads; ++h) rope_rotate_pair(t[h * hd + i], t[h * hd + i + hd / 2], cs, sn, t[h * hd + i], t[h * hd + i + hd / 2]);
    }
  };
  const KvShape& s = cache_.shape();
  for (int64_t l = 0; l < c_.layers; ++l) {
    const auto& P = L_.layer[l];
    rmsnorm_forward(x, W + P.attn_norm, xn, r, B, D, c_.norm_eps);
    blas::sgemm(false, true, B, D, D, 1.f, xn, D, W + P.wq, D, 0.f, q, D);
    blas::sgemm(false, true, B, KV, D, 1.f, xn, D, W + P.wk, D, 0.f, k, KV);
    blas::sgemm(false, true, B, KV, D, 1.f, xn, D, W + P.wv, D, 0.f, v, KV);
    for (int64_t b = 0; b < B; ++b) {
      rope(q + b * D, H, pos[b]);
      rope(k + b * KV, c_.kv_heads, pos[b]);
      uint8_t* e = cache_.entry(reqs[b], l, pos[b]);
      for (int64_t h = 0; h < c_.kv_heads; ++h) {
        encode_head(s.type, k + b * KV + h * hd, hd, e + h * s.head_bytes());
        encode_head(s.type, v + b * KV + h * hd, hd, e + (c_.kv_heads + h) * s.head_bytes());
      }
    }
    decode_attention(cache_, reqs, l, q, H, o);
    blas::sgemm(false, true, B, D, D, 1.f, o, D, W + P.wo, D, 1.f, x, D);  // x += o Wo^T
    rmsnorm_forward(x, W + P.mlp_norm, xn, r, B, D, c_.norm_eps);
    blas::sgemm(false, true, B, F, D, 1.f, xn, D, W + P.wg, D, 0.f, g, F);
    blas::sgemm(false, true, B, F, D, 1.f, xn, D, W + P.wu, D, 0.f, u, F);
    swiglu_forward(g, u, g, B * F);
    blas::sgemm(false, true, B, D, F, 1.f, g, F, W + P.wd, F, 1.f, x, D);  // x += h Wd^T
  }
  rmsnorm_forward(x, W + L_.final_norm, xn, r, B, D, c_.norm_eps);
  blas::sgemm(false, true, B, V, D, 1.f, xn, D, W + L_.head, D, 0.f, logits, V);
}

std::vector<double> teacher_forced_losses(Decoder& d, KvCache& cache, const datasets::Batch& b) {
  const int64_t B = b.batch, T = b.context, V = d.config().vocab;
  std::vector<int64_t> reqs;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t r = cache.add(T);
    MT_CHECK(r >= 0, "teacher forcing: the KV cache cannot hold " + std::to_string(B) + " requests of " + std::to_string(T) + " tokens");
    reqs.push_back(r);
  }
  std::vector<float> logits(static_cast<std::size_t>(B * V));
  std::vector<int32_t> tok(B);
  std::vector<double> loss(static_cast<std::size_t>(B * T));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < B; ++i) tok[i] = b.inputs[i * T + t];
    d.step(reqs, tok, logits.data());
    for (int64_t i = 0; i < B; ++i) {
      const float* z = &logits[i * V];
      double mx = z[0], sum = 0;
      for (int64_t j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(z[j]));
      for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
      loss[i * T + t] = std::log(sum) + mx - z[b.targets[i * T + t]];
    }
  }
  for (int64_t r : reqs) cache.release(r);
  return loss;
}

}  // namespace memtrade::kvcache
