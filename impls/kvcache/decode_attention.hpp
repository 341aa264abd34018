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
//                          int4-kivi and int2-kivi run a unit group by group: the queries times the group's
//                          key steps and a score bias per query head (a workspace of threads x heads x
//                          (head_dim + 1) floats), the records' codes read as int4's (int2-kivi: 2-bit codes
//                          likewise), then the residual's fp16 tokens.
//
// CUDA (decode_kernels.cuh, launched by decode_attention.cu), the same flash-decoding over a block table
// as vLLM's PagedAttention reads it: plan_decode() lists, on the host, where each request's tokens live (its runs of entries cut into
// blocks of one length per request: the paged cache's blocks, or one block for a contiguous request) and
// the splits; CudaDecode uploads that plan once into the device pool (tag workspace) and runs it. One
// thread block per (split, KV head, up to 8 of its query heads); each of its 4 warps takes tokens of the
// split in turn, a few at a time (their K and V loads in flight together), each lane holding a slice of
// head_dim (128-bit loads where the records allow; q8_0 / q4_0: a slice lies in one block of 32, the lane
// scales its part of the dot product and of the values by that block's scale); scores by warp shuffles, the online softmax per query
// head, the 4 warps merged in shared memory, and a request of several splits merged by a second kernel
// in split order. Tokens go to warps by position only, so paged and contiguous caches give the same bits.
// int4-kivi and int2-kivi: as a warp enters a group of 32 tokens, each lane reads its channels' key steps
// from the group's records and holds the queries times them, and each query head's bias by a warp sum;
// a token's score is then its codes' dot product plus the bias, its values decoded with its record's pair
// for the lane's block of 32 channels; the request's last tokens are read from its fp16 residual.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/common.hpp"
#include "impls/kvcache/kv_cache.hpp"

namespace memtrade::kvcache {

// out: [heads x head_dim] of one request.
void decode_attention_ref(const KvCache& c, int64_t req, int64_t layer, const float* q, int64_t heads, double* out);

constexpr int64_t kDecodeSplitTokens = 1024;  // default split of a request's context
constexpr int64_t kMaxSplitTokens = 4096;
constexpr int64_t kMaxHeads = 1024;  // query heads per request
constexpr int64_t kMaxHeadDim = 256;

// reqs.size() requests at once: q and out are [reqs x heads x head_dim]. split_tokens: a positive multiple
// of 16, at most kMaxSplitTokens.
void decode_attention(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, const float* q, int64_t heads,
                      float* out, int64_t split_tokens = kDecodeSplitTokens);
// Splits of a request of `tokens` cached tokens; one of more than one takes a workspace slot.
int64_t decode_splits(int64_t tokens, int64_t split_tokens = kDecodeSplitTokens);

// Bytes the kernel reads from the cache for one request at one layer (every K and V record; the KIVI types:
// the complete groups' records and the residual's fp16 tokens).
inline int64_t decode_bytes_read(const KvCache& c, int64_t req) {
  const int64_t nq = c.quantized_length(req);
  return nq * c.shape().entry_bytes() + (c.length(req) - nq) * c.shape().residual_entry_bytes();
}

// ---- CUDA ----

constexpr int64_t kCudaSplitTokens = 512;  // default split of a request's context on CUDA

// Where a decode step's tokens live and how it is cut, for `reqs` at `layer` (host side; addresses are
// the cache device's).
struct DecodePlan {
  KvType type = KvType::f32;
  int64_t heads = 0, kv_heads = 0, group = 0, head_dim = 0, head_bytes = 0, entry_bytes = 0, split_tokens = 0;
  // Request b's token t has its entry at blocks[first_block[b] + t / block_tokens[b]] +
  // (t % block_tokens[b]) * entry_bytes (plan_entry).
  std::vector<uint64_t> blocks;
  std::vector<int64_t> first_block;  // reqs + 1
  std::vector<int32_t> block_tokens, length;
  // Split k covers positions [split_from[k], split_to[k]) of request split_req[k]; a request of several
  // splits keeps each in workspace slot split_slot[k] (-1: the request's only split, written to out).
  std::vector<int32_t> split_req, split_from, split_to, split_slot;
  // The staging slots split k's reads need (KvCache::staging_needed: 0 for a cache on the device); the
  // splits are listed by it, ascending (the order changes no split's arithmetic, nor the merge's).
  std::vector<int32_t> split_needs;
  std::vector<int32_t> first_slot;  // reqs + 1: request b's slots are [first_slot[b], first_slot[b + 1])
  // Per KV head: 1 / sqrt(head_dim) x the static K scale, and the static V scale; int4-smooth's key
  // smoothing factors [kv_heads][head_dim] (empty for the other types).
  std::vector<float> qk_scale, v_scale, smooth;
  // The KIVI types (empty for the others): per request, the address of its residual at the layer (fp16
  // [residual][K, V][kv_heads][head_dim], KvCache::residual) and the tokens held in records
  // (KvCache::quantized_length); position t >= quantized[b] is read from residual slot t - quantized[b].
  std::vector<uint64_t> residual;
  std::vector<int32_t> quantized;
  int64_t residual_entry_bytes = 0;
  // Whether each lane loads its slice of a record whole (up to two 128-bit loads): head_dim is 32 x the
  // lane's elements and every record is aligned to the slice's bytes (at most 16).
  bool vector_loads = false;
};
// split_tokens: positive (the KIVI types: a multiple of their group's 32 tokens); Error for a request with no
// token or heads that kv_heads does not divide.
DecodePlan plan_decode(const KvCache& c, std::span<const int64_t> reqs, int64_t layer, int64_t heads,
                       int64_t split_tokens = kCudaSplitTokens);

// Request b's token t's entry, as the kernel computes it (32-bit positions: plan_decode checks lengths
// below 2^31, and a 32-bit division is several times cheaper on the device than a 64-bit one).
MT_HD const uint8_t* plan_entry(const uint64_t* blocks, int64_t first_block, int32_t block_tokens,
                                int64_t entry_bytes, int32_t t) {
  return reinterpret_cast<const uint8_t*>(blocks[first_block + t / block_tokens]) + (t % block_tokens) * entry_bytes;
}

// Elements of head_dim each lane of a warp holds: 2, 4 or 8 (head_dim up to 256).
MT_HD int lane_elems(int64_t head_dim) { return head_dim <= 64 ? 2 : head_dim <= 128 ? 4 : 8; }

// A decode step over an offloading cache with its staging copies overlapped: steps of (the staging slots
// [copy_from, copy_to) to copy, then the splits [split_from, split_to) of the plan to launch once those
// copies are in). The first step copies nothing and launches the splits that need no staging; then each
// of `chunks` steps copies its share of the `slots` and launches the splits whose slots are all in.
struct StagedStep {
  int64_t copy_from = 0, copy_to = 0, split_from = 0, split_to = 0;
};
std::vector<StagedStep> staged_schedule(const DecodePlan& p, int64_t slots, int64_t chunks);

// A plan on a CUDA device: its arrays and the split workspace (slots x heads x (head_dim + 2) floats) in
// the device pool (tag workspace). run() is one decode step: q and out are device arrays [reqs x heads x
// head_dim] fp32. Skip without CUDA.
class CudaDecode {
 public:
  CudaDecode(Device& dev, DecodePlan plan);
  ~CudaDecode();
  void run(const float* q, float* out);
  // One step over an offloading cache whose slots were selected (PagedCache::select_staged) but not copied:
  // staged_schedule's copies (copy(from, to) issues them, as PagedCache::copy_staged(from, to, true) does)
  // on the device's second stream, each chunk's splits launched as soon as its copies are in. The same bits
  // as stage() then run().
  void run_staged(const float* q, float* out, int64_t slots, int64_t chunks,
                  const std::function<void(int64_t, int64_t)>& copy);
  const DecodePlan& plan() const { return plan_; }

 private:
  struct Impl;
  DecodePlan plan_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memtrade::kvcache
