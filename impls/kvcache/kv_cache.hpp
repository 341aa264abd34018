// The inference KV cache: the keys and values of every token a request has seen, per layer, in one of
// two layouts and one of five storage types.
//
// Storage of one head vector (head_dim values), a "head record":
//   fp32 / bf16 / fp16   head_dim values (bf16/fp16 rounded to nearest even)
//   int8                 head_dim int8 codes q = rint(x / s) in [-127, 127], then the fp32 scale
//                        s = amax / 127 of that vector (per token and head: quantized on write)
//   fp8-e4m3             head_dim OCP E4M3 codes of x / s (nearest even, saturating), then s = amax / 448
//   int4                 head_dim / 2 bytes: codes q = rint(x / s) in [-7, 7] stored as q + 8, element 2i in
//                        the low nibble of byte i and 2i + 1 in the high one, then the fp32 scale s = amax / 7
//                        (per token and head, so a key's outlier channels set the step of all its others:
//                        what KIVI's per-channel keys and int4-smooth below avoid); head_dim must be even
//   int4-smooth          int4 records, keys smoothed first (QServe's SmoothAttention): a K vector is
//                        divided channel by channel by the shape's factors lambda = amax_c^0.5 (amax_c of
//                        that (layer, kv head, channel) over calibration windows) before its per-token int4
//                        encoding, and multiplied back on decode; the decode kernel multiplies the query by
//                        lambda instead (q.k = (q lambda).(k / lambda)). Outlier channels stop setting every
//                        token's scale. V records are plain int4. No factors: plain int4 for K too.
//   q8_0 / q4_0          llama.cpp's KV cache types (--cache-type-k/v q8_0, q4_0): one fp16 scale d per
//                        block of 32 elements, with ggml's arithmetic (quantize_row_q8_0_ref / _q4_0_ref):
//                        q8_0 codes q = roundf(x / d) with d = amax / 127; q4_0 codes q = min(15, trunc(x / d
//                        + 8.5)) with d = -max / 8, max the element of largest magnitude (which lands on -8),
//                        value d (q - 8). Each record holds its codes (q8_0: head_dim int8; q4_0: head_dim / 2
//                        bytes in int4's nibble order, not ggml's) then the head_dim / 32 fp16 scales, so an
//                        outlier channel sets the step of its block of 32 only. The values equal ggml's
//                        dequantized blocks bit for bit (tests/test_kvcache.cpp checks them against the
//                        gguf package). head_dim must be a multiple of 32.
//   fp8-e5m2             head_dim OCP E5M2 codes of x itself (vLLM's kv_cache_dtype fp8_e5m2: no scale, its
//                        range, +-57344, needs none), nearest even, saturating: exactly half of bf16's bytes
//   fp8-e4m3-static      head_dim E4M3 codes of x / s with a static scale s per (layer, K or V, kv head)
//                        held by the shape (vLLM's k_scale / v_scale, calibrated before serving; 1 when
//                        none is given), no scale in the record: exactly half of bf16's bytes. Values
//                        beyond 448 s saturate; the kernel folds s into the scores and the output.
//   int4-kivi            KIVI (Liu et al., ICML 2024): keys quantized per channel over groups of 32 tokens
//                        (32 consecutive positions from a multiple of 32), values per token over blocks of 32
//                        channels, both asymmetric 4-bit: codes q = rint((x - m) / s) in [0, 15] with m the
//                        minimum and s = (max - min) / 15, both stored in fp16 (the codes taken against the
//                        stored values), value m + s q. The tokens of a request's last, incomplete group stay in
//                        fp16 in a residual area of the request ([layers][32][K, V][kv_heads][head_dim], tag kv;
//                        KIVI keeps its recent tokens in full precision) and are quantized together when the group
//                        completes. A record holds its head_dim / 2 code bytes (int4's nibble order), then head_dim /
//                        32 pairs (s, m) of fp16: a V record its blocks', a K record those of channels [j c, (j + 1)
//                        c) of its group (j its position in the group, c = head_dim / 32), so a key is decoded with
//                        its group's 32 records (read_token). head_dim must be a multiple of 32. A NaN or Inf makes
//                        the channel's (K) or block's (V) step NaN over the group: those values decode to NaN.
//                        Records of the incomplete group are zero until it completes; the kernels read the
//                        residual there. Written only through write_token / write_tokens, in order.
//   int2-kivi            KIVI-2, the paper's 2-bit configuration: int4-kivi with codes in [0, 3], s = (max - min)
//                        / 3, four codes a byte (element 4j + k in bits 2k, 2k + 1 of byte j): head_dim / 4 code
//                        bytes, then the same pairs and the same residual.
// A vector of zeros stores s = 0 and decodes to zeros; a NaN or Inf element makes the scale non-finite
// and the whole vector decodes to NaN (a defined, visible result; q8_0 / q4_0: its block of 32); with a
// static scale (and fp8-e5m2), a NaN element stays NaN and an infinite one saturates, element by element. A q8_0 / q4_0
// block whose scale passes fp16's range (amax above 8.3e6 / 5.2e5) stores an infinite scale and decodes
// to infinities and NaNs, as ggml's does.
//
// A token's entry at one layer is [K, V] x kv_heads head records: 2 * kv_heads * head_bytes bytes.
// Layouts (all bytes from the device's tracked pool, tag kv):
//   contiguous (the reference: what naive serving stacks do)  each request reserves its maximum length
//       up front: [layers][max_tokens][entry];
//   paged (vLLM's PagedAttention)  a pool of fixed-size blocks allocated once; a block holds
//       [layers][block_tokens][entry]; each request has a block table (its logical block i lives in
//       physical block table[i]); blocks come from a free list as the request grows, carry reference
//       counts so that fork() shares a prefix, are copied on write when a request appends into a
//       block another request still holds, and return to the free list when the last holder releases.
// Running out of blocks is a refusal (add/append return false), never a crash: the scheduler waits or
// preempts.
//
// Offload (paged, PagedCache::enable_offload): each request keeps its newest blocks in the device pool
// and its older, full ones ("cold") in a host pool (pinned on CUDA), FlexGen-style; before the kernels
// read a layer, stage() copies that layer's slices of the cold blocks into a device staging area. The
// device then holds the hot blocks and one layer of the cold ones; each decode step moves every cold
// token's entry of every layer to the device once (bytes counted by traffic()).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/common.hpp"
#include "harness/device.hpp"

namespace memtrade::kvcache {

enum class KvType { f32, bf16, f16, int8, fp8_e4m3, fp8_e4m3_static, int4, int4_smooth, q8_0, q4_0, fp8_e5m2, int4_kivi, int2_kivi };
const char* kv_type_name(KvType t);
// "fp32", "bf16", "fp16", "int8", "fp8-e4m3", "fp8-e4m3-static", "int4", "int4-smooth", "q8_0", "q4_0",
// "fp8-e5m2", "int4-kivi", "int2-kivi"; Error otherwise
KvType parse_kv_type(const std::string& s);
// The KIVI types (int4-kivi, int2-kivi): keys per channel over groups, values per token, a per-request residual.
MT_HD constexpr bool is_kivi(KvType t) { return t == KvType::int4_kivi || t == KvType::int2_kivi; }

// The KIVI types (int4-kivi, int2-kivi): tokens per key group, channels per value block, and the default (and
// shortest) length of the fp16 residual (KvShape::residual).
constexpr int64_t kKiviGroup = 32;

// What scales a record beyond its own bytes: fp8-e4m3-static's scale of its (layer, K or V, kv head), and
// int4-smooth's key smoothing factors (head_dim of them; nullptr for V records and every other type).
struct RecordScales {
  float scale = 1.f;
  const float* smooth = nullptr;
  RecordScales(float s = 1.f, const float* sm = nullptr) : scale(s), smooth(sm) {}  // NOLINT: a plain scale converts
};

struct KvShape {
  int64_t layers = 0, kv_heads = 0, head_dim = 0;
  KvType type = KvType::f32;
  // fp8-e4m3-static: [layers][K, V][kv_heads] scales (empty: all 1). Ignored by the other types.
  std::vector<float> static_scales{};
  // int4-smooth: [layers][kv_heads][head_dim] key smoothing factors (empty: none). Ignored by the others.
  std::vector<float> key_smoothing{};
  // The KIVI types: KIVI's R, the newest tokens a request keeps in fp16 (a positive multiple of kKiviGroup);
  // when R have gathered they are quantized together, R / kKiviGroup key groups at once. kKiviGroup for the
  // other types.
  int64_t residual = kKiviGroup;
  // The static scale of (layer, kv = 0 for K / 1 for V, head); 1 for every other type. Error when
  // static_scales is set with the wrong size or a scale that is not positive and finite, int4 has an
  // odd head_dim, q8_0 / q4_0 one that is not a multiple of 32, or residual is not one the type takes.
  float scale(int64_t layer, int kv, int64_t head) const;
  // What a decode kernel multiplies the scores of KV head `head` by: 1 / sqrt(head_dim) x the static K scale.
  float qk_scale(int64_t layer, int64_t head) const {
    return scale(layer, 0, head) / std::sqrt(static_cast<float>(head_dim));
  }
  // Where (layer, kv, head) sits in static_scales (and in any per-(layer, K or V, head) table).
  int64_t scale_index(int64_t layer, int kv, int64_t head) const { return (layer * 2 + kv) * kv_heads + head; }
  // int4-smooth's factors of (layer, kv head): head_dim floats, or nullptr (another type, or none set).
  const float* smoothing(int64_t layer, int64_t head) const {
    return type == KvType::int4_smooth && !key_smoothing.empty()
               ? key_smoothing.data() + (layer * kv_heads + head) * head_dim
               : nullptr;
  }
  // Everything that scales the record of (layer, kv = 0 for K / 1 for V, head).
  RecordScales record_scales(int64_t layer, int kv, int64_t head) const {
    return {scale(layer, kv, head), kv == 0 ? smoothing(layer, head) : nullptr};
  }
  void validate() const;
  int64_t elem_bits() const;
  bool scaled() const {
    return type == KvType::int8 || type == KvType::fp8_e4m3 || type == KvType::int4 || type == KvType::int4_smooth;
  }
  bool blocked() const { return type == KvType::q8_0 || type == KvType::q4_0; }  // an fp16 scale per 32 elements
  bool kivi() const { return is_kivi(type); }  // (s, m) fp16 pairs, head_dim / 32 of them, and a residual
  int64_t head_bytes() const {
    return head_dim * elem_bits() / 8 + (scaled() ? 4 : 0) + (blocked() ? head_dim / 16 : 0) + (kivi() ? head_dim / 8 : 0);
  }
  int64_t entry_bytes() const { return 2 * kv_heads * head_bytes(); }          // one token, one layer
  int64_t token_bytes() const { return layers * entry_bytes(); }                // one token, all layers
  // The KIVI types: one request's residual area, fp16 K and V of `tokens` tokens (the cache's: `residual`) at
  // every layer; 0 otherwise.
  int64_t residual_entry_bytes() const { return 2 * kv_heads * head_dim * 2; }
  int64_t residual_bytes(int64_t tokens) const { return kivi() ? layers * tokens * residual_entry_bytes() : 0; }
  int64_t residual_bytes() const { return residual_bytes(residual); }
};

// One head vector to and from its record; sc is the shape's record_scales() for the record's (layer, K or
// V, head) and matters to fp8-e4m3-static and int4-smooth only. Not the KIVI types, whose key records need their
// group (KvCache::write_token / read_token): Error.
void encode_head(KvType t, const float* x, int64_t head_dim, uint8_t* record, RecordScales sc = {});
void decode_head(KvType t, const uint8_t* record, int64_t head_dim, float* x, RecordScales sc = {});

class KvCache {
 public:
  explicit KvCache(const KvShape& s) : shape_(s) { shape_.validate(); }
  virtual ~KvCache() = default;
  const KvShape& shape() const { return shape_; }

  // A new request of at most max_tokens tokens; its id, or -1 when there is no memory for it.
  virtual int64_t add(int64_t max_tokens) = 0;
  // Grows the request by one token (the slot is written through entry()); false when no memory is left.
  virtual bool append(int64_t req) = 0;
  virtual void release(int64_t req) = 0;
  virtual int64_t length(int64_t req) const = 0;
  // Token pos's [K, V] x kv_heads records at `layer`; writable only for the request's last token.
  virtual uint8_t* entry(int64_t req, int64_t layer, int64_t pos) = 0;
  // Stores token pos's keys and values at `layer` (k, v: [kv_heads][head_dim], host arrays) as the storage type
  // says: encoded on the host and copied to the cache's device. KIVI types: pos must be the request's last
  // token, and when it completes the residual (shape().residual tokens) their groups' records are written from
  // it. read_token (host caches: the CPU device) gives them back as the kernels read them (KIVI: the residual's
  // fp16 values for the tokens not yet quantized).
  void write_token(int64_t req, int64_t layer, int64_t pos, const float* k, const float* v);
  // Tokens [from, from + count) at `layer` (k, v: [count][kv_heads][head_dim]), as write_token would store
  // each, with one copy per run of consecutive entries on a device cache. KIVI types: the run must end at the
  // request's last token (tokens are written in order); on a device its residual slots take one copy per
  // residual they fall in.
  void write_tokens(int64_t req, int64_t layer, int64_t from, int64_t count, const float* k, const float* v);
  void read_token(int64_t req, int64_t layer, int64_t pos, float* k, float* v) const;
  // Tokens of the request held in records: its length, or for the KIVI types those of its complete residuals
  // (a multiple of shape().residual); the rest are in residual(req, layer): fp16 entries of [K, V] x kv_heads x
  // head_dim, position p at slot p % shape().residual.
  int64_t quantized_length(int64_t req) const {
    return shape_.kivi() ? length(req) / shape_.residual * shape_.residual : length(req);
  }
  const uint8_t* residual(int64_t req, int64_t layer) const;
  // The request's tokens at `layer` as runs of consecutive entries: fn(first entry, first pos, count);
  // runs_in: only those at positions [from, to) (clipped to the request's length), in position order.
  using RunFn = std::function<void(const uint8_t*, int64_t, int64_t)>;
  void runs(int64_t req, int64_t layer, const RunFn& fn) const { runs_in(req, layer, 0, length(req), fn); }
  virtual void runs_in(int64_t req, int64_t layer, int64_t from, int64_t to, const RunFn& fn) const = 0;
  // The device whose pool holds the cache (the kernels take their workspace from it).
  virtual Device& device() const = 0;
  // Before the kernels read `layer` of these requests: brings what they will read to the device (an
  // offloading cache); a no-op for caches that keep everything on the device.
  virtual void stage(std::span<const int64_t> reqs, int64_t layer) {
    (void)reqs;
    (void)layer;
  }
  // Error unless runs() can read `layer` of these requests now (an offloading cache staged it).
  virtual void require_staged(std::span<const int64_t> reqs, int64_t layer) const {
    (void)reqs;
    (void)layer;
  }
  // An offloading cache: how many of its staging slots, from the first, must hold their copies before
  // positions [from, to) of req can be read (1 + the highest slot among them); 0 when every one of those
  // positions is on the device.
  virtual int64_t staging_needed(int64_t req, int64_t from, int64_t to) const {
    (void)req;
    (void)from;
    (void)to;
    return 0;
  }
  // Bytes the cache holds for requests now (reserved or in their blocks; on the device), and of their
  // tokens.
  virtual int64_t reserved_bytes() const = 0;
  int64_t used_bytes() const;
  virtual std::vector<int64_t> live_requests() const = 0;

 protected:
  // The KIVI types' residual areas, by request id (empty Buffers for the other types and released requests).
  bool add_residual(Device& dev, int64_t req);  // false when the pool cannot hold it
  void drop_residual(int64_t req);
  int64_t residual_reserved() const;
  // One token's [K, V] x kv_heads records at `layer` into e (host memory; not the KIVI types).
  void encode_entry(int64_t layer, const float* k, const float* v, uint8_t* e) const;
  // Entries [from, from + count) of the request at `layer` from host memory (src: count entries back to back)
  // to the cache's device, one copy per run of entries adjacent in its memory.
  void copy_entries(int64_t req, int64_t layer, int64_t from, int64_t count, const uint8_t* src);
  // The KIVI types' write_tokens (the checks done): tokens into the residual, records when it completes.
  void write_kivi(int64_t req, int64_t layer, int64_t from, int64_t count, const float* k, const float* v);
  std::vector<Buffer> residual_;
  KvShape shape_;
};

class ContiguousCache final : public KvCache {
 public:
  // max_tokens_total > 0: add() also refuses a request whose reservation would pass that many tokens
  // in all (a KV memory budget inside a larger pool).
  ContiguousCache(Device& dev, const KvShape& s, int64_t max_tokens_total = 0)
      : KvCache(s), dev_(dev), budget_(max_tokens_total) {}
  int64_t add(int64_t max_tokens) override;
  bool append(int64_t req) override;
  void release(int64_t req) override;
  int64_t length(int64_t req) const override { return at(req).len; }
  uint8_t* entry(int64_t req, int64_t layer, int64_t pos) override;
  void runs_in(int64_t req, int64_t layer, int64_t from, int64_t to, const RunFn& fn) const override;
  Device& device() const override { return dev_; }
  int64_t reserved_bytes() const override;
  std::vector<int64_t> live_requests() const override;

 private:
  struct Req {
    Buffer buf;
    int64_t max = 0, len = 0;
    bool live = false;
  };
  const Req& at(int64_t req) const;
  Device& dev_;
  int64_t budget_;
  std::vector<Req> reqs_;
};

class PagedCache final : public KvCache {
 public:
  // Allocates num_blocks blocks of block_tokens tokens at once (OutOfMemory when the pool cannot).
  PagedCache(Device& dev, const KvShape& s, int64_t block_tokens, int64_t num_blocks);
  int64_t add(int64_t max_tokens) override;  // takes no block until the first append
  bool append(int64_t req) override;
  void release(int64_t req) override;
  int64_t length(int64_t req) const override { return at(req).len; }
  uint8_t* entry(int64_t req, int64_t layer, int64_t pos) override;
  void runs_in(int64_t req, int64_t layer, int64_t from, int64_t to, const RunFn& fn) const override;
  Device& device() const override { return dev_; }
  int64_t reserved_bytes() const override;
  std::vector<int64_t> live_requests() const override;

  // A new request sharing all of req's tokens (their blocks' reference counts go up). KIVI types: the blocks
  // that hold positions of req's incomplete group are copied for the fork instead (completing the group
  // rewrites them), and its residual too; -1 when the pool cannot hold those copies.
  int64_t fork(int64_t req);
  int64_t block_tokens() const { return block_tokens_; }
  int64_t block_bytes() const { return block_tokens_ * shape_.token_bytes(); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_blocks() const { return num_blocks_; }
  // A request's block table: device block b >= 0, or host block h as -1 - h (offload).
  const std::vector<int32_t>& table(int64_t req) const { return at(req).table; }
  int32_t refcount(int32_t block) const { return refs_.at(block); }

  // Offload (see the top of this file): at most hot_blocks (>= 1) device blocks per request; older ones
  // move to one of host_blocks host blocks (a device-to-host copy of the whole block; a block a fork
  // still holds stays on the device for it as well). append() refuses when a block must move and the
  // host pool is full. stage() copies the layer's slice of every cold block of `reqs` (a host block shared
  // by forks once) into the staging area, host_blocks slots of one slice in the device pool (host block h
  // in slot h), where runs() reads them until the next stage() or eviction; runs() over an unstaged cold
  // block is an Error. Call once, before the first add().
  void enable_offload(int64_t host_blocks, int64_t hot_blocks);
  bool offloading() const { return hot_blocks_ > 0; }
  void stage(std::span<const int64_t> reqs, int64_t layer) override;
  // stage() in two parts, for copies overlapped with the kernels (CudaDecode::run_staged): select_staged()
  // chooses the slots that the layer's reads need, and copy_staged() copies the chosen ones among slots
  // [from, to), consecutive slots in one copy where they are consecutive on the host too (a one-layer
  // cache), through the device's overlapped copies when `overlapped` (Device::copy_async).
  void select_staged(std::span<const int64_t> reqs, int64_t layer);
  void copy_staged(int64_t from, int64_t to, bool overlapped);
  int64_t staging_slots() const { return host_blocks_; }
  int64_t staging_needed(int64_t req, int64_t from, int64_t to) const override;
  void require_staged(std::span<const int64_t> reqs, int64_t layer) const override;
  int64_t host_blocks_used() const { return host_blocks_ - static_cast<int64_t>(host_free_.size()); }
  int64_t host_reserved_bytes() const { return host_blocks_used() * block_bytes(); }
  int64_t staging_bytes() const { return host_blocks_ * slice_bytes(); }
  struct Traffic {
    int64_t to_device = 0, to_host = 0;  // bytes copied since the last reset
  };
  Traffic traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = {}; }

 private:
  struct Req {
    std::vector<int32_t> table;
    int64_t len = 0, cold = 0;  // cold: the leading blocks of the table that live in the host pool
    bool live = false;
  };
  const Req& at(int64_t req) const;
  uint8_t* block_ptr(int32_t b, int64_t layer) const;
  int64_t slice_bytes() const { return block_tokens_ * shape_.entry_bytes(); }  // one block, one layer
  bool evict_oldest(Req& r);
  // A free block holding the first `tokens` entries of block `from` at every layer (reference count 1); -1
  // when none is free. Copy on write and a KIVI fork take their copies here.
  int32_t copy_block(int32_t from, int64_t tokens);
  // One reference to device block b dropped; the block goes back to the free list with the last.
  void unref_block(int32_t b) {
    if (--refs_[b] == 0) free_.push_back(b);
  }
  Device& dev_;
  int64_t block_tokens_, num_blocks_;
  Buffer pool_;
  std::vector<int32_t> free_, refs_;
  std::vector<Req> reqs_;
  // offload
  int64_t host_blocks_ = 0, hot_blocks_ = 0, staged_layer_ = -1;
  Buffer host_pool_, staging_;
  std::vector<int32_t> host_free_, host_refs_;
  std::vector<uint8_t> staged_;  // per host block: selected for the staging area (slot h)
  Traffic traffic_;
};

}  // namespace memtrade::kvcache
