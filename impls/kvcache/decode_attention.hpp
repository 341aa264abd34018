// The decode step's attention: the new token's queries against every key and value a request has
// cached at one layer. q: [heads x head_dim] with RoPE applied; grouped-query attention (query head h
// reads kv head h / (heads / kv_heads)); scale 1 / sqrt(head_dim); no mask (every cached token precedes
// the query). The records are dequantized inside the kernels (kv_cache.hpp), so any layout and storage
// type is read as it is stored.
//   decode_attention_ref   float64: records decoded to double, softmax in two passes (max, then sum)
//   decode_attention       fp32, flash-decoding: each request's context is cut into splits of split_tokens
//                          positions; a work unit is (request, split, range of KV heads) and reads its
//                          tokens' entries front to back (all KV heads of a token together, so memory is
//                          streamed, not strided by head); the kernel (simd/decode_simd.hpp: Highway,
//                          dispatched at run time) runs the online softmax over chunks of 16 tokens per
//                          query head, each K and V record decoded once for the query heads that share it.
//                          A request of several splits keeps each split's (o, max, sum) in a workspace from
//                          the device pool (tag workspace: splits x heads x (head_dim + 2) floats) and merges
//                          them in split order. Splits and chunks depend on positions only, so paged and
//                          contiguous caches give the same bits for any block size, and so does any thread
//                          count (head ranges, which follow the thread count, do not change the arithmetic).
//                          int4-smooth multiplies the queries by the key smoothing factors first, in a
//                          workspace of reqs x heads x head_dim floats, and reads the records as int4.
#pragma once

#include <cstdint>
#include <span>

#include "impls/kvcache/kv_cache.hpp"

namespace memtrade::kvcache {

// out: [heads x head_dim] of one request.
void decode_attention_ref(const KvCache& c, int64_t req, int64_t layer, const float* q, int64_t heads, double* out);

constexpr int64_t kDecodeSplitTokens = 1024;  // default split of a request's context
constexpr int64_t kMaxSplitTokens = 4096;
constexpr int64_t kMaxHeads = 1024;  // query heads per request

// reqs.size() requests at once: q and out are [reqs x heads x head_dim]. split_tokens: a positive multiple
// of 16, at most kMaxSplitTokens.
void decode_attention(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, const float* q, int64_t heads,
                      float* out, int64_t split_tokens = kDecodeSplitTokens);
// Splits of a request of `tokens` cached tokens; one of more than one takes a workspace slot.
int64_t decode_splits(int64_t tokens, int64_t split_tokens = kDecodeSplitTokens);

// Bytes the kernel reads from the cache for one request at one layer (every K and V record).
inline int64_t decode_bytes_read(const KvCache& c, int64_t req) { return c.length(req) * c.shape().entry_bytes(); }

}  // namespace memtrade::kvcache
