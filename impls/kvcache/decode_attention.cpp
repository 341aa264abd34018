#include "impls/kvcache/decode_attention.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "common/common.hpp"
#include "impls/quant/formats.hpp"

namespace memtrade::kvcache {

namespace {
void check(const KvCache& c, int64_t heads) {
  const KvShape& s = c.shape();
  MT_CHECK(heads > 0 && heads % s.kv_heads == 0 && heads / s.kv_heads <= 256 && s.head_dim <= 256,
           "decode attention: heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" +
               std::to_string(s.kv_heads) + ") and head_dim at most 256");
}
}  // namespace

void decode_attention_ref(const KvCache& c, int64_t req, int64_t layer, const float* q, int64_t heads, double* out) {
  check(c, heads);
  const KvShape& s = c.shape();
  const int64_t hd = s.head_dim, group = heads / s.kv_heads, n = c.length(req);
  MT_CHECK(n > 0, "decode attention: the request has no cached token");
  // Every K and V of the request, decoded: [n][2][kv_heads][hd].
  std::vector<double> kv(static_cast<std::size_t>(n * 2 * s.kv_heads * hd));
  std::vector<float> tmp(static_cast<std::size_t>(hd));
  c.runs(req, layer, [&](const uint8_t* e, int64_t pos, int64_t count) {
    for (int64_t t = 0; t < count; ++t)
      for (int64_t r = 0; r < 2 * s.kv_heads; ++r) {
        decode_head(s.type, e + (t * 2 * s.kv_heads + r) * s.head_bytes(), hd, tmp.data(),
                    s.scale(layer, r < s.kv_heads ? 0 : 1, r % s.kv_heads));
        std::copy(tmp.begin(), tmp.end(), kv.begin() + ((pos + t) * 2 * s.kv_heads + r) * hd);
      }
  });
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> p(static_cast<std::size_t>(n));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t g = h / group;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t t = 0; t < n; ++t) {
      const double* k = &kv[(t * 2 * s.kv_heads + g) * hd];
      double dot = 0;
      for (int64_t i = 0; i < hd; ++i) dot += static_cast<double>(q[h * hd + i]) * k[i];
      p[t] = dot * scale;
      mx = std::max(mx, p[t]);
    }
    double sum = 0;
    for (int64_t t = 0; t < n; ++t) sum += (p[t] = std::exp(p[t] - mx));
    for (int64_t i = 0; i < hd; ++i) out[h * hd + i] = 0;
    for (int64_t t = 0; t < n; ++t) {
      const double* v = &kv[(t * 2 * s.kv_heads + s.kv_heads + g) * hd];
      for (int64_t i = 0; i < hd; ++i) out[h * hd + i] += p[t] / sum * v[i];
    }
  }
}

namespace {

constexpr int64_t kChunk = 8;  // tokens scored together (chunks start at multiples of 8 positions)

// The same values as decode_head, written so that the compiler vectorizes them (fp8 through a table);
// fp8-e4m3-static without its scale (the kernel applies it to the scores and the output).
void decode_fast(KvType t, const uint8_t* r, int64_t n, float* x) {
  static const std::array<float, 256> fp8 = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[i] = quant::fp8_e4m3_decode(static_cast<uint8_t>(i));
    return a;
  }();
  switch (t) {
    case KvType::f32: std::memcpy(x, r, n * 4); return;
    case KvType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, r + 2 * i, 2);
        const uint32_t w = static_cast<uint32_t>(b) << 16;
        std::memcpy(x + i, &w, 4);
      }
      return;
    case KvType::int8:
    case KvType::fp8_e4m3: {
      float s;
      std::memcpy(&s, r + n, 4);
      if (t == KvType::int8)
        for (int64_t i = 0; i < n; ++i) x[i] = s * static_cast<float>(static_cast<int8_t>(r[i]));
      else
        for (int64_t i = 0; i < n; ++i) x[i] = s * fp8[r[i]];
      return;
    }
    case KvType::fp8_e4m3_static:
      for (int64_t i = 0; i < n; ++i) x[i] = fp8[r[i]];
      return;
    default: decode_head(t, r, n, x);
  }
}

// Eight-float vectors (GCC / Clang vector extensions: one AVX register, or two SSE ones), internal to
// this file, so the ABI note for passing them without AVX does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
using V8 = float __attribute__((vector_size(32)));
inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// q.k in a fixed order on every machine (the same for every layout, so paged and contiguous agree bit
// for bit): two chains of eight partial sums, then a fixed tree over the lanes; head_dim not a multiple
// of 16 in order.
float dot(const float* a, const float* b, int64_t n) {
  if (n % 16 != 0) {
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
  }
  V8 s0 = {}, s1 = {};
  for (int64_t i = 0; i < n; i += 16) {
    s0 += load8(a + i) * load8(b + i);
    s1 += load8(a + i + 8) * load8(b + i + 8);
  }
  s0 += s1;
  return ((s0[0] + s0[4]) + (s0[2] + s0[6])) + ((s0[1] + s0[5]) + (s0[3] + s0[7]));
}

// o = o corr + p[0] v[0] + ... + p[count - 1] v[count - 1], in that order per element, eight columns
// held in a register across the tokens.
void scale_add(float* o, float corr, const float* p, const float* const* v, int64_t count, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 acc = load8(o + i) * corr;
    for (int64_t t = 0; t < count; ++t) acc += p[t] * load8(v[t] + i);
    std::memcpy(o + i, &acc, sizeof acc);
  }
  for (; i < n; ++i) {
    float acc = o[i] * corr;
    for (int64_t t = 0; t < count; ++t) acc += p[t] * v[t][i];
    o[i] = acc;
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

void decode_attention(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, const float* q, int64_t heads,
                      float* out) {
  check(c, heads);
  const KvShape& s = c.shape();
  const int64_t hd = s.head_dim, group = heads / s.kv_heads, units = static_cast<int64_t>(reqs.size()) * s.kv_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (int64_t r : reqs) MT_CHECK(c.length(r) > 0, "decode attention: a request has no cached token");
  c.require_staged(reqs, layer);  // here, not from inside the parallel loop
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t b = u / s.kv_heads, g = u % s.kv_heads;
    // Static fp8 scales: q.(s_k k) = s_k (q.k) and sum p (s_v v) = s_v sum p v (1 for other types).
    const float qk_scale = scale * s.scale(layer, 0, g), v_scale = s.scale(layer, 1, g);
    const float* qg = q + (b * heads + g * group) * hd;  // the group's query heads, consecutive
    float* og = out + (b * heads + g * group) * hd;
    alignas(64) float k[kChunk][256], v[kChunk][256];
    float m[256], l[256], p[256][kChunk];
    for (int64_t j = 0; j < group; ++j) {
      m[j] = -std::numeric_limits<float>::infinity();
      l[j] = 0;
      std::fill(og + j * hd, og + (j + 1) * hd, 0.f);
    }
    // Online softmax over chunks of tokens: score the chunk, rescale once per chunk, add its values.
    // fp32 records are read in place; other types are decoded once per chunk.
    auto chunk = [&](const uint8_t* e, int64_t count) {
      const float *kp[kChunk], *vp[kChunk];
      for (int64_t t = 0; t < count; ++t) {
        const uint8_t* kr = e + t * s.entry_bytes() + g * s.head_bytes();
        const uint8_t* vr = e + t * s.entry_bytes() + (s.kv_heads + g) * s.head_bytes();
        if (s.type == KvType::f32) {
          kp[t] = reinterpret_cast<const float*>(kr);
          vp[t] = reinterpret_cast<const float*>(vr);
        } else {
          decode_fast(s.type, kr, hd, k[t]);
          decode_fast(s.type, vr, hd, v[t]);
          kp[t] = k[t];
          vp[t] = v[t];
        }
      }
      for (int64_t j = 0; j < group; ++j) {
        float mx = m[j];
        for (int64_t t = 0; t < count; ++t) mx = std::max(mx, p[j][t] = dot(qg + j * hd, kp[t], hd) * qk_scale);
        const float corr = std::exp(m[j] - mx);  // 0 on the first chunk (m = -inf)
        float sum = 0;
        for (int64_t t = 0; t < count; ++t) sum += (p[j][t] = std::exp(p[j][t] - mx));
        l[j] = l[j] * corr + sum;
        m[j] = mx;
        scale_add(og + j * hd, corr, p[j], vp, count, hd);
      }
    };
    c.runs(reqs[b], layer, [&](const uint8_t* e, int64_t pos, int64_t count) {
      for (int64_t t = 0; t < count;) {
        const int64_t n = std::min(count - t, kChunk - (pos + t) % kChunk);  // stop at multiples of kChunk
        chunk(e + t * s.entry_bytes(), n);
        t += n;
      }
    });
    for (int64_t j = 0; j < group; ++j)
      for (int64_t i = 0; i < hd; ++i) og[j * hd + i] = og[j * hd + i] / l[j] * v_scale;
  }
}

}  // namespace memtrade::kvcache
