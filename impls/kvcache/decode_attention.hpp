// The decode step's attention: the new token's queries against every key and value a request has
// cached at one layer. q: [heads x head_dim] with RoPE applied; grouped-query attention (query head h
// reads kv head h / (heads / kv_heads)); scale 1 / sqrt(head_dim); no mask (every cached token precedes
// the query). The records are dequantized inside the kernels (kv_cache.hpp), so any layout and storage
// type is read as it is stored.
//   decode_attention_ref   float64: records decoded to double, softmax in two passes (max, then sum)
//   decode_attention       fp32, one pass with the online softmax per query head over chunks of up to 8
//                          tokens (scores of the chunk, one rescale, then its values); each token's K and
//                          V are decoded once for all query heads that share them; vectorized dot
//                          products; OpenMP over (request, kv head). Chunks start at
//                          multiples of 8 positions, so a paged cache whose block size is a multiple of 8
//                          gives the contiguous cache's result bit for bit.
#pragma once

#include <cstdint>
#include <span>

#include "impls/kvcache/kv_cache.hpp"

namespace memtrade::kvcache {

// out: [heads x head_dim] of one request.
void decode_attention_ref(const KvCache& c, int64_t req, int64_t layer, const float* q, int64_t heads, double* out);

// reqs.size() requests at once: q and out are [reqs x heads x head_dim].
void decode_attention(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, const float* q, int64_t heads,
                      float* out);

// Bytes the kernel reads from the cache for one request at one layer (every K and V record).
inline int64_t decode_bytes_read(const KvCache& c, int64_t req) { return c.length(req) * c.shape().entry_bytes(); }

}  // namespace memtrade::kvcache
