// The CPU decode-attention kernel in portable SIMD (Google Highway): compiled for every target and
// dispatched at run time to the best one this CPU supports (common/simd/targets.hpp restricts it).
//
// One call is one work unit of decode_attention (decode_attention.hpp): a run of one request's tokens
// (a split of its context), for a range of its KV heads. The tokens go in chunks of kDecodeChunk. Per
// chunk and query head: the scores (two or three tokens x up to four query heads of register-blocked dot products,
// each K record decoded in registers once for all of them, the lane sums of four products at a time), one
// online-softmax step (vector exp: tile_math.hpp's exp_approx step for step), then the chunk's values
// added into the output (several vectors of output columns held in registers across the chunk, each V
// record decoded once for the query heads). Per-record scales (int8, fp8-e4m3, int4) multiply the scores
// and the softmax weights, not the elements; q8_0 / q4_0 block scales multiply the decoded vectors (a
// vector lies in one block of 32); int4 codes are decoded in registers like the 8-bit ones (a byte
// shuffle and a bit-pattern conversion, no fp32 copy of the record). int4-kivi decodes its codes as int4's,
// int2-kivi its 2-bit codes the same way; their key steps come in the queries and score_bias, their value
// blocks' (s, m) per decoded vector.
// The order in which a chunk's records are read depends on the storage type. fp32, bf16 and fp16 score
// block of tokens by block of tokens across the unit's KV heads (each token's K records read front to back, a
// stream the hardware prefetchers follow, while the same tokens of the next chunk have their records
// prefetched into L1), then run the softmax and value pass KV head by KV head. The
// 8- and 4-bit types, whose decode costs more arithmetic per byte, work KV head by KV head (scores,
// softmax and values together) while the score loop prefetches the next chunk's records of the same KV
// head into L2. Every score and sum is the same in both orders.
#pragma once

#include <cstdint>

#include "impls/kvcache/kv_cache.hpp"

namespace memtrade::kvcache::simd {

constexpr int64_t kDecodeChunk = 16;  // tokens scored together

struct DecodeUnit {
  KvType type = KvType::f32;
  int64_t head_dim = 0, head_bytes = 0, kv_heads = 0, group = 0;  // group: query heads per KV head
  int64_t g0 = 0, g1 = 0;                   // this unit's KV heads [g0, g1)
  const uint8_t* const* tokens = nullptr;   // each token's entry ([K, V] x kv_heads records), in order
  int64_t count = 0;                        // tokens (chunks start at tokens[0])
  int64_t lookahead = 0;                    // tokens[count .. count + lookahead) exist: prefetched, not read
  const float* q = nullptr;                 // [heads x head_dim]: the request's queries
  const float* qk_scale = nullptr;          // [kv_heads]: 1 / sqrt(head_dim) x the static K scale
  // Outputs for the unit's query heads h (absolute indices): o[h x head_dim] = sum_t p_t v_t (neither
  // normalized nor multiplied by a static V scale), m[h] = the largest score, l[h] = sum_t p_t, with
  // p_t = exp(score_t - m[h]).
  float* o = nullptr;
  float* m = nullptr;
  float* l = nullptr;
  // false: o, m and l hold the softmax of earlier tokens of the unit (a call per KIVI group), which
  // this call continues; true: they start empty.
  bool start = true;
  // [heads] or nullptr: added to each query head's dot products before qk_scale (KIVI: sum_c q_c (m_c + z s_c),
  // with the queries already multiplied by the steps s_c; the records' codes decode as q - z, z = kivi_zero).
  const float* score_bias = nullptr;
};

void decode_unit(const DecodeUnit& u);

// A KIVI type's (int4-kivi, int2-kivi) keys: for KV heads [g0, g1) of a group of kKiviGroup token entries
// (group[j]: the entry of the group's token j; hb bytes per record), the queries of their query heads
// (group_heads each; q: [heads x head_dim]) multiplied channel by channel by the group's key steps s (into qg,
// same layout) and the score bias sum_c q_c (m_c + z s_c) per query head (into bias[h]; z = kivi_zero(type)).
void kivi_queries(KvType type, const uint8_t* const* group, int64_t hb, int64_t head_dim, int64_t g0, int64_t g1,
                  int64_t group_heads, const float* q, float* qg, float* bias);

}  // namespace memtrade::kvcache::simd
