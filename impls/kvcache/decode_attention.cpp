#include "impls/kvcache/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <omp.h>
#include <vector>

#include "common/common.hpp"
#include "impls/attention/tile_math.hpp"
#include "impls/kvcache/record.hpp"
#include "impls/kvcache/simd/decode_simd.hpp"

namespace memtrade::kvcache {

namespace {
void check(const KvCache& c, int64_t heads) {
  const KvShape& s = c.shape();
  MT_CHECK(heads > 0 && heads % s.kv_heads == 0 && heads / s.kv_heads <= 256 && s.head_dim <= kMaxHeadDim,
           "decode attention: heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" +
               std::to_string(s.kv_heads) + ") and head_dim at most " + std::to_string(kMaxHeadDim));
}
}  // namespace

void decode_attention_ref(const KvCache& c, int64_t req, int64_t layer, const float* q, int64_t heads, double* out) {
  check(c, heads);
  const KvShape& s = c.shape();
  const int64_t hd = s.head_dim, group = heads / s.kv_heads, n = c.length(req);
  MT_CHECK(n > 0, "decode attention: the request has no cached token");
  // Every K and V of the request as stored, decoded (read_token): [n][2][kv_heads][hd].
  std::vector<double> kv(static_cast<std::size_t>(n * 2 * s.kv_heads * hd));
  std::vector<float> tk(static_cast<std::size_t>(s.kv_heads * hd)), tv(tk.size());
  for (int64_t pos = 0; pos < n; ++pos) {
    c.read_token(req, layer, pos, tk.data(), tv.data());
    std::copy(tk.begin(), tk.end(), kv.begin() + pos * 2 * s.kv_heads * hd);
    std::copy(tv.begin(), tv.end(), kv.begin() + (pos * 2 + 1) * s.kv_heads * hd);
  }
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

int64_t decode_splits(int64_t tokens, int64_t split_tokens) { return (tokens + split_tokens - 1) / split_tokens; }

namespace {

// The KIVI types: positions [from, to) of request req for the unit du (its KV heads, outputs and the request's
// queries q), whose entries are tokens[0 ..): the complete groups' records one group at a time, with the
// queries multiplied channel by channel by the group's key steps s (qg: heads x head_dim floats) and the score
// bias sum_c q_c (m_c + z s_c) (z the zero point, kivi_zero; bias: heads floats), then the residual's fp16
// tokens (those after the last complete residual).
// One online softmax runs through all of it (DecodeUnit::start).
void kivi_unit(const KvCache& c, int64_t req, int64_t layer, int64_t from, int64_t to, const uint8_t* const* tokens,
               simd::DecodeUnit du, const float* q, float* qg, float* bias) {
  const KvShape& s = c.shape();
  const int64_t hd = s.head_dim, hb = s.head_bytes(), nq = c.quantized_length(req);
  for (int64_t p = from; p < std::min(to, nq);) {
    const int64_t first = p / kKiviGroup * kKiviGroup, end = std::min({first + kKiviGroup, to, nq});
    const uint8_t* group[kKiviGroup];
    c.runs_in(req, layer, first, first + kKiviGroup, [&](const uint8_t* e, int64_t at, int64_t n) {
      for (int64_t t = 0; t < n; ++t) group[at - first + t] = e + t * s.entry_bytes();
    });
    simd::kivi_queries(s.type, group, hb, hd, du.g0, du.g1, du.group, q, qg, bias);
    du.q = qg;
    du.score_bias = bias;
    du.tokens = tokens + (p - from);
    du.count = end - p;
    du.lookahead = std::min(std::min(to, nq) - end, simd::kDecodeChunk);  // the next group's first chunk
    simd::decode_unit(du);
    du.start = false;
    p = end;
  }
  // The residual's tokens, kKiviGroup at a time.
  const uint8_t* res = c.residual(req, layer);
  const uint8_t* rt[kKiviGroup];
  du.type = KvType::f16;
  du.head_bytes = 2 * hd;
  du.q = q;
  du.score_bias = nullptr;
  du.tokens = rt;
  du.lookahead = 0;
  for (int64_t r0 = std::max(from, nq); r0 < to; r0 += du.count) {
    du.count = std::min(to - r0, kKiviGroup);
    for (int64_t i = 0; i < du.count; ++i) rt[i] = res + ((r0 + i) % s.residual) * s.residual_entry_bytes();
    simd::decode_unit(du);
    du.start = false;
  }
}

}  // namespace

void decode_attention(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, const float* q, int64_t heads,
                      float* out, int64_t split_tokens) {
  check(c, heads);
  const KvShape& s = c.shape();
  MT_CHECK(split_tokens > 0 && split_tokens % simd::kDecodeChunk == 0 && split_tokens <= kMaxSplitTokens,
           "decode attention: split_tokens (" + std::to_string(split_tokens) + ") must be a positive multiple of " +
               std::to_string(simd::kDecodeChunk) + " up to " + std::to_string(kMaxSplitTokens));
  MT_CHECK(heads <= kMaxHeads, "decode attention: at most " + std::to_string(kMaxHeads) + " query heads");
  const int64_t hd = s.head_dim, group = heads / s.kv_heads, B = static_cast<int64_t>(reqs.size());
  for (int64_t r : reqs) MT_CHECK(c.length(r) > 0, "decode attention: a request has no cached token");
  c.require_staged(reqs, layer);  // here, not from inside the parallel loop
  // Work units: (request, split, range of KV heads). A request of several splits gets a workspace slot
  // per split (o, m, l of every query head), merged below; one of a single split is written to `out`.
  std::vector<int64_t> first_split(static_cast<std::size_t>(B + 1), 0), first_slot(static_cast<std::size_t>(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = decode_splits(c.length(reqs[b]), split_tokens);
    first_split[b + 1] = first_split[b] + n;
    first_slot[b + 1] = first_slot[b] + (n > 1 ? n : 0);
  }
  const int64_t splits = first_split[B], slot_floats = heads * (hd + 2);
  Buffer ws;
  if (first_slot[B] > 0)
    ws = Buffer(c.device().memory(), static_cast<std::size_t>(first_slot[B] * slot_floats) * sizeof(float), Tag::workspace);
  // Head ranges only where there are fewer splits than threads to keep busy; a range is a partition of the
  // work, not of the arithmetic, so the result does not depend on the thread count.
  const int64_t ranges = std::clamp<int64_t>((2 * omp_get_max_threads() + splits - 1) / splits, 1, s.kv_heads);
  float qk_scale[kMaxHeads];
  for (int64_t g = 0; g < s.kv_heads; ++g) qk_scale[g] = s.qk_scale(layer, g);
  // KIVI types: per thread, the queries times a group's key steps and the score biases (heads x (head_dim + 1)).
  Buffer kivi_ws;
  const int64_t kivi_floats = heads * (hd + 1);
  if (s.kivi())
    kivi_ws = Buffer(c.device().memory(), static_cast<std::size_t>(omp_get_max_threads() * kivi_floats) * sizeof(float),
                     Tag::workspace);
  // int4-smooth: the keys are stored divided by the smoothing factors, so the query is multiplied by them
  // (a workspace of reqs x heads x head_dim floats) and the kernel reads the records as plain int4.
  Buffer q_smooth;
  if (s.smoothing(layer, 0) != nullptr) {
    q_smooth = Buffer(c.device().memory(), static_cast<std::size_t>(B * heads * hd) * sizeof(float), Tag::workspace);
    float* qs = q_smooth.as<float>();
    for (int64_t bh = 0; bh < B * heads; ++bh) {
      const float* f = s.smoothing(layer, (bh % heads) / group);
      for (int64_t i = 0; i < hd; ++i) qs[bh * hd + i] = q[bh * hd + i] * f[i];
    }
    q = qs;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < splits * ranges; ++u) {
    const int64_t split = u / ranges, range = u % ranges;
    const int64_t b = std::upper_bound(first_split.begin(), first_split.end(), split) - first_split.begin() - 1;
    const int64_t sp = split - first_split[b], n_splits = first_split[b + 1] - first_split[b];
    const int64_t from = sp * split_tokens, to = std::min(from + split_tokens, c.length(reqs[b]));
    const uint8_t* tokens[kMaxSplitTokens];
    c.runs_in(reqs[b], layer, from, to, [&](const uint8_t* e, int64_t pos, int64_t count) {
      for (int64_t t = 0; t < count; ++t) tokens[pos - from + t] = e + t * s.entry_bytes();
    });
    float m1[kMaxHeads], l1[kMaxHeads];
    float* slot = n_splits > 1 ? ws.as<float>() + (first_slot[b] + sp) * slot_floats : nullptr;
    simd::DecodeUnit du;
    du.type = s.type;
    du.head_dim = hd;
    du.head_bytes = s.head_bytes();
    du.kv_heads = s.kv_heads;
    du.group = group;
    du.g0 = range * s.kv_heads / ranges;
    du.g1 = (range + 1) * s.kv_heads / ranges;
    du.tokens = tokens;
    du.count = to - from;
    du.q = q + b * heads * hd;
    du.qk_scale = qk_scale;
    du.o = slot ? slot : out + b * heads * hd;
    du.m = slot ? slot + heads * hd : m1;
    du.l = slot ? slot + heads * (hd + 1) : l1;
    if (s.kivi()) {
      float* w = kivi_ws.as<float>() + omp_get_thread_num() * kivi_floats;
      kivi_unit(c, reqs[b], layer, from, to, tokens, du, du.q, w, w + heads * hd);
    } else {
      simd::decode_unit(du);
    }
    if (!slot)
      for (int64_t h = du.g0 * group; h < du.g1 * group; ++h) {
        const float inv = 1.f / l1[h], v_scale = s.scale(layer, 1, h / group);
        for (int64_t i = 0; i < hd; ++i) du.o[h * hd + i] = du.o[h * hd + i] * inv * v_scale;
      }
  }
  // Requests of several splits: the splits' partial softmaxes merged in split order under the largest max.
  const int64_t multi = first_slot[B];
  if (multi == 0) return;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * heads; ++bh) {
    const int64_t b = bh / heads, h = bh % heads, n = first_slot[b + 1] - first_slot[b];
    if (n == 0) continue;
    const float* slot0 = ws.as<float>() + first_slot[b] * slot_floats;
    float mx = -std::numeric_limits<float>::infinity(), lsum = 0;
    for (int64_t k = 0; k < n; ++k) mx = std::max(mx, slot0[k * slot_floats + heads * hd + h]);
    float* o = out + (b * heads + h) * hd;
    std::fill(o, o + hd, 0.f);
    for (int64_t k = 0; k < n; ++k) {
      const float* sl = slot0 + k * slot_floats;
      const float f = attention::exp_approx(sl[heads * hd + h] - mx);
      lsum += sl[heads * (hd + 1) + h] * f;
      for (int64_t i = 0; i < hd; ++i) o[i] += sl[h * hd + i] * f;
    }
    const float inv = 1.f / lsum, v_scale = s.scale(layer, 1, h / group);
    for (int64_t i = 0; i < hd; ++i) o[i] = o[i] * inv * v_scale;
  }
}

DecodePlan plan_decode(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, int64_t heads,
                       int64_t split_tokens) {
  check(c, heads);
  MT_CHECK(split_tokens > 0, "decode attention: split_tokens must be positive (got " + std::to_string(split_tokens) + ")");
  c.require_staged(reqs, layer);
  const KvShape& s = c.shape();
  MT_CHECK(!s.kivi() || split_tokens % kKiviGroup == 0,
           std::string("decode attention: ") + kv_type_name(s.type) + " splits must be a multiple of its groups' " +
               std::to_string(kKiviGroup) + " tokens (got " + std::to_string(split_tokens) + ")");
  DecodePlan p;
  p.type = s.type;
  p.heads = heads;
  p.kv_heads = s.kv_heads;
  p.group = heads / s.kv_heads;
  p.head_dim = s.head_dim;
  p.head_bytes = s.head_bytes();
  p.entry_bytes = s.entry_bytes();
  p.residual_entry_bytes = s.kivi() ? s.residual_entry_bytes() : 0;
  p.split_tokens = split_tokens;
  p.first_block.push_back(0);
  p.first_slot.push_back(0);
  for (std::size_t b = 0; b < reqs.size(); ++b) {
    const int64_t n = c.length(reqs[b]);
    MT_CHECK(n > 0 && n < (int64_t{1} << 31), "decode attention: a request has no cached token (or over 2^31)");
    // The request's runs, cut into blocks of one length: the gcd of every run's length but the last, so
    // that each run starts on a block boundary (a contiguous request is one block).
    std::vector<std::pair<const uint8_t*, int64_t>> runs;
    c.runs(reqs[b], layer, [&](const uint8_t* e, int64_t, int64_t count) { runs.emplace_back(e, count); });
    int64_t bt = 0;
    for (std::size_t i = 0; i + 1 < runs.size(); ++i) bt = std::gcd(bt, runs[i].second);
    if (bt == 0) bt = n;
    for (const auto& [e, count] : runs)
      for (int64_t t = 0; t < count; t += bt) p.blocks.push_back(reinterpret_cast<uint64_t>(e + t * p.entry_bytes));
    p.first_block.push_back(static_cast<int64_t>(p.blocks.size()));
    p.block_tokens.push_back(static_cast<int32_t>(bt));
    p.length.push_back(static_cast<int32_t>(n));
    if (s.kivi()) {
      p.residual.push_back(reinterpret_cast<uint64_t>(c.residual(reqs[b], layer)));
      p.quantized.push_back(static_cast<int32_t>(c.quantized_length(reqs[b])));
    }
    const int64_t splits = (n + split_tokens - 1) / split_tokens;
    for (int64_t k = 0; k < splits; ++k) {
      p.split_req.push_back(static_cast<int32_t>(b));
      p.split_from.push_back(static_cast<int32_t>(k * split_tokens));
      p.split_to.push_back(static_cast<int32_t>(std::min(n, (k + 1) * split_tokens)));
      p.split_slot.push_back(splits > 1 ? p.first_slot.back() + static_cast<int32_t>(k) : -1);
      p.split_needs.push_back(static_cast<int32_t>(c.staging_needed(reqs[b], p.split_from.back(), p.split_to.back())));
    }
    p.first_slot.push_back(p.first_slot.back() + static_cast<int32_t>(splits > 1 ? splits : 0));
  }
  // The splits that need fewer staging slots first (a stable order: a cache on the device keeps its own).
  std::vector<std::size_t> order(p.split_req.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return p.split_needs[x] < p.split_needs[y]; });
  for (auto* v : {&p.split_req, &p.split_from, &p.split_to, &p.split_slot, &p.split_needs}) {
    std::vector<int32_t> w(v->size());
    for (std::size_t k = 0; k < order.size(); ++k) w[k] = (*v)[order[k]];
    *v = std::move(w);
  }
  for (int64_t g = 0; g < s.kv_heads; ++g) {
    p.qk_scale.push_back(s.qk_scale(layer, g));
    p.v_scale.push_back(s.scale(layer, 1, g));
    if (const float* f = s.smoothing(layer, g)) p.smooth.insert(p.smooth.end(), f, f + s.head_dim);
  }
  // A lane's slice of a record (lane_elems elements) is loaded whole when head_dim fills the warp and
  // every record starts at a multiple of the slice's bytes (up to 16: wider slices take two loads); the KIVI
  // types' residual records (fp16) likewise.
  const int64_t e = lane_elems(s.head_dim), slice = e * s.elem_bits() / 8, align = std::min<int64_t>(slice, 16);
  const int64_t res_align = std::min<int64_t>(2 * e, 16);
  p.vector_loads = s.head_dim == 32 * e && slice >= 1 && p.head_bytes % align == 0 &&
                   std::all_of(p.blocks.begin(), p.blocks.end(), [&](uint64_t a) { return a % align == 0; }) &&
                   std::all_of(p.residual.begin(), p.residual.end(), [&](uint64_t a) { return a % res_align == 0; });
  return p;
}

std::vector<StagedStep> staged_schedule(const DecodePlan& p, int64_t slots, int64_t chunks) {
  MT_CHECK(chunks > 0 && slots >= 0, "staged decode: chunks must be positive and slots not negative");
  const auto& needs = p.split_needs;
  MT_CHECK(std::is_sorted(needs.begin(), needs.end()) && (needs.empty() || needs.back() <= slots),
           "staged decode: the plan's splits need staging slots beyond the " + std::to_string(slots) + " there are");
  std::vector<StagedStep> steps;
  auto ready = [&](int64_t in) {  // splits whose slots are all among the first `in`
    return static_cast<int64_t>(std::upper_bound(needs.begin(), needs.end(), in) - needs.begin());
  };
  StagedStep first;
  first.split_to = ready(0);
  steps.push_back(first);
  chunks = std::min(chunks, std::max<int64_t>(slots, 1));
  for (int64_t k = 0; k < chunks; ++k) {
    StagedStep st;
    st.copy_from = steps.back().copy_to;
    st.copy_to = slots * (k + 1) / chunks;
    st.split_from = steps.back().split_to;
    st.split_to = ready(st.copy_to);
    steps.push_back(st);
  }
  return steps;
}

#ifndef MEMTRADE_WITH_CUDA
struct CudaDecode::Impl {};
CudaDecode::CudaDecode(Device&, DecodePlan plan) : plan_(std::move(plan)) { throw Skip(cuda_status().reason); }
CudaDecode::~CudaDecode() = default;
void CudaDecode::run(const float*, float*) { throw Skip(cuda_status().reason); }
void CudaDecode::run_staged(const float*, float*, int64_t, int64_t, const std::function<void(int64_t, int64_t)>&) {
  throw Skip(cuda_status().reason);
}
#endif

}  // namespace memtrade::kvcache
