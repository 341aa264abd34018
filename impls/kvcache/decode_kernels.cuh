// The CUDA decode-attention kernels (decode_attention.hpp describes the scheme) and the choice of the
// split kernel's instantiation for a plan. decode_attention.cu launches them on a device; the same code
// also compiles as host C++ under the tests' CUDA emulation (tests/cuda_emulation.hpp: each CUDA thread a
// fiber, warps meeting at each shuffle), so that CPU-only CI runs the kernels' indexing and
// arithmetic (not their memory model or speed) against the float64 reference. Records are decoded with
// record.hpp's functions, the ones decode_head uses on the host; the softmax uses tile_math.hpp's
// exp_approx, as the CPU kernels do. Device code here keeps to what the emulation provides: threadIdx.x,
// blockIdx.x/y, __shared__ arrays, __syncthreads, __shfl_xor_sync, uint2/uint4, fmaf/fmaxf/min.
#pragma once

#include <cmath>
#include <cstdint>

#include "impls/attention/tile_math.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "impls/kvcache/record.hpp"

namespace memtrade::kvcache::decode_kernels {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kMaxGroup = 8;

// What the kernels read: the plan's arrays (on the device; the plan's own vectors under the emulation),
// the queries, the outputs and the split workspace.
struct Args {
  const uint64_t* blocks;
  const int64_t* first_block;
  const int32_t *block_tokens, *split_req, *split_from, *split_to, *split_slot, *first_slot;
  const float *qk_scale, *v_scale, *smooth;  // smooth: nullptr unless int4-smooth
  const uint64_t* residual;                   // the KIVI types: per request, its residual at the layer
  const int32_t* quantized;                   // the KIVI types: per request, its tokens held in records
  const float* q;
  float *out, *ws;
  int64_t entry_bytes, head_bytes, residual_entry_bytes;
  int kv_heads, group, heads, hd, chunks;  // chunks: thread blocks per KV head (ceil(group / GM))
  int split_base;                          // the launch's first split (grid y counts from it)
};

constexpr int bits_of(KvType t) {
  return t == KvType::f32                                                                                  ? 32
         : (t == KvType::bf16 || t == KvType::f16)                                                         ? 16
         : (t == KvType::int4 || t == KvType::int4_smooth || t == KvType::q4_0 || t == KvType::int4_kivi) ? 4
         : t == KvType::int2_kivi                                                                          ? 2
                                                                                                           : 8;
}

// The codes of a lane's slice of a record: elements lane * E .. lane * E + E - 1. kVec: head_dim = 32 E and
// the slice is aligned, loaded whole (up to two 128-bit loads) and cut into codes; otherwise code by code,
// codes past head_dim 0.
template <KvType K, int E, bool kVec>
__device__ __forceinline__ void load_codes(const uint8_t* __restrict__ r, int lane, int hd, uint32_t (&c)[E]) {
  constexpr int B = bits_of(K), SB = E * B / 8;  // bits per code, bytes per slice
  if constexpr (kVec) {
    const uint8_t* p = r + lane * SB;
    uint32_t w[SB >= 4 ? SB / 4 : 1];
    if constexpr (SB >= 16) {
#pragma unroll
      for (int k = 0; k < SB / 16; ++k) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[k];
        w[4 * k] = v.x;
        w[4 * k + 1] = v.y;
        w[4 * k + 2] = v.z;
        w[4 * k + 3] = v.w;
      }
    } else if constexpr (SB == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x;
      w[1] = v.y;
    } else if constexpr (SB == 4) {
      w[0] = *reinterpret_cast<const uint32_t*>(p);
    } else if constexpr (SB == 2) {
      w[0] = *reinterpret_cast<const uint16_t*>(p);
    } else {
      w[0] = *p;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) c[e] = slice_code<B>(w, e);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = lane * E + e;
      c[e] = i < hd ? record_code(K, r, i) : 0u;
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;  // the same bits in every lane: each step adds the same two values in either order
}

// Element i of query head h (of KV head g) of request b, times 1 / sqrt(head_dim), the static K scale and
// (int4-smooth) the smoothing factor.
__device__ __forceinline__ float query(const Args& a, int b, int h, int g, int i) {
  float v = a.q[(static_cast<int64_t>(b) * a.heads + h) * a.hd + i] * a.qk_scale[g];
  if (a.smooth) v *= a.smooth[g * a.hd + i];
  return v;
}

// One token into a query head's online softmax: its score s, and its values vv (the lane's slice) times vs.
template <int E>
__device__ __forceinline__ void softmax_add(float s, float vs, const float (&vv)[E], float& m, float& l, float (&acc)[E]) {
  if (s > m) {  // a new max: rescale what was accumulated (uniform across the warp)
    const float c = attention::exp_approx(m - s);
    l *= c;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= c;
    m = s;
  }
  const float p = attention::exp_approx(s - m);
  l += p;
  const float pv = p * vs;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = fmaf(pv, vv[e], acc[e]);
}

// The KIVI types' tokens [from, to) of request b for KV head g (decode_split_kernel's loop for them). A key is
// m_i + s_i (c_i + z) with (s_i, m_i) its channel's step over the token's group of 32: per group the lane
// holds the queries times s_i and each query head's bias sum_i q_i (m_i + s_i z), so a token's score is the
// dot product with its codes plus the bias. A value is m + s (c + z) with the (s, m) of the lane's block of 32
// channels in the token's own record. Tokens from quantized[b] on are read from the residual's fp16 values
// (the queries themselves, no bias). Warps take U tokens at a time; U divides 32, and from and quantized[b]
// are multiples of 32 (plan_decode), so U tokens lie in one group or all in the residual.
template <KvType K, int E, bool kVec, int GM>
__device__ __forceinline__ void kivi_tokens(const Args& a, int b, int g, int h0, int gcount, int from, int to,
                                            int lane, int warp, float (&m)[GM], float (&l)[GM], float (&acc)[GM][E]) {
  constexpr int U = 4, G = static_cast<int>(kKiviGroup);
  const int hd = a.hd, c = hd / G, nq = a.quantized[b];
  const float z = kivi_zero(K);
  const uint64_t* blocks = a.blocks + a.first_block[b];
  const int bt = a.block_tokens[b];
  const int64_t koff = g * a.head_bytes, voff = (a.kv_heads + g) * a.head_bytes;
  const uint8_t* res = reinterpret_cast<const uint8_t*>(a.residual[b]);
  const int64_t rk = static_cast<int64_t>(g) * hd * 2, rv = static_cast<int64_t>(a.kv_heads + g) * hd * 2;
  const bool active = lane * E < hd;  // the lane's slice lies in one block of 32 value channels
  float qs[GM][E] = {}, bias[GM] = {};  // set as the first token is reached (held != want)
  int held = -1;  // the group whose steps qs and bias hold; -2: the residual's (the plain queries)
  for (int t0 = from + warp * U; t0 < to; t0 += kWarps * U) {
    const bool quantized = t0 < nq;
    const int want = quantized ? t0 / G : -2;
    if (want != held) {
      held = want;
#pragma unroll
      for (int j = 0; j < GM; ++j) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = lane * E + e;
          const float x = j < gcount && i < hd ? query(a, b, h0 + j, g, i) : 0.f;
          if (quantized && i < hd) {  // channel i's step: pair i % c of the group's record i / c
            const KiviPair kp = kivi_pair(K, plan_entry(blocks, 0, bt, a.entry_bytes, want * G + i / c) + koff, hd, i % c);
            qs[j][e] = x * kp.s;
            d = fmaf(x, fmaf(kp.s, z, kp.m), d);
          } else {
            qs[j][e] = x;
          }
        }
        bias[j] = quantized ? warp_sum(d) : 0.f;
      }
    }
    uint32_t kc[U][E], vc[U][E];
    KiviPair vp[U] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t0 + u >= to) break;
      if (quantized) {
        const uint8_t* e = plan_entry(blocks, 0, bt, a.entry_bytes, t0 + u);
        load_codes<K, E, kVec>(e + koff, lane, hd, kc[u]);
        load_codes<K, E, kVec>(e + voff, lane, hd, vc[u]);
        if (active) vp[u] = kivi_pair(K, e + voff, hd, lane * E / G);
      } else {
        const uint8_t* r = res + (t0 + u - nq) * a.residual_entry_bytes;
        load_codes<KvType::f16, E, kVec>(r + rk, lane, hd, kc[u]);
        load_codes<KvType::f16, E, kVec>(r + rv, lane, hd, vc[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t0 + u >= to) break;
      float kv[E], vv[E];
#pragma unroll
      for (int i = 0; i < E; ++i) {
        kv[i] = quantized ? code_value(K, kc[u][i]) : code_value(KvType::f16, kc[u][i]);
        vv[i] = quantized ? fmaf(vp[u].s, code_value(K, vc[u][i]) + z, vp[u].m) : code_value(KvType::f16, vc[u][i]);
      }
#pragma unroll
      for (int j = 0; j < GM; ++j) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) d = fmaf(qs[j][e], kv[e], d);
        softmax_add(warp_sum(d) + bias[j], 1.f, vv, m[j], l[j], acc[j]);
      }
    }
  }
}

// Every other type's tokens [from, to) of request b for KV head g (decode_split_kernel's loop for them): U
// tokens per warp step have their K and V loads issued together.
template <KvType K, int E, bool kVec, int GM>
__device__ __forceinline__ void record_tokens(const Args& a, int b, int g, int h0, int gcount, int from, int to,
                                              int lane, int warp, float (&m)[GM], float (&l)[GM], float (&acc)[GM][E]) {
  constexpr int U = bits_of(K) >= 16 ? 2 : 4;
  const int hd = a.hd;
  // The queries (query()); zero for heads past the group and elements past head_dim.
  float q[GM][E];
#pragma unroll
  for (int j = 0; j < GM; ++j)
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = lane * E + e;
      q[j][e] = j < gcount && i < hd ? query(a, b, h0 + j, g, i) : 0.f;
    }
  const uint64_t* blocks = a.blocks + a.first_block[b];
  const int bt = a.block_tokens[b];
  const int64_t koff = g * a.head_bytes, voff = (a.kv_heads + g) * a.head_bytes;

  for (int t0 = from + warp * U; t0 < to; t0 += kWarps * U) {
    uint32_t kc[U][E], vc[U][E];
    float ks[U], vs[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t0 + u < to) {
        const uint8_t* e = plan_entry(blocks, 0, bt, a.entry_bytes, t0 + u);
        load_codes<K, E, kVec>(e + koff, lane, hd, kc[u]);
        load_codes<K, E, kVec>(e + voff, lane, hd, vc[u]);
        if constexpr (record_blocked(K)) {  // the scales of the lane's block (its slice lies in one)
          ks[u] = lane * E < hd ? block_scale(K, e + koff, hd, lane * E) : 0.f;
          vs[u] = lane * E < hd ? block_scale(K, e + voff, hd, lane * E) : 0.f;
        } else {
          ks[u] = record_scale(K, e + koff, hd);
          vs[u] = record_scale(K, e + voff, hd);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t0 + u >= to) break;
      float kv[E], vv[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kv[e] = code_value(K, kc[u][e]);
        vv[e] = code_value(K, vc[u][e]);
      }
#pragma unroll
      for (int j = 0; j < GM; ++j) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) d = fmaf(q[j][e], kv[e], d);
        softmax_add(record_blocked(K) ? warp_sum(d * ks[u]) : warp_sum(d) * ks[u], vs[u], vv, m[j], l[j], acc[j]);
      }
    }
  }
}

// One split of one request, for up to GM query heads of one KV head: grid (kv_heads x chunks, splits from
// a.split_base).
template <KvType K, int E, bool kVec, int GM>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const Args a) {
  __shared__ float sm_m[kWarps][GM], sm_l[kWarps][GM];
  __shared__ float sm_o[kWarps][GM][256];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sp = a.split_base + blockIdx.y, g = blockIdx.x / a.chunks, hc = (blockIdx.x % a.chunks) * GM;
  const int b = a.split_req[sp], from = a.split_from[sp], to = a.split_to[sp], slot = a.split_slot[sp];
  const int h0 = g * a.group + hc, gcount = min(GM, a.group - hc), hd = a.hd;

  float acc[GM][E], m[GM], l[GM];
#pragma unroll
  for (int j = 0; j < GM; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[j][e] = 0.f;
  }
  if constexpr (is_kivi(K))
    kivi_tokens<K, E, kVec, GM>(a, b, g, h0, gcount, from, to, lane, warp, m, l, acc);
  else
    record_tokens<K, E, kVec, GM>(a, b, g, h0, gcount, from, to, lane, warp, m, l, acc);

  // The warps' partial softmaxes merged under their largest max.
#pragma unroll
  for (int j = 0; j < GM; ++j) {
    if (lane == 0) {
      sm_m[warp][j] = m[j];
      sm_l[warp][j] = l[j];
    }
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (lane * E + e < hd) sm_o[warp][j][lane * E + e] = acc[j][e];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < gcount * hd; idx += kThreads) {
    const int j = idx / hd, i = idx % hd, h = h0 + j;
    float mx = sm_m[0][j];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][j]);
    float o = 0.f, sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = attention::exp_approx(sm_m[w][j] - mx);  // 0 for a warp without tokens (m = -inf)
      o = fmaf(sm_o[w][j][i], f, o);
      sum = fmaf(sm_l[w][j], f, sum);
    }
    if (slot < 0) {
      a.out[(static_cast<int64_t>(b) * a.heads + h) * hd + i] = o * (1.f / sum) * a.v_scale[g];
    } else {
      float* sl = a.ws + static_cast<int64_t>(slot) * a.heads * (hd + 2);
      sl[h * hd + i] = o;
      if (i == 0) {
        sl[a.heads * hd + h] = mx;
        sl[a.heads * (hd + 1) + h] = sum;
      }
    }
  }
}

// Requests of several splits: their partial softmaxes merged in split order. grid (requests, heads).
__global__ void __launch_bounds__(kThreads) merge_splits_kernel(const Args a) {
  const int b = blockIdx.x, h = blockIdx.y, hd = a.hd;
  const int first = a.first_slot[b], n = a.first_slot[b + 1] - first;
  if (n == 0) return;
  const int64_t slot_floats = static_cast<int64_t>(a.heads) * (hd + 2);
  const float* s0 = a.ws + first * slot_floats;
  float mx = -INFINITY;
  for (int k = 0; k < n; ++k) mx = fmaxf(mx, s0[k * slot_floats + a.heads * hd + h]);
  for (int i = threadIdx.x; i < hd; i += kThreads) {
    float o = 0.f, sum = 0.f;
    for (int k = 0; k < n; ++k) {
      const float* sl = s0 + k * slot_floats;
      const float f = attention::exp_approx(sl[a.heads * hd + h] - mx);
      sum = fmaf(sl[a.heads * (hd + 1) + h], f, sum);
      o = fmaf(sl[h * hd + i], f, o);
    }
    a.out[(static_cast<int64_t>(b) * a.heads + h) * hd + i] = o * (1.f / sum) * a.v_scale[h / a.group];
  }
}

// The split kernel's launch grid (x: KV heads x chunks of up to GM query heads; y: splits).
struct Shape {
  unsigned grid_x = 0, grid_y = 0;
  int gm = 1;
};
// Args for a plan: its arrays where put(vector) places them (a device copy, or the vector itself under
// the emulation), ws the split workspace (first_slot.back() x heads x (head_dim + 2) floats; may be null
// without slots); q and out are set per call.
template <class Put>
Shape make_args(const DecodePlan& p, Put&& put, float* ws, Args& a) {
  a.blocks = put(p.blocks);
  a.first_block = put(p.first_block);
  a.block_tokens = put(p.block_tokens);
  a.split_req = put(p.split_req);
  a.split_from = put(p.split_from);
  a.split_to = put(p.split_to);
  a.split_slot = put(p.split_slot);
  a.first_slot = put(p.first_slot);
  a.qk_scale = put(p.qk_scale);
  a.v_scale = put(p.v_scale);
  a.smooth = p.smooth.empty() ? nullptr : put(p.smooth);
  a.residual = p.residual.empty() ? nullptr : put(p.residual);
  a.quantized = p.quantized.empty() ? nullptr : put(p.quantized);
  a.ws = ws;
  Shape s;
  s.gm = p.group == 1 ? 1 : p.group <= 4 ? 4 : kMaxGroup;
  a.entry_bytes = p.entry_bytes;
  a.head_bytes = p.head_bytes;
  a.residual_entry_bytes = p.residual_entry_bytes;
  a.kv_heads = static_cast<int>(p.kv_heads);
  a.group = static_cast<int>(p.group);
  a.heads = static_cast<int>(p.heads);
  a.hd = static_cast<int>(p.head_dim);
  a.chunks = static_cast<int>((p.group + s.gm - 1) / s.gm);
  a.split_base = 0;
  s.grid_x = static_cast<unsigned>(p.kv_heads * a.chunks);
  s.grid_y = static_cast<unsigned>(p.split_req.size());
  return s;
}

using SplitKernel = void (*)(Args);

template <KvType K, int E, bool kVec>
SplitKernel split_kernel_gm(int gm) {
  if (gm == 1) return decode_split_kernel<K, E, kVec, 1>;
  if (gm == 4) return decode_split_kernel<K, E, kVec, 4>;
  return decode_split_kernel<K, E, kVec, kMaxGroup>;
}
template <KvType K>
SplitKernel split_kernel_type(int e, bool vec, int gm) {
  if (e == 2) return vec ? split_kernel_gm<K, 2, true>(gm) : split_kernel_gm<K, 2, false>(gm);
  if (e == 4) return vec ? split_kernel_gm<K, 4, true>(gm) : split_kernel_gm<K, 4, false>(gm);
  return vec ? split_kernel_gm<K, 8, true>(gm) : split_kernel_gm<K, 8, false>(gm);
}
// The instantiation for the plan's storage type, lane elements, slice loads and group.
inline SplitKernel split_kernel(const DecodePlan& p, const Shape& s) {
  const int e = lane_elems(p.head_dim);
  const bool vec = p.vector_loads;
  switch (p.type) {
    case KvType::f32: return split_kernel_type<KvType::f32>(e, vec, s.gm);
    case KvType::bf16: return split_kernel_type<KvType::bf16>(e, vec, s.gm);
    case KvType::f16: return split_kernel_type<KvType::f16>(e, vec, s.gm);
    case KvType::int8: return split_kernel_type<KvType::int8>(e, vec, s.gm);
    case KvType::fp8_e4m3: return split_kernel_type<KvType::fp8_e4m3>(e, vec, s.gm);
    case KvType::fp8_e4m3_static: return split_kernel_type<KvType::fp8_e4m3_static>(e, vec, s.gm);
    case KvType::int4:
    case KvType::int4_smooth: return split_kernel_type<KvType::int4>(e, vec, s.gm);  // int4-smooth: smoothed queries
    case KvType::q8_0: return split_kernel_type<KvType::q8_0>(e, vec, s.gm);
    case KvType::q4_0: return split_kernel_type<KvType::q4_0>(e, vec, s.gm);
    case KvType::fp8_e5m2: return split_kernel_type<KvType::fp8_e5m2>(e, vec, s.gm);
    case KvType::int4_kivi: return split_kernel_type<KvType::int4_kivi>(e, vec, s.gm);
    case KvType::int2_kivi: return split_kernel_type<KvType::int2_kivi>(e, vec, s.gm);
  }
  return nullptr;
}

}  // namespace memtrade::kvcache::decode_kernels
