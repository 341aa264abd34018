// One element of a head record and the record's own scale (kv_cache.hpp describes the records), for the
// host and for CUDA: decode_head (the CPU's decoding, which the tests check against the encoders) is
// written with these, and so are the CUDA decode kernels (decode_kernels.cuh). A value is
// element_scale(t, r, hd, i) x record_value(t, r, i): the record's own scale (record_scale), or for q8_0
// and q4_0 the scale of element i's block (block_scale); the static fp8 scale and int4-smooth's factors
// come from the shape (RecordScales), not from the record.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/common.hpp"
#include "common/dtype.hpp"
#include "impls/kvcache/kv_cache.hpp"
#include "impls/quant/formats.hpp"

namespace memtrade::kvcache {

// Element i of an array of T at r: a plain load on the device (records there are aligned to their element
// type: the pool is, and every record's size is a multiple of it), memcpy on the host (any address).
template <class T>
MT_HD T record_load(const uint8_t* r, int64_t i) {
#if defined(__CUDA_ARCH__)
  return reinterpret_cast<const T*>(r)[i];
#else
  T v;
  std::memcpy(&v, r + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
#endif
}

// int4-kivi and int2-kivi: KIVI's asymmetric codes of 4 or 2 bits. A value is m + s q for the code q in
// [0, 2^bits); record_value gives q less the zero point z = 2^(bits - 1), as int4's decode does, so that the
// value is m + s (record_value + z) and the kernels share the symmetric types' code decode.
MT_HD constexpr float kivi_zero(KvType t) { return t == KvType::int2_kivi ? 2.f : 8.f; }

// The value of one element code, unscaled: the fp32 bits, bf16 or fp16 bits, the int8 code (int8, q8_0),
// an E4M3 or E5M2 code (decoded), a 4-bit code (int4, q4_0, int4-kivi: the nibble, 0..15, less 8) or a 2-bit
// one (int2-kivi: 0..3, less 2).
MT_HD float code_value(KvType t, uint32_t code) {
  switch (t) {
    case KvType::f32: return detail::bits_as_float(code);
    case KvType::bf16: return bf16_bits_to_float(static_cast<uint16_t>(code));
    case KvType::f16: return half_bits_to_float(static_cast<uint16_t>(code));
    case KvType::int8:
    case KvType::q8_0: return static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(code)));
    case KvType::fp8_e4m3:
    case KvType::fp8_e4m3_static: return quant::fp8_e4m3_decode(static_cast<uint8_t>(code));
    case KvType::fp8_e5m2: return quant::fp8_e5m2_decode(static_cast<uint8_t>(code));
    case KvType::int4:
    case KvType::int4_smooth:
    case KvType::q4_0:
    case KvType::int4_kivi: return static_cast<float>(static_cast<int>(code & 15) - 8);  // int4-kivi: q - 8
    case KvType::int2_kivi: return static_cast<float>(static_cast<int>(code & 3) - 2);
  }
  return 0.f;
}

// Element i's code in a record (int4, q4_0: element 2j in the low nibble of byte j, 2j + 1 in the high one;
// int2-kivi: element 4j + k in bits 2k, 2k + 1 of byte j).
MT_HD uint32_t record_code(KvType t, const uint8_t* r, int64_t i) {
  switch (t) {
    case KvType::f32: return record_load<uint32_t>(r, i);
    case KvType::bf16:
    case KvType::f16: return record_load<uint16_t>(r, i);
    case KvType::int4:
    case KvType::int4_smooth:
    case KvType::q4_0:
    case KvType::int4_kivi: return (i & 1) ? r[i >> 1] >> 4 : r[i >> 1] & 15u;
    case KvType::int2_kivi: return (r[i >> 2] >> (2 * (i & 3))) & 3u;
    default: return r[i];
  }
}

// Code e of a run of codes of B bits (32, 16, 8, 4 or 2) held in little-endian 32-bit words: how a CUDA lane
// cuts the slice of a record it loaded whole.
template <int B>
MT_HD uint32_t slice_code(const uint32_t* w, int e) {
  if constexpr (B == 32) {
    return w[e];
  } else {
    constexpr int per = 32 / B;
    return (w[e / per] >> (B * (e % per))) & ((1u << B) - 1u);
  }
}

// Element i of a record, unscaled.
MT_HD float record_value(KvType t, const uint8_t* r, int64_t i) { return code_value(t, record_code(t, r, i)); }

// Whether the record ends with its own fp32 scale (int8, fp8-e4m3, int4, int4-smooth).
MT_HD bool record_scaled(KvType t) {
  return t == KvType::int8 || t == KvType::fp8_e4m3 || t == KvType::int4 || t == KvType::int4_smooth;
}

// Bytes of a record's codes: its scale or scales follow them.
MT_HD int64_t record_code_bytes(KvType t, int64_t hd) {
  switch (t) {
    case KvType::f32: return 4 * hd;
    case KvType::bf16:
    case KvType::f16: return 2 * hd;
    case KvType::int4:
    case KvType::int4_smooth:
    case KvType::q4_0:
    case KvType::int4_kivi: return hd / 2;
    case KvType::int2_kivi: return hd / 4;
    default: return hd;
  }
}

// The record's own scale (1 for the types that store none), read byte by byte: it sits right after the
// codes (byte hd, or hd / 2 for int4), which need not be 4-byte aligned.
MT_HD float record_scale(KvType t, const uint8_t* r, int64_t hd) {
  if (!record_scaled(t)) return 1.f;
  const uint8_t* s = r + record_code_bytes(t, hd);
  return detail::bits_as_float(static_cast<uint32_t>(s[0]) | static_cast<uint32_t>(s[1]) << 8 |
                               static_cast<uint32_t>(s[2]) << 16 | static_cast<uint32_t>(s[3]) << 24);
}

// q8_0 and q4_0: an fp16 scale per block of kKvBlock elements, the blocks' scales in order after the codes.
constexpr int64_t kKvBlock = 32;
MT_HD constexpr bool record_blocked(KvType t) { return t == KvType::q8_0 || t == KvType::q4_0; }

// The scale of element i's block (q8_0, q4_0), read byte by byte.
MT_HD float block_scale(KvType t, const uint8_t* r, int64_t hd, int64_t i) {
  const uint8_t* s = r + record_code_bytes(t, hd) + 2 * (i / kKvBlock);
  return half_bits_to_float(static_cast<uint16_t>(s[0] | s[1] << 8));
}

// What multiplies element i's record_value: its block's scale, the record's own, or 1.
MT_HD float element_scale(KvType t, const uint8_t* r, int64_t hd, int64_t i) {
  return record_blocked(t) ? block_scale(t, r, hd, i) : record_scale(t, r, hd);
}

// int4-kivi / int2-kivi (type t): the k-th (s, m) pair after a record's codes, read byte by byte: a V record's
// block k, or channel j c + k of a K record's group (j its position in the group, c = head_dim / 32). A value
// is m + s q, q the code (record_value + kivi_zero).
struct KiviPair {
  float s, m;
};
// Where a record's (s, m) pairs start: right after its codes (pair k at 4 k bytes from there).
MT_HD const uint8_t* kivi_pairs(KvType t, const uint8_t* r, int64_t hd) { return r + record_code_bytes(t, hd); }
MT_HD uint8_t* kivi_pairs(KvType t, uint8_t* r, int64_t hd) { return r + record_code_bytes(t, hd); }
MT_HD KiviPair kivi_pair(KvType t, const uint8_t* r, int64_t hd, int64_t k) {
  const uint8_t* p = kivi_pairs(t, r, hd) + 4 * k;
  return {half_bits_to_float(static_cast<uint16_t>(p[0] | p[1] << 8)),
          half_bits_to_float(static_cast<uint16_t>(p[2] | p[3] << 8))};
}

}  // namespace memtrade::kvcache
