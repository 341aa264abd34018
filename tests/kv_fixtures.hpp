// KV cache fixtures shared by the CPU tests (test_kvcache.cpp), the emulated CUDA kernels' tests
// (test_kvcache_emulated.cpp) and the CUDA ones (test_cuda.cpp): every storage type, random static scales
// and smoothing factors, seeded tokens, and one set of requests held by a contiguous cache and by a paged
// one whose block tables are scattered over thousands of blocks.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "datasets/random.hpp"
#include "impls/kvcache/kv_cache.hpp"

namespace memtrade::test::kv {

using kvcache::KvCache;
using kvcache::KvShape;
using kvcache::KvType;

inline constexpr KvType kTypes[] = {KvType::f32,  KvType::bf16,        KvType::f16,  KvType::int8,
                                    KvType::fp8_e4m3, KvType::fp8_e4m3_static, KvType::int4,
                                    KvType::int4_smooth, KvType::q8_0, KvType::q4_0, KvType::fp8_e5m2};

// Every storage type: the record types and the KIVI types (written by group, no record-by-record
// encode_head; their decode splits are multiples of 32 tokens).
inline constexpr KvType kCacheTypes[] = {KvType::f32,      KvType::bf16,        KvType::f16,  KvType::int8,
                                         KvType::fp8_e4m3, KvType::fp8_e4m3_static, KvType::int4,
                                         KvType::int4_smooth, KvType::q8_0, KvType::q4_0, KvType::fp8_e5m2,
                                         KvType::int4_kivi, KvType::int2_kivi};

// Whether type t takes head_dim hd (q8_0, q4_0 and the KIVI types need a multiple of 32).
inline bool takes(KvType t, int64_t hd) {
  const KvShape s{1, 1, hd, t};
  return (!s.blocked() && !s.kivi()) || hd % 32 == 0;
}

// fp8-e4m3-static scales in [0.5, 2) for every (layer, K or V, head) of s; int4-smooth factors in
// [1/8, 8) for every (layer, kv head, channel).
inline void random_static_scales(KvShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  if (s.type == KvType::fp8_e4m3_static) {
    s.static_scales.resize(static_cast<std::size_t>(s.layers * 2 * s.kv_heads));
    for (float& x : s.static_scales) x = std::ldexp(1.f + static_cast<float>(rng() % 1000) / 1000.f, -1 + static_cast<int>(rng() % 2));
  }
  if (s.type == KvType::int4_smooth) {
    s.key_smoothing.resize(static_cast<std::size_t>(s.layers * s.kv_heads * s.head_dim));
    for (float& x : s.key_smoothing) x = std::ldexp(1.f + static_cast<float>(rng() % 1000) / 1000.f, -3 + static_cast<int>(rng() % 6));
  }
}

inline std::vector<float> normals(int64_t n, uint64_t seed, float scale = 1.f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(datasets::normal(seed, i));
  return v;
}

// Writes tokens [from, from + n) of request r (layers 0..layers-1) with values from (seed, r, pos), through
// KvCache::write_tokens (on any device: records encoded on the host and copied, a copy per run of adjacent
// entries; the KIVI types' runs must end at the request's last token).
inline void write_tokens(KvCache& c, int64_t r, int64_t from, int64_t n, uint64_t seed) {
  const KvShape& s = c.shape();
  const int64_t hd = s.head_dim, per = s.kv_heads * hd;
  std::vector<float> k(static_cast<std::size_t>(n * per)), v(k.size());
  for (int64_t l = 0; l < s.layers; ++l) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < 2 * s.kv_heads; ++h) {
        const auto x = normals(hd, seed * 1000003 + static_cast<uint64_t>(((from + i) * s.layers + l) * 64 + h));
        std::copy(x.begin(), x.end(), (h < s.kv_heads ? k : v).begin() + i * per + (h % s.kv_heads) * hd);
      }
    c.write_tokens(r, l, from, n, k.data(), v.data());
  }
}
inline void write_token(KvCache& c, int64_t r, int64_t pos, uint64_t seed) { write_tokens(c, r, pos, 1, seed); }

// The same requests of lengths `len` in a paged cache (p) and in an offloading one (o: each request's newest
// `hot` blocks in the device pool, which holds only those, the older ones in a host pool of as many blocks),
// blocks of `block` tokens; tokens appended round-robin across the requests and written as they are
// appended (through the device's copies, on any device). cold: the blocks in o's host pool.
struct OffloadPair {
  std::unique_ptr<kvcache::PagedCache> p, o;
  std::vector<int64_t> rp, ro;
  int64_t cold = 0;
};
inline OffloadPair offload_pair(Device& dev, const KvShape& s, const std::vector<int64_t>& len, int64_t block, int64_t hot) {
  OffloadPair x;
  const auto B = static_cast<int64_t>(len.size());
  int64_t blocks = 0, longest = 0;
  for (int64_t n : len) {
    blocks += (n + block - 1) / block;
    x.cold += std::max<int64_t>(0, (n + block - 1) / block - hot);
    longest = std::max(longest, n);
  }
  x.p = std::make_unique<kvcache::PagedCache>(dev, s, block, blocks);
  x.o = std::make_unique<kvcache::PagedCache>(dev, s, block, B * hot);
  x.o->enable_offload(std::max<int64_t>(1, x.cold), hot);
  for (int64_t b = 0; b < B; ++b) {
    x.rp.push_back(x.p->add(len[b]));
    x.ro.push_back(x.o->add(len[b]));
  }
  for (int64_t i = 0; i < longest; i += block)  // a block of each request in turn, written before the next
    for (int64_t b = 0; b < B; ++b)
      if (i < len[b]) {
        const int64_t n = std::min(block, len[b] - i);
        for (int64_t j = 0; j < n; ++j)
          if (!x.p->append(x.rp[b]) || !x.o->append(x.ro[b])) throw Error("offload_pair: a cache refused a token");
        write_tokens(*x.p, x.rp[b], i, n, static_cast<uint64_t>(b));
        write_tokens(*x.o, x.ro[b], i, n, static_cast<uint64_t>(b));
      }
  return x;
}

// B requests of random lengths in [1, max_len] (the last max_len; with three or more, the first one token)
// in both layouts, the same tokens in each (written when `write`, on any device, each request whole once
// all are appended; without it the tables only). The paged cache has block 16 and
// 4096 blocks; a holder request takes 0-2 blocks between appends, so the tables are scattered. The same
// seed gives the same tables on any device.
struct TwoLayouts {
  std::unique_ptr<kvcache::ContiguousCache> c;
  std::unique_ptr<kvcache::PagedCache> p;
  std::vector<int64_t> rc, rp, len;
};
inline TwoLayouts two_layouts(Device& dev, const KvShape& s, int64_t B, int64_t max_len, uint64_t seed, bool write = true) {
  std::mt19937_64 rng(seed);
  TwoLayouts t;
  t.c = std::make_unique<kvcache::ContiguousCache>(dev, s);
  t.p = std::make_unique<kvcache::PagedCache>(dev, s, 16, 4096);
  for (int64_t b = 0; b < B; ++b)
    t.len.push_back(b == B - 1 ? max_len : b == 0 && B >= 3 ? 1 : 1 + static_cast<int64_t>(rng() % max_len));
  const int64_t hold = t.p->add(4096 * 16);
  for (int64_t b = 0; b < B; ++b) {
    t.rc.push_back(t.c->add(max_len));
    t.rp.push_back(t.p->add(max_len));
  }
  std::vector<int64_t> order;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < t.len[b]; ++i) order.push_back(b);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t b : order) {
    for (int k = static_cast<int>(rng() % 3); k > 0; --k) t.p->append(hold);
    if (!t.c->append(t.rc[b]) || !t.p->append(t.rp[b])) throw Error("two_layouts: a cache refused a token");
  }
  if (write)  // every request's tokens at once: a copy per block on a device
    for (int64_t b = 0; b < B; ++b) {
      write_tokens(*t.c, t.rc[b], 0, t.len[b], static_cast<uint64_t>(b));
      write_tokens(*t.p, t.rp[b], 0, t.len[b], static_cast<uint64_t>(b));
    }
  return t;
}

}  // namespace memtrade::test::kv
