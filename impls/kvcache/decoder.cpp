#include "impls/kvcache/decoder.hpp"

#include <cmath>
#include <cstring>

#include "common/blas.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "impls/quant/matvec.hpp"
#include "model/layers.hpp"

namespace memtrade::kvcache {

using namespace memtrade::model;

Decoder::Linear Decoder::linear(const float* dense, const float* source, int64_t out, int64_t in,
                                const std::optional<quant::Spec>& spec) {
  Linear w;
  if (!spec) {
    w.dense = dense;
    weight_bytes_ += 4.0 * static_cast<double>(out * in);
    return w;
  }
  w.layout = quant::layout(*spec, out, in);
  w.blob = Buffer(dev_.memory(), w.layout.total_bytes(), Tag::weights);
  quant::quantize(w.layout, source, w.blob.as<uint8_t>());
  weight_bytes_ += static_cast<double>(w.layout.total_bytes());
  return w;
}

void Decoder::apply(const Linear& w, const float* X, int64_t B, int64_t out, int64_t in, float* Y, bool accumulate) {
  if (w.dense) {
    blas::sgemm(false, true, B, out, in, 1.f, X, in, w.dense, in, accumulate ? 1.f : 0.f, Y, out);
    return;
  }
  Buffer tmp;
  float* dst = Y;
  if (accumulate) {
    tmp = Buffer(dev_.memory(), static_cast<std::size_t>(B * out) * 4, Tag::workspace);
    dst = tmp.as<float>();
  }
  if (B == 1) {
    quant::matvec_cpu(w.layout, w.blob.as<uint8_t>(), X, dst);
  } else {
    Buffer ws(dev_.memory(), quant::matmul_workspace_bytes(w.layout, B), Tag::workspace);
    quant::matmul_cpu(w.layout, w.blob.as<uint8_t>(), X, B, dst, ws.as<float>());
  }
  if (accumulate)
    for (int64_t i = 0; i < B * out; ++i) Y[i] += dst[i];
}

Decoder::Decoder(Device& dev, const Config& c, std::span<const float> params, KvCache& cache,
                 std::optional<quant::Spec> weights)
    : dev_(dev), c_(c), L_(param_layout(c)), cache_(cache) {
  MT_CHECK(static_cast<int64_t>(params.size()) == L_.total, "decoder: the parameters do not match the config");
  const KvShape& s = cache.shape();
  MT_CHECK(s.layers == c.layers && s.kv_heads == c.kv_heads && s.head_dim == c.head_dim(),
           "decoder: the cache's shape does not match the model");
  MT_CHECK(dev.backend() == Backend::cpu, "decoder: CPU only");
  const int64_t D = c.dim, KV = c.kv_dim(), F = c.ffn, V = c.vocab;
  // fp32 storage: everything (dense), or the embedding and the norms only (quantized projections).
  const int64_t fp32_floats = weights ? V * D + (2 * c.layers + 1) * D : L_.total;
  weights_ = Buffer(dev.memory(), static_cast<std::size_t>(fp32_floats) * sizeof(float), Tag::weights);
  float* w = weights_.as<float>();
  if (!weights) {
    std::memcpy(w, params.data(), params.size() * sizeof(float));
  } else {
    std::memcpy(w, params.data() + L_.embed, static_cast<std::size_t>(V * D) * sizeof(float));
    int64_t at = V * D;
    for (const auto& P : L_.layer)
      for (int64_t off : {P.attn_norm, P.mlp_norm}) {
        std::memcpy(w + at, params.data() + off, static_cast<std::size_t>(D) * sizeof(float));
        at += D;
      }
    std::memcpy(w + at, params.data() + L_.final_norm, static_cast<std::size_t>(D) * sizeof(float));
  }
  // Where each fp32 tensor lives now.
  auto fp32 = [&](int64_t offset) { return weights ? nullptr : w + offset; };
  embed_ = weights ? w : w + L_.embed;
  for (int64_t l = 0; l < c.layers; ++l) {
    const auto& P = L_.layer[l];
    attn_norm_.push_back(weights ? w + V * D + 2 * l * D : w + P.attn_norm);
    mlp_norm_.push_back(weights ? w + V * D + (2 * l + 1) * D : w + P.mlp_norm);
    const float* src = params.data();
    layers_.push_back({linear(fp32(P.wq), src + P.wq, D, D, weights), linear(fp32(P.wk), src + P.wk, KV, D, weights),
                       linear(fp32(P.wv), src + P.wv, KV, D, weights), linear(fp32(P.wo), src + P.wo, D, D, weights),
                       linear(fp32(P.wg), src + P.wg, F, D, weights), linear(fp32(P.wu), src + P.wu, F, D, weights),
                       linear(fp32(P.wd), src + P.wd, D, F, weights)});
  }
  final_norm_ = weights ? w + V * D + 2 * c.layers * D : w + L_.final_norm;
  std::optional<quant::Spec> head;
  if (weights) head = quant::parse_spec("int8");
  head_ = linear(fp32(L_.head), params.data() + L_.head, V, D, head);
}

double Decoder::weight_bytes_stored() const {
  double b = static_cast<double>(weights_.bytes());
  for (const auto& layer : layers_)
    for (const Linear& w : layer) b += static_cast<double>(w.blob.bytes());
  return b + static_cast<double>(head_.blob.bytes());
}

void Decoder::step(std::span<const int64_t> reqs, std::span<const int32_t> tokens, float* logits) {
  MT_CHECK(reqs.size() == tokens.size() && !reqs.empty(), "decoder: one token per request");
  const int64_t B = static_cast<int64_t>(reqs.size()), D = c_.dim, KV = c_.kv_dim(), F = c_.ffn, V = c_.vocab,
                H = c_.heads, hd = c_.head_dim();
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
    std::memcpy(x + b * D, embed_ + static_cast<int64_t>(tokens[b]) * D, D * 4);
  }
  auto rope = [&](float* t, int64_t heads, int64_t p) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      float cs, sn;
      rope_cos_sin(p, i, hd, c_.rope_theta, cs, sn);
      for (int64_t h = 0; h < heads; ++h)
        rope_rotate_pair(t[h * hd + i], t[h * hd + i + hd / 2], cs, sn, t[h * hd + i], t[h * hd + i + hd / 2]);
    }
  };
  const KvShape& s = cache_.shape();
  for (int64_t l = 0; l < c_.layers; ++l) {
    const auto& P = layers_[l];
    rmsnorm_forward(x, attn_norm_[l], xn, r, B, D, c_.norm_eps);
    apply(P[0], xn, B, D, D, q, false);
    apply(P[1], xn, B, KV, D, k, false);
    apply(P[2], xn, B, KV, D, v, false);
    for (int64_t b = 0; b < B; ++b) {
      rope(q + b * D, H, pos[b]);
      rope(k + b * KV, c_.kv_heads, pos[b]);
      uint8_t* e = cache_.entry(reqs[b], l, pos[b]);
      for (int64_t h = 0; h < c_.kv_heads; ++h) {
        encode_head(s.type, k + b * KV + h * hd, hd, e + h * s.head_bytes());
        encode_head(s.type, v + b * KV + h * hd, hd, e + (c_.kv_heads + h) * s.head_bytes());
      }
    }
    cache_.stage(reqs, l);
    decode_attention(cache_, reqs, l, q, H, o);
    apply(P[3], o, B, D, D, x, true);  // x += o Wo^T
    rmsnorm_forward(x, mlp_norm_[l], xn, r, B, D, c_.norm_eps);
    apply(P[4], xn, B, F, D, g, false);
    apply(P[5], xn, B, F, D, u, false);
    swiglu_forward(g, u, g, B * F);
    apply(P[6], g, B, D, F, x, true);  // x += h Wd^T
  }
  rmsnorm_forward(x, final_norm_, xn, r, B, D, c_.norm_eps);
  apply(head_, xn, B, V, D, logits, false);
}

double token_loss(const float* z, int64_t V, int32_t target) {
  double mx = z[0], sum = 0;
  for (int64_t j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(z[j]));
  for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
  return std::log(sum) + mx - z[target];
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
    for (int64_t i = 0; i < B; ++i) loss[i * T + t] = token_loss(&logits[i * V], V, b.targets[i * T + t]);
  }
  for (int64_t r : reqs) cache.release(r);
  return loss;
}

}  // namespace memtrade::kvcache
