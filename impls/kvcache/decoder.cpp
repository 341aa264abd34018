#include "impls/kvcache/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/blas.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "impls/quant/matvec.hpp"
#include "impls/quant/simd/matvec_a8.hpp"
#include "model/layers.hpp"

namespace memtrade::kvcache {

using namespace memtrade::model;

namespace {
// Each projection's offset in the staging area is a multiple of this.
constexpr std::size_t kStagingAlign = 64;
std::size_t staging_slot(std::size_t bytes) { return (bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }
}  // namespace

Decoder::Linear Decoder::linear(const float* source, int64_t out, int64_t in, const std::optional<quant::Spec>& spec,
                                TrackedAllocator& pool) {
  Linear w;
  std::size_t bytes = static_cast<std::size_t>(out * in) * sizeof(float);
  if (spec) {
    w.dense = false;
    w.layout = quant::layout(*spec, out, in);
    bytes = static_cast<std::size_t>(w.layout.total_bytes());
  }
  w.store = Buffer(pool, bytes, Tag::weights);
  if (spec)
    quant::quantize(w.layout, source, w.store.as<uint8_t>());
  else
    std::memcpy(w.store.data(), source, bytes);
  w.at = w.store.as<uint8_t>();
  weight_bytes_ += static_cast<double>(bytes);
  return w;
}

void Decoder::apply(const Linear& w, const float* X, int64_t B, int64_t out, int64_t in, float* Y, bool accumulate) {
  if (w.dense) {
    const auto* W = reinterpret_cast<const float*>(w.at);
    if (B <= quant::kMatmulSmallBatch)  // decode steps: W streamed once, not packed by sgemm
      quant::matmul_dense_f32(W, X, B, Y, out, in, accumulate);
    else
      blas::sgemm(false, true, B, out, in, 1.f, X, in, W, in, accumulate ? 1.f : 0.f, Y, out);
    return;
  }
  Buffer tmp;
  float* dst = Y;
  if (accumulate) {
    tmp = Buffer(dev_.memory(), static_cast<std::size_t>(B * out) * 4, Tag::workspace);
    dst = tmp.as<float>();
  }
  if (B == 1 && int8_activations_) {
    Buffer ws(dev_.memory(), quant::a8_workspace_bytes(in), Tag::workspace);
    quant::matvec_a8(w.layout, w.at, X, dst, ws.data());
  } else if (B == 1) {
    quant::matvec_cpu(w.layout, w.at, X, dst);
  } else {
    Buffer ws(dev_.memory(), quant::matmul_workspace_bytes(w.layout, B), Tag::workspace);
    quant::matmul_cpu(w.layout, w.at, X, B, dst, ws.as<float>());
  }
  if (accumulate)
    for (int64_t i = 0; i < B * out; ++i) Y[i] += dst[i];
}

void Decoder::set_int8_activations(bool on) {
  if (on) {
    MT_CHECK(!head_.dense, "decoder: int8 activations need a weight format (the fp32 projections have no integer codes)");
    auto check = [](const Linear& w) {
      if (const std::string why = quant::a8_unsupported(w.layout); !why.empty())
        throw Error("decoder: int8 activations: " + why);
    };
    for (const auto& layer : layers_)
      for (const Linear& w : layer) check(w);
    check(head_);
  }
  int8_activations_ = on;
}

Decoder::Decoder(Device& dev, const Config& c, std::span<const float> params, KvCache& cache,
                 std::optional<quant::Spec> weights, int64_t host_layers, bool fuse_projections)
    : dev_(dev), c_(c), L_(param_layout(c)), cache_(cache), host_layers_(host_layers) {
  MT_CHECK(static_cast<int64_t>(params.size()) == L_.total, "decoder: the parameters do not match the config");
  const KvShape& s = cache.shape();
  MT_CHECK(s.layers == c.layers && s.kv_heads == c.kv_heads && s.head_dim == c.head_dim(),
           "decoder: the cache's shape does not match the model");
  MT_CHECK(dev.backend() == Backend::cpu, "decoder: CPU only");
  MT_CHECK(host_layers >= 0 && host_layers <= c.layers, "decoder: host_layers must be in [0, " +
                                                            std::to_string(c.layers) + "], got " + std::to_string(host_layers));
  const int64_t D = c.dim, KV = c.kv_dim(), F = c.ffn, V = c.vocab;
  // One fp32 buffer for the embedding and the norms; every projection and the head in its own.
  weights_ = Buffer(dev.memory(), static_cast<std::size_t>(V * D + (2 * c.layers + 1) * D) * sizeof(float), Tag::weights);
  float* w = weights_.as<float>();
  const float* src = params.data();
  std::memcpy(w, src + L_.embed, static_cast<std::size_t>(V * D) * sizeof(float));
  embed_ = w;
  int64_t at = V * D;
  auto norm = [&](int64_t offset) {
    std::memcpy(w + at, src + offset, static_cast<std::size_t>(D) * sizeof(float));
    at += D;
    return w + at - D;
  };
  std::size_t staging = 0;
  fused_ = fuse_projections && weights && quant::rows_independent(*weights);
  std::vector<float> rows;  // a fused projection's source rows, stacked
  auto stacked = [&](std::initializer_list<std::pair<int64_t, int64_t>> parts, TrackedAllocator& pool) {
    int64_t n = 0;
    for (const auto& [offset, out] : parts) n += out;
    rows.resize(static_cast<std::size_t>(n * D));
    float* at = rows.data();
    for (const auto& [offset, out] : parts) at = std::copy(src + offset, src + offset + out * D, at);
    return linear(rows.data(), n, D, weights, pool);
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    const auto& P = L_.layer[l];
    attn_norm_.push_back(norm(P.attn_norm));
    mlp_norm_.push_back(norm(P.mlp_norm));
    TrackedAllocator& pool = l < host_layers ? dev.host() : dev.memory();
    std::vector<Linear>& lin = layers_.emplace_back();
    if (fused_) {
      lin.push_back(stacked({{P.wq, D}, {P.wk, KV}, {P.wv, KV}}, pool));
      lin.push_back(linear(src + P.wo, D, D, weights, pool));
      lin.push_back(stacked({{P.wg, F}, {P.wu, F}}, pool));
    } else {
      for (const auto& [offset, out] : {std::pair{P.wq, D}, {P.wk, KV}, {P.wv, KV}, {P.wo, D}, {P.wg, F}, {P.wu, F}})
        lin.push_back(linear(src + offset, out, D, weights, pool));
    }
    lin.push_back(linear(src + P.wd, D, F, weights, pool));
    if (l < host_layers) {
      std::size_t bytes = 0;
      for (const Linear& lin : layers_.back()) bytes += staging_slot(lin.store.bytes());
      staging = std::max(staging, bytes);
    }
  }
  final_norm_ = norm(L_.final_norm);
  if (!weights && c.tie_embeddings) {  // the head reads the embedding's rows
    head_.at = reinterpret_cast<const uint8_t*>(embed_);
    weight_bytes_ += 4.0 * static_cast<double>(V * D);
  } else {
    std::optional<quant::Spec> head;
    if (weights) head = quant::parse_spec("int8");
    head_ = linear(src + L_.head, V, D, head, dev.memory());
  }
  if (staging > 0) staging_ = Buffer(dev.memory(), staging, Tag::weights);
}

void Decoder::stage(int64_t l) {
  std::size_t off = 0;
  for (Linear& w : layers_[l]) {
    const std::size_t n = w.store.bytes();
    dev_.copy(staging_.as<uint8_t>() + off, w.store.data(), n, CopyKind::host_to_device);
    w.at = staging_.as<uint8_t>() + off;
    off += staging_slot(n);
    to_device_ += static_cast<int64_t>(n);
  }
}

double Decoder::weight_bytes_stored() const {
  double b = static_cast<double>(weights_.bytes());
  for (const auto& layer : layers_)
    for (const Linear& w : layer) b += static_cast<double>(w.store.bytes());
  return b + static_cast<double>(head_.store.bytes());
}

int64_t Decoder::weight_host_bytes() const {
  int64_t b = 0;
  for (int64_t l = 0; l < host_layers_; ++l)
    for (const Linear& w : layers_[l]) b += static_cast<int64_t>(w.store.bytes());
  return b;
}

void Decoder::step(std::span<const int64_t> reqs, std::span<const int32_t> tokens, float* logits) {
  MT_CHECK(reqs.size() == tokens.size() && !reqs.empty(), "decoder: one token per request");
  const int64_t B = static_cast<int64_t>(reqs.size()), D = c_.dim, KV = c_.kv_dim(), F = c_.ffn, V = c_.vocab,
                H = c_.heads, hd = c_.head_dim();
  auto& pool = dev_.memory();
  const int64_t QKV = D + 2 * KV;
  // q, k and v of the batch in one buffer: [B x D], [B x KV], [B x KV] one after the other, or, fused, row
  // b's [q, k, v] at b x QKV; gate and up likewise ([B x F] twice, or row b's [gate, up] at b x 2F).
  Buffer xb(pool, B * D * 4, Tag::workspace), xnb(pool, B * D * 4, Tag::workspace), qkvb(pool, B * QKV * 4, Tag::workspace),
      ob(pool, B * D * 4, Tag::workspace), gub(pool, B * 2 * F * 4, Tag::workspace), rms(pool, B * 4, Tag::workspace);
  float *x = xb.as<float>(), *xn = xnb.as<float>(), *q = qkvb.as<float>(), *o = ob.as<float>(), *gu = gub.as<float>(),
        *r = rms.as<float>();
  const int64_t qkv_stride = fused_ ? QKV : D, kv_stride = fused_ ? QKV : KV;  // from one row to the next
  float *k = fused_ ? q + D : q + B * D, *v = fused_ ? q + D + KV : q + B * (D + KV);
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
    if (l < host_layers_) stage(l);
    const auto& P = layers_[l];
    rmsnorm_forward(x, attn_norm_[l], xn, r, B, D, c_.norm_eps);
    if (fused_) {
      apply(P[0], xn, B, QKV, D, q, false);
    } else {
      apply(P[0], xn, B, D, D, q, false);
      apply(P[1], xn, B, KV, D, k, false);
      apply(P[2], xn, B, KV, D, v, false);
    }
    for (int64_t b = 0; b < B; ++b) {
      float *qb = q + b * qkv_stride, *kb = k + b * kv_stride, *vb = v + b * kv_stride;
      rope(qb, H, pos[b]);
      rope(kb, c_.kv_heads, pos[b]);
      cache_.write_token(reqs[b], l, pos[b], kb, vb);
      auto raise = [](float& m, float x) {
        if (!std::isnan(m) && (std::isnan(x) || std::abs(x) > m)) m = std::abs(x);
      };
      if (kv_amax_)
        for (int kv = 0; kv < 2; ++kv)
          for (int64_t h = 0; h < c_.kv_heads; ++h) {
            float& m = (*kv_amax_)[static_cast<std::size_t>(s.scale_index(l, kv, h))];
            const float* x = (kv == 0 ? kb : vb) + h * hd;
            for (int64_t i = 0; i < hd; ++i) raise(m, x[i]);
          }
      if (key_amax_)
        for (int64_t i = 0; i < KV; ++i) raise((*key_amax_)[static_cast<std::size_t>(l * KV + i)], kb[i]);
    }
    if (fused_)  // the queries packed [B x D] for the attention (row b moves down; k and v are cached)
      for (int64_t b = 1; b < B; ++b) std::memmove(q + b * D, q + b * QKV, static_cast<std::size_t>(D) * 4);
    cache_.stage(reqs, l);
    decode_attention(cache_, reqs, l, q, H, o);
    const Linear &wo = P[fused_ ? 1 : 3], &wd = P[fused_ ? 3 : 6];
    apply(wo, o, B, D, D, x, true);  // x += o Wo^T
    rmsnorm_forward(x, mlp_norm_[l], xn, r, B, D, c_.norm_eps);
    if (fused_) {  // h of row b into gu[b x F ..]: below its own gate and up (row 0 in place, as unfused)
      apply(P[2], xn, B, 2 * F, D, gu, false);
      for (int64_t b = 0; b < B; ++b) swiglu_forward(gu + b * 2 * F, gu + b * 2 * F + F, gu + b * F, F);
    } else {
      apply(P[4], xn, B, F, D, gu, false);
      apply(P[5], xn, B, F, D, gu + B * F, false);
      swiglu_forward(gu, gu + B * F, gu, B * F);
    }
    apply(wd, gu, B, D, F, x, true);  // x += h Wd^T
  }
  rmsnorm_forward(x, final_norm_, xn, r, B, D, c_.norm_eps);
  apply(head_, xn, B, V, D, logits, false);
}

void Decoder::record_kv_amax(std::vector<float>* amax, std::vector<float>* key_channels) {
  MT_CHECK(!amax || static_cast<int64_t>(amax->size()) == c_.layers * 2 * c_.kv_heads,
           "decoder: the amax vector needs layers x 2 x kv_heads entries");
  MT_CHECK(!key_channels || static_cast<int64_t>(key_channels->size()) == c_.layers * c_.kv_heads * c_.head_dim(),
           "decoder: the key channel amax vector needs layers x kv_heads x head_dim entries");
  kv_amax_ = amax;
  key_amax_ = key_channels;
}

namespace {
// The calibration pass: the windows teacher forced through an fp32 cache, recording amax per (layer, K or
// V, kv head) and per (layer, kv head, key channel).
void calibration_amax(const Config& c, std::span<const float> params, const std::optional<quant::Spec>& weights,
                      const datasets::Batch& windows, std::vector<float>* heads, std::vector<float>* key_channels) {
  auto dev = make_cpu_device();
  ContiguousCache cache(*dev, KvShape{c.layers, c.kv_heads, c.head_dim(), KvType::f32});
  Decoder d(*dev, c, params, cache, weights);
  d.record_kv_amax(heads, key_channels);
  teacher_forced_losses(d, cache, windows);
}
}  // namespace

std::vector<float> calibrate_kv_scales(const Config& c, std::span<const float> params,
                                       const std::optional<quant::Spec>& weights, const datasets::Batch& windows) {
  std::vector<float> amax(static_cast<std::size_t>(c.layers * 2 * c.kv_heads), 0.f);
  calibration_amax(c, params, weights, windows, &amax, nullptr);
  const KvShape s{c.layers, c.kv_heads, c.head_dim(), KvType::f32};
  for (int64_t layer = 0; layer < c.layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        float& a = amax[static_cast<std::size_t>(s.scale_index(layer, kv, h))];
        MT_CHECK(std::isfinite(a), std::string("kv scale calibration: a non-finite ") + (kv ? "V" : "K") + " at layer " +
                                       std::to_string(layer));
        a = a > 0 ? a / quant::fp8_e4m3_max : 1.f;
      }
  return amax;
}

std::vector<float> calibrate_key_smoothing(const Config& c, std::span<const float> params,
                                           const std::optional<quant::Spec>& weights, const datasets::Batch& windows,
                                           double alpha) {
  MT_CHECK(alpha > 0 && alpha <= 1, "key smoothing: alpha must be in (0, 1] (got " + std::to_string(alpha) + ")");
  const int64_t per_layer = c.kv_heads * c.head_dim();
  std::vector<float> amax(static_cast<std::size_t>(c.layers * per_layer), 0.f);
  calibration_amax(c, params, weights, windows, nullptr, &amax);
  for (std::size_t i = 0; i < amax.size(); ++i) {
    MT_CHECK(std::isfinite(amax[i]), "key smoothing calibration: a non-finite K at layer " +
                                         std::to_string(static_cast<int64_t>(i) / per_layer));
    const double a = amax[i];
    amax[i] = a > 0 ? static_cast<float>(alpha == 0.5 ? std::sqrt(a) : std::pow(a, alpha)) : 1.f;
  }
  return amax;
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
