#include "impls/kvcache/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/common.hpp"

namespace memtrade::kvcache {

namespace {
void check(const KvCache& c, int64_t heads) {
  const KvShape& s = c.shape();
  MT_CHECK(heads > 0 && heads % s.kv_heads == 0 && s.head_dim <= 256,
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
        decode_head(s.type, e + (t * 2 * s.kv_heads + r) * s.head_bytes(), hd, tmp.data());
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

void decode_attention(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, const float* q, int64_t heads,
                      float* out) {
  check(c, heads);
  const KvShape& s = c.shape();
  const int64_t hd = s.head_dim, group = heads / s.kv_heads, units = static_cast<int64_t>(reqs.size()) * s.kv_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (int64_t r : reqs) MT_CHECK(c.length(r) > 0, "decode attention: a request has no cached token");
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t b = u / s.kv_heads, g = u % s.kv_heads;
    const float* qg = q + (b * heads + g * group) * hd;  // the group's query heads, consecutive
    float* og = out + (b * heads + g * group) * hd;
    float m[256], l[256], k[256], v[256];
    for (int64_t j = 0; j < group; ++j) {
      m[j] = -std::numeric_limits<float>::infinity();
      l[j] = 0;
      std::fill(og + j * hd, og + (j + 1) * hd, 0.f);
    }
    c.runs(reqs[b], layer, [&](const uint8_t* e, int64_t, int64_t count) {
      for (int64_t t = 0; t < count; ++t) {
        const uint8_t* rec = e + t * s.entry_bytes();
        decode_head(s.type, rec + g * s.head_bytes(), hd, k);
        decode_head(s.type, rec + (s.kv_heads + g) * s.head_bytes(), hd, v);
        for (int64_t j = 0; j < group; ++j) {
          float dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qg[j * hd + i] * k[i];
          const float x = dot * scale, mn = std::max(m[j], x);
          const float corr = std::exp(m[j] - mn), w = std::exp(x - mn);  // corr = 0 on the first token
          l[j] = l[j] * corr + w;
          float* o = og + j * hd;
          for (int64_t i = 0; i < hd; ++i) o[i] = o[i] * corr + w * v[i];
          m[j] = mn;
        }
      }
    });
    for (int64_t j = 0; j < group; ++j)
      for (int64_t i = 0; i < hd; ++i) og[j * hd + i] /= l[j];
  }
}

}  // namespace memtrade::kvcache
