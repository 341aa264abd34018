#include "impls/kvcache/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "common/dtype.hpp"
#include "impls/kvcache/record.hpp"
#include "impls/quant/formats.hpp"

namespace memtrade::kvcache {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::f32: return "fp32";
    case KvType::bf16: return "bf16";
    case KvType::f16: return "fp16";
    case KvType::int8: return "int8";
    case KvType::fp8_e4m3: return "fp8-e4m3";
    case KvType::fp8_e4m3_static: return "fp8-e4m3-static";
    case KvType::int4: return "int4";
    case KvType::int4_smooth: return "int4-smooth";
    case KvType::q8_0: return "q8_0";
    case KvType::q4_0: return "q4_0";
    case KvType::fp8_e5m2: return "fp8-e5m2";
    case KvType::int4_kivi: return "int4-kivi";
    case KvType::int2_kivi: return "int2-kivi";
  }
  return "?";
}

KvType parse_kv_type(const std::string& s) {
  for (KvType t : {KvType::f32, KvType::bf16, KvType::f16, KvType::int8, KvType::fp8_e4m3, KvType::fp8_e4m3_static,
                   KvType::int4, KvType::int4_smooth, KvType::q8_0, KvType::q4_0, KvType::fp8_e5m2, KvType::int4_kivi,
                   KvType::int2_kivi})
    if (s == kv_type_name(t)) return t;
  throw Error("unknown KV cache dtype \"" + s +
              "\" (fp32, bf16, fp16, int8, fp8-e4m3, fp8-e4m3-static, int4, int4-smooth, q8_0, q4_0, fp8-e5m2, int4-kivi, "
              "int2-kivi)");
}

float KvShape::scale(int64_t layer, int kv, int64_t head) const {
  if (type != KvType::fp8_e4m3_static || static_scales.empty()) return 1.f;
  return static_scales[static_cast<std::size_t>(scale_index(layer, kv, head))];
}

void KvShape::validate() const {
  MT_CHECK(layers > 0 && kv_heads > 0 && head_dim > 0, "kv cache: layers, kv_heads and head_dim must be positive");
  MT_CHECK((type != KvType::int4 && type != KvType::int4_smooth) || head_dim % 2 == 0,
           "kv cache: int4 packs two values per byte, so head_dim must be even (got " + std::to_string(head_dim) + ")");
  MT_CHECK(!kivi() || head_dim % kKiviGroup == 0,
           std::string("kv cache: ") + kv_type_name(type) +
               " keeps head_dim / 32 channels' key parameters in each record of a group of 32 tokens, so head_dim must be "
               "a multiple of 32 (got " + std::to_string(head_dim) + ")");
  MT_CHECK(kivi() ? residual > 0 && residual % kKiviGroup == 0 : residual == kKiviGroup,
           std::string("kv cache: ") +
               (kivi() ? "KIVI's residual R must be a positive multiple of the key group's 32 tokens"
                       : std::string(kv_type_name(type)) + " keeps no fp16 residual, so residual must stay 32") +
               " (got " + std::to_string(residual) + ")");
  MT_CHECK(!blocked() || head_dim % kKvBlock == 0, std::string("kv cache: ") + kv_type_name(type) +
                                                      " scales blocks of 32 values, so head_dim must be a multiple of 32 (got " +
                                                      std::to_string(head_dim) + ")");
  if (!key_smoothing.empty()) {
    MT_CHECK(static_cast<int64_t>(key_smoothing.size()) == layers * kv_heads * head_dim,
             "kv cache: " + std::to_string(key_smoothing.size()) + " key smoothing factors for " + std::to_string(layers) +
                 " layers x " + std::to_string(kv_heads) + " kv heads x " + std::to_string(head_dim) + " channels");
    for (float f : key_smoothing)
      MT_CHECK(std::isfinite(f) && f > 0,
               "kv cache: a key smoothing factor is " + std::to_string(f) + " (must be positive and finite)");
  }
  if (static_scales.empty()) return;
  MT_CHECK(static_cast<int64_t>(static_scales.size()) == layers * 2 * kv_heads,
           "kv cache: " + std::to_string(static_scales.size()) + " static scales for " + std::to_string(layers) +
               " layers x K, V x " + std::to_string(kv_heads) + " kv heads");
  for (float s : static_scales)
    MT_CHECK(std::isfinite(s) && s > 0, "kv cache: a static scale is " + std::to_string(s) + " (must be positive and finite)");
}

int64_t KvShape::elem_bits() const {
  switch (type) {
    case KvType::f32: return 32;
    case KvType::bf16: case KvType::f16: return 16;
    case KvType::int8: case KvType::fp8_e4m3: case KvType::fp8_e4m3_static: case KvType::q8_0: case KvType::fp8_e5m2:
      return 8;
    case KvType::int4: case KvType::int4_smooth: case KvType::q4_0: case KvType::int4_kivi: return 4;
    case KvType::int2_kivi: return 2;
  }
  return 32;
}

namespace {

// q8_0 / q4_0: ggml's quantize_row_q8_0_ref and quantize_row_q4_0_ref block by block (the same float
// operations in the same order, so the same codes and fp16 scales), the codes in the record's order. A
// block with a NaN or Inf gets a NaN scale and zero codes.
void encode_blocks(KvType t, const float* x, int64_t n, uint8_t* r) {
  uint8_t* scales = r + record_code_bytes(t, n);
  for (int64_t b = 0; b < n / kKvBlock; ++b) {
    const float* xb = x + b * kKvBlock;
    float amax = 0.f, max = 0.f;
    bool finite = true;
    for (int64_t i = 0; i < kKvBlock; ++i) {
      finite = finite && std::isfinite(xb[i]);
      if (amax < std::abs(xb[i])) {
        amax = std::abs(xb[i]);
        max = xb[i];
      }
    }
    const float d = !finite ? NAN : t == KvType::q8_0 ? amax / 127.f : max / -8.f;
    const float inv = 1.f / d;  // ggml's id; 0 for a zero block (and where 1 / d overflows: values that small
                                // store a zero fp16 scale anyway)
    const float id = finite && d != 0.f && std::isfinite(inv) ? inv : 0.f;
    const uint16_t bits = to_f16(d).bits;
    std::memcpy(scales + 2 * b, &bits, 2);
    for (int64_t i = 0; i < kKvBlock; ++i) {
      const int64_t e = b * kKvBlock + i;
      const float v = finite ? xb[i] * id : 0.f;
      if (t == KvType::q8_0) {
        r[e] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v)));  // roundf: halves away from zero
      } else {
        const auto q = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(v + 8.5f))));
        r[e / 2] = static_cast<uint8_t>(e % 2 ? (r[e / 2] & 0x0F) | q << 4 : q);
      }
    }
  }
}

}  // namespace

void encode_head(KvType t, const float* x, int64_t n, uint8_t* r, RecordScales sc) {
  switch (t) {
    case KvType::int4_kivi:
    case KvType::int2_kivi:
      throw Error(std::string("kv cache: ") + kv_type_name(t) + " records are written by group (KvCache::write_token)");
    case KvType::q8_0:
    case KvType::q4_0: return encode_blocks(t, x, n, r);
    case KvType::fp8_e4m3_static:
      for (int64_t i = 0; i < n; ++i) r[i] = quant::fp8_e4m3_encode(x[i] / sc.scale);
      return;
    case KvType::fp8_e5m2:
      for (int64_t i = 0; i < n; ++i) r[i] = quant::fp8_e5m2_encode(x[i]);
      return;
    case KvType::f32: std::memcpy(r, x, n * 4); return;
    case KvType::bf16:
    case KvType::f16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = t == KvType::bf16 ? to_bf16(x[i]).bits : to_f16(x[i]).bits;
        std::memcpy(r + 2 * i, &b, 2);
      }
      return;
    case KvType::int8:
    case KvType::fp8_e4m3:
    case KvType::int4:
    case KvType::int4_smooth: {
      const bool int4 = t == KvType::int4 || t == KvType::int4_smooth;
      const float* smooth = t == KvType::int4_smooth ? sc.smooth : nullptr;  // int4-smooth keys
      auto val = [&](int64_t i) { return smooth ? x[i] / smooth[i] : x[i]; };
      float amax = 0;
      bool finite = true;
      for (int64_t i = 0; i < n; ++i) {
        finite = finite && std::isfinite(val(i));
        amax = std::max(amax, std::abs(val(i)));
      }
      const float qmax = t == KvType::int8 ? 127.f : int4 ? 7.f : quant::fp8_e4m3_max;
      const float s = finite ? amax / qmax : NAN;
      auto code = [&](int64_t i) { return s > 0 ? val(i) / s : 0.f; };  // a zero or non-finite scale: zero codes
      if (int4) {
        auto nib = [&](int64_t i) { return static_cast<uint8_t>(std::clamp(std::rint(code(i)), -7.f, 7.f) + 8.f); };
        for (int64_t i = 0; i < n / 2; ++i) r[i] = static_cast<uint8_t>(nib(2 * i) | nib(2 * i + 1) << 4);
        std::memcpy(r + n / 2, &s, 4);
        return;
      }
      for (int64_t i = 0; i < n; ++i)
        r[i] = t == KvType::int8 ? static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::rint(code(i)), -127.f, 127.f)))
                                 : quant::fp8_e4m3_encode(code(i));
      std::memcpy(r + n, &s, 4);
      return;
    }
  }
}

void decode_head(KvType t, const uint8_t* r, int64_t n, float* x, RecordScales sc) {
  MT_CHECK(!is_kivi(t), std::string("kv cache: ") + kv_type_name(t) + " keys are decoded with their group (KvCache::read_token)");
  if (t == KvType::f32) {
    std::memcpy(x, r, n * 4);
    return;
  }
  if (record_blocked(t)) {
    for (int64_t i = 0; i < n; ++i) x[i] = block_scale(t, r, n, i) * record_value(t, r, i);
    return;
  }
  // The record's scale, or the shape's static one; the 16-bit types have none (their values as stored).
  const bool scaled = record_scaled(t) || t == KvType::fp8_e4m3_static;
  const float s = t == KvType::fp8_e4m3_static ? sc.scale : record_scale(t, r, n);
  for (int64_t i = 0; i < n; ++i) x[i] = scaled ? s * record_value(t, r, i) : record_value(t, r, i);
  if (t == KvType::int4_smooth && sc.smooth)
    for (int64_t i = 0; i < n; ++i) x[i] *= sc.smooth[i];
}

int64_t KvCache::used_bytes() const {
  int64_t n = 0;
  for (int64_t r : live_requests()) n += length(r);
  return n * shape_.token_bytes();
}

namespace {

// KIVI's asymmetric step over n fp16 values h[i * stride] of the residual (a key channel over a group's
// tokens, or a value block over its channels), for codes in [0, top] (top = 15 for int4-kivi, 3 for
// int2-kivi): s = (max - min) / top and m = min, both rounded to fp16, and the codes taken against the
// rounded pair; a NaN or Inf among them gives s = NaN and zero codes; max = min gives s = 0 and zero codes.
struct KiviStep {
  uint16_t s, m;
};
KiviStep kivi_step(const uint16_t* h, int64_t n, int64_t stride, float top, uint8_t* codes) {
  auto x = [&](int64_t i) { return half_bits_to_float(h[i * stride]); };
  float lo = x(0), hi = x(0);
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x(i);
    finite = finite && std::isfinite(v);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const f16_t s = to_f16(finite ? (hi - lo) / top : NAN), m = to_f16(finite ? lo : 0.f);
  const float sf = to_float(s), mf = to_float(m);
  for (int64_t i = 0; i < n; ++i)
    codes[i] = sf > 0 && std::isfinite(sf) ? static_cast<uint8_t>(std::clamp(std::rint((x(i) - mf) / sf), 0.f, top)) : 0;
  return {s.bits, m.bits};
}

void put_pair(KvType t, uint8_t* r, int64_t hd, int64_t k, KiviStep st) {
  uint8_t* p = kivi_pairs(t, r, hd) + 4 * k;
  std::memcpy(p, &st.s, 2);
  std::memcpy(p + 2, &st.m, 2);
}

// Code q of element i into a record of B-bit codes (4 or 2; record_code's order).
void put_code(int B, uint8_t* r, int64_t i, uint8_t q) {
  const int per = 8 / B, shift = B * static_cast<int>(i % per);
  uint8_t& byte = r[i / per];
  byte = static_cast<uint8_t>((byte & ~(((1 << B) - 1) << shift)) | q << shift);
}

}  // namespace

bool KvCache::add_residual(Device& dev, int64_t req) {
  if (!shape_.kivi()) return true;
  if (static_cast<int64_t>(residual_.size()) <= req) residual_.resize(static_cast<std::size_t>(req + 1));
  try {
    residual_[req] = Buffer(dev.memory(), static_cast<std::size_t>(shape_.residual_bytes()), Tag::kv);
  } catch (const OutOfMemory&) {
    return false;
  }
  return true;
}

void KvCache::drop_residual(int64_t req) {
  if (req < static_cast<int64_t>(residual_.size())) residual_[req] = Buffer();
}

int64_t KvCache::residual_reserved() const {
  int64_t n = 0;
  for (const Buffer& b : residual_) n += static_cast<int64_t>(b.bytes());
  return n;
}

const uint8_t* KvCache::residual(int64_t req, int64_t layer) const {
  MT_CHECK(shape_.kivi() && req >= 0 && req < static_cast<int64_t>(residual_.size()) && residual_[req].bytes() > 0 &&
               layer >= 0 && layer < shape_.layers,
           "kv cache: request " + std::to_string(req) + " has no KIVI residual at layer " + std::to_string(layer));
  return residual_[req].as<uint8_t>() + layer * shape_.residual * shape_.residual_entry_bytes();
}

void KvCache::write_token(int64_t req, int64_t layer, int64_t pos, const float* k, const float* v) {
  if (shape_.kivi()) {
    MT_CHECK(pos == length(req) - 1, std::string("kv cache: ") + kv_type_name(shape_.type) +
                                         " tokens are written in order, each as the request's last");
    return write_kivi(req, layer, pos, 1, k, v);
  }
  // A host cache (the CPU device) is encoded in place; any other device's records go through write_tokens'
  // host staging and copy.
  if (device().backend() == Backend::cpu) return encode_entry(layer, k, v, entry(req, layer, pos));
  write_tokens(req, layer, pos, 1, k, v);
}

void KvCache::write_kivi(int64_t req, int64_t layer, int64_t from, int64_t count, const float* k, const float* v) {
  // The tokens go into the residual, their records zero until their residual completes; then the records of
  // its groups are written from its fp16 values. A host cache (the CPU device) is written in place. On any
  // other device the run is cut where a residual completes: each piece's residual slots take one copy, its
  // zeroed records one per run of adjacent entries, and a completed residual is read back (its slots before
  // the piece) and its records copied in one per run.
  Device& dev = device();
  const bool in_place = dev.backend() == Backend::cpu;
  const int64_t hd = shape_.head_dim, kvh = shape_.kv_heads, hb = shape_.head_bytes(), eb = shape_.entry_bytes();
  const int64_t R = shape_.residual, per = 2 * kvh * hd;
  auto* res_at = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(residual(req, layer)));
  // Device caches: the residual's slots up to the last one this run writes, in host memory.
  std::unique_ptr<uint16_t[]> mirror(in_place ? nullptr : new uint16_t[std::min(R, from % R + count) * per]);
  uint16_t* const res = in_place ? res_at : mirror.get();
  std::vector<uint8_t> staged;  // device caches: records before their copy
  const KvType t = shape_.type;
  const int bits = static_cast<int>(shape_.elem_bits());
  const float top = static_cast<float>((1 << bits) - 1);
  const int64_t c = hd / kKiviGroup;
  uint8_t* recs[kKiviGroup];
  uint8_t codes[kKiviGroup];
  for (int64_t a = from; a < from + count;) {
    const int64_t s0 = a % R, n = std::min(R - s0, from + count - a);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t* mine = res + (s0 + i) * per;
      const float *ki = k + (a - from + i) * kvh * hd, *vi = v + (a - from + i) * kvh * hd;
      for (int64_t j = 0; j < kvh * hd; ++j) {
        mine[j] = to_f16(ki[j]).bits;
        mine[kvh * hd + j] = to_f16(vi[j]).bits;
      }
      if (in_place) std::memset(entry(req, layer, a + i), 0, static_cast<std::size_t>(eb));
    }
    if (!in_place)
      dev.copy(res_at + s0 * per, res + s0 * per, static_cast<std::size_t>(n * per * 2), CopyKind::host_to_device);
    const bool complete = s0 + n == R;
    if (!in_place) {
      staged.assign(static_cast<std::size_t>((complete ? R : n) * eb), 0);
      if (!complete) copy_entries(req, layer, a, n, staged.data());
      else if (s0 > 0) dev.copy(res, res_at, static_cast<std::size_t>(s0 * per * 2), CopyKind::device_to_host);
    }
    a += n;
    if (!complete) continue;
    const int64_t base = a - R;  // the residual's first position
    for (int64_t g = 0; g < R; g += kKiviGroup) {
      const uint16_t* gr = res + g * per;
      for (int64_t j = 0; j < kKiviGroup; ++j)
        recs[j] = in_place ? entry(req, layer, base + g + j) : staged.data() + (g + j) * eb;
      for (int64_t h = 0; h < kvh; ++h) {
        for (int64_t ch = 0; ch < hd; ++ch) {  // keys: channel ch over the group's tokens
          const KiviStep st = kivi_step(gr + h * hd + ch, kKiviGroup, per, top, codes);
          for (int64_t j = 0; j < kKiviGroup; ++j) put_code(bits, recs[j] + h * hb, ch, codes[j]);
          put_pair(t, recs[ch / c] + h * hb, hd, ch % c, st);
        }
        for (int64_t j = 0; j < kKiviGroup; ++j)  // values: each token's blocks of 32 channels
          for (int64_t b = 0; b < hd / kKiviGroup; ++b) {
            const KiviStep st = kivi_step(gr + j * per + (kvh + h) * hd + b * kKiviGroup, kKiviGroup, 1, top, codes);
            uint8_t* r = recs[j] + (kvh + h) * hb;
            for (int64_t i = 0; i < kKiviGroup; ++i) put_code(bits, r, b * kKiviGroup + i, codes[i]);
            put_pair(t, r, hd, b, st);
          }
      }
    }
    if (!in_place) copy_entries(req, layer, base, R, staged.data());
  }
}

void KvCache::encode_entry(int64_t layer, const float* k, const float* v, uint8_t* e) const {
  const int64_t hd = shape_.head_dim, kvh = shape_.kv_heads, hb = shape_.head_bytes();
  for (int64_t h = 0; h < kvh; ++h) {
    encode_head(shape_.type, k + h * hd, hd, e + h * hb, shape_.record_scales(layer, 0, h));
    encode_head(shape_.type, v + h * hd, hd, e + (kvh + h) * hb, shape_.record_scales(layer, 1, h));
  }
}

void KvCache::write_tokens(int64_t req, int64_t layer, int64_t from, int64_t count, const float* k, const float* v) {
  MT_CHECK(from >= 0 && count >= 0 && from + count <= length(req),
           "kv cache: write_tokens [" + std::to_string(from) + ", " + std::to_string(from + count) + ") is past request " +
               std::to_string(req) + "'s " + std::to_string(length(req)) + " tokens");
  const int64_t per = shape_.kv_heads * shape_.head_dim, eb = shape_.entry_bytes();
  if (shape_.kivi()) {
    MT_CHECK(from + count == length(req), std::string("kv cache: ") + kv_type_name(shape_.type) +
                                              " tokens are written in order, a run ending at the request's last (got [" +
                                              std::to_string(from) + ", " + std::to_string(from + count) + ") of " +
                                              std::to_string(length(req)) + ")");
    return write_kivi(req, layer, from, count, k, v);
  }
  if (device().backend() == Backend::cpu) {  // in place
    for (int64_t i = 0; i < count; ++i) write_token(req, layer, from + i, k + i * per, v + i * per);
    return;
  }
  std::vector<uint8_t> staged(static_cast<std::size_t>(count * eb));
  for (int64_t i = 0; i < count; ++i) encode_entry(layer, k + i * per, v + i * per, staged.data() + i * eb);
  copy_entries(req, layer, from, count, staged.data());
}

void KvCache::copy_entries(int64_t req, int64_t layer, int64_t from, int64_t count, const uint8_t* src) {
  // One copy per run of entries that are adjacent in the cache's memory (a block, or a contiguous request).
  const int64_t eb = shape_.entry_bytes();
  for (int64_t i = 0; i < count;) {
    uint8_t* const dst = entry(req, layer, from + i);
    int64_t n = 1;
    while (i + n < count && entry(req, layer, from + i + n) == dst + n * eb) ++n;
    device().copy(dst, src + i * eb, static_cast<std::size_t>(n * eb), CopyKind::host_to_device);
    i += n;
  }
}

void KvCache::read_token(int64_t req, int64_t layer, int64_t pos, float* k, float* v) const {
  const int64_t hd = shape_.head_dim, kvh = shape_.kv_heads, hb = shape_.head_bytes();
  MT_CHECK(pos >= 0 && pos < length(req), "kv cache: read_token out of range");
  MT_CHECK(device().backend() == Backend::cpu, "kv cache: read_token reads host memory (a CPU cache)");
  if (shape_.kivi() && pos >= quantized_length(req)) {
    const auto* res = reinterpret_cast<const uint16_t*>(residual(req, layer)) + (pos % shape_.residual) * 2 * kvh * hd;
    for (int64_t i = 0; i < kvh * hd; ++i) {
      k[i] = half_bits_to_float(res[i]);
      v[i] = half_bits_to_float(res[kvh * hd + i]);
    }
    return;
  }
  if (!shape_.kivi()) {
    const uint8_t* e = nullptr;
    runs_in(req, layer, pos, pos + 1, [&](const uint8_t* p, int64_t, int64_t) { e = p; });
    for (int64_t h = 0; h < kvh; ++h) {
      decode_head(shape_.type, e + h * hb, hd, k + h * hd, shape_.record_scales(layer, 0, h));
      decode_head(shape_.type, e + (kvh + h) * hb, hd, v + h * hd, shape_.record_scales(layer, 1, h));
    }
    return;
  }
  // A key channel's (s, m) lives in record ch / c of the group.
  const int64_t first = pos / kKiviGroup * kKiviGroup, c = hd / kKiviGroup;
  const uint8_t* group[kKiviGroup];
  runs_in(req, layer, first, first + kKiviGroup, [&](const uint8_t* p, int64_t at, int64_t n) {
    for (int64_t t = 0; t < n; ++t) group[at - first + t] = p + t * shape_.entry_bytes();
  });
  const uint8_t* e = group[pos - first];
  const KvType t = shape_.type;
  for (int64_t h = 0; h < kvh; ++h)
    for (int64_t i = 0; i < hd; ++i) {
      const KiviPair kp = kivi_pair(t, group[i / c] + h * hb, hd, i % c);
      k[h * hd + i] = kp.m + kp.s * (record_value(t, e + h * hb, i) + kivi_zero(t));
      const KiviPair vp = kivi_pair(t, e + (kvh + h) * hb, hd, i / kKiviGroup);
      v[h * hd + i] = vp.m + vp.s * (record_value(t, e + (kvh + h) * hb, i) + kivi_zero(t));
    }
}

// ---- contiguous ----

const ContiguousCache::Req& ContiguousCache::at(int64_t req) const {
  MT_CHECK(req >= 0 && req < static_cast<int64_t>(reqs_.size()) && reqs_[req].live,
           "kv cache: no live request " + std::to_string(req));
  return reqs_[req];
}

int64_t ContiguousCache::add(int64_t max_tokens) {
  MT_CHECK(max_tokens > 0, "kv cache: a request needs max_tokens > 0");
  if (budget_ > 0 && reserved_bytes() + max_tokens * shape_.token_bytes() + shape_.residual_bytes() > budget_ * shape_.token_bytes())
    return -1;
  Req r;
  try {
    r.buf = Buffer(dev_.memory(), static_cast<std::size_t>(max_tokens * shape_.token_bytes()), Tag::kv);
  } catch (const OutOfMemory&) {
    return -1;
  }
  r.max = max_tokens;
  r.live = true;
  reqs_.push_back(std::move(r));
  const int64_t id = static_cast<int64_t>(reqs_.size()) - 1;
  if (!add_residual(dev_, id)) {
    reqs_.back() = Req();
    return -1;
  }
  return id;
}

bool ContiguousCache::append(int64_t req) {
  Req& r = const_cast<Req&>(at(req));
  if (r.len == r.max) return false;
  ++r.len;
  return true;
}

void ContiguousCache::release(int64_t req) {
  Req& r = const_cast<Req&>(at(req));
  r.buf = Buffer();
  r.live = false;
  r.len = 0;
  drop_residual(req);
}

uint8_t* ContiguousCache::entry(int64_t req, int64_t layer, int64_t pos) {
  const Req& r = at(req);
  MT_CHECK(pos >= 0 && pos < r.len && layer >= 0 && layer < shape_.layers, "kv cache: entry out of range");
  return r.buf.as<uint8_t>() + (layer * r.max + pos) * shape_.entry_bytes();
}

void ContiguousCache::runs_in(int64_t req, int64_t layer, int64_t from, int64_t to, const RunFn& fn) const {
  const Req& r = at(req);
  from = std::max<int64_t>(from, 0);
  to = std::min(to, r.len);
  if (from < to) fn(r.buf.as<uint8_t>() + (layer * r.max + from) * shape_.entry_bytes(), from, to - from);
}

int64_t ContiguousCache::reserved_bytes() const {
  int64_t n = 0;
  for (const Req& r : reqs_)
    if (r.live) n += r.max * shape_.token_bytes();
  return n + residual_reserved();
}

std::vector<int64_t> ContiguousCache::live_requests() const {
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < reqs_.size(); ++i)
    if (reqs_[i].live) out.push_back(static_cast<int64_t>(i));
  return out;
}

// ---- paged ----

PagedCache::PagedCache(Device& dev, const KvShape& s, int64_t block_tokens, int64_t num_blocks)
    : KvCache(s), dev_(dev), block_tokens_(block_tokens), num_blocks_(num_blocks) {
  MT_CHECK(block_tokens > 0 && num_blocks > 0 && num_blocks < (int64_t{1} << 31),
           "kv cache: block_tokens and num_blocks must be positive");
  pool_ = Buffer(dev.memory(), static_cast<std::size_t>(num_blocks * block_bytes()), Tag::kv);
  refs_.assign(static_cast<std::size_t>(num_blocks), 0);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));  // pops block 0 first
}

const PagedCache::Req& PagedCache::at(int64_t req) const {
  MT_CHECK(req >= 0 && req < static_cast<int64_t>(reqs_.size()) && reqs_[req].live,
           "kv cache: no live request " + std::to_string(req));
  return reqs_[req];
}

uint8_t* PagedCache::block_ptr(int32_t b, int64_t layer) const {
  if (b < 0) return host_pool_.as<uint8_t>() + static_cast<int64_t>(-1 - b) * block_bytes() + layer * slice_bytes();
  return pool_.as<uint8_t>() + b * block_bytes() + layer * slice_bytes();
}

void PagedCache::enable_offload(int64_t host_blocks, int64_t hot_blocks) {
  MT_CHECK(host_blocks > 0 && host_blocks < (int64_t{1} << 31) && hot_blocks > 0,
           "kv cache: offload needs host_blocks > 0 and hot_blocks > 0");
  MT_CHECK(reqs_.empty() && !offloading(), "kv cache: enable_offload before the first request, once");
  MT_CHECK(!shape_.kivi(), std::string("kv cache: ") + kv_type_name(shape_.type) +
                               " does not offload (a completing group rewrites records that may be cold)");
  host_blocks_ = host_blocks;
  hot_blocks_ = hot_blocks;
  host_pool_ = Buffer(dev_.host(), static_cast<std::size_t>(host_blocks * block_bytes()), Tag::kv);
  staging_ = Buffer(dev_.memory(), static_cast<std::size_t>(staging_bytes()), Tag::kv);
  host_refs_.assign(static_cast<std::size_t>(host_blocks), 0);
  staged_.assign(static_cast<std::size_t>(host_blocks), 0);
  for (int64_t h = host_blocks - 1; h >= 0; --h) host_free_.push_back(static_cast<int32_t>(h));
}

// The request's oldest device block to a host block; false when the host pool is full.
bool PagedCache::evict_oldest(Req& r) {
  if (host_free_.empty()) return false;
  const int32_t h = host_free_.back(), b = r.table[r.cold];
  host_free_.pop_back();
  host_refs_[h] = 1;
  dev_.copy(block_ptr(-1 - h, 0), block_ptr(b, 0), static_cast<std::size_t>(block_bytes()), CopyKind::device_to_host);
  traffic_.to_host += block_bytes();
  unref_block(b);
  r.table[r.cold++] = -1 - h;
  staged_layer_ = -1;  // the staging area no longer covers every cold block
  return true;
}

void PagedCache::stage(std::span<const int64_t> reqs, int64_t layer) {
  if (!offloading()) return;
  select_staged(reqs, layer);
  copy_staged(0, host_blocks_, false);
}

void PagedCache::select_staged(std::span<const int64_t> reqs, int64_t layer) {
  MT_CHECK(offloading(), "kv cache: select_staged() without offload");
  MT_CHECK(layer >= 0 && layer < shape_.layers, "kv cache: stage() of a layer out of range");
  std::fill(staged_.begin(), staged_.end(), 0);
  for (int64_t req : reqs) {
    const Req& r = at(req);
    for (int64_t i = 0; i < r.cold; ++i) staged_[-1 - r.table[i]] = 1;  // a block shared by forks: once
  }
  staged_layer_ = layer;
}

void PagedCache::copy_staged(int64_t from, int64_t to, bool overlapped) {
  MT_CHECK(offloading() && staged_layer_ >= 0 && 0 <= from && from <= to && to <= host_blocks_,
           "kv cache: copy_staged() of slots " + std::to_string(from) + ".." + std::to_string(to) +
               " (select_staged() first; " + std::to_string(host_blocks_) + " slots)");
  // One layer: a block is its slice, so consecutive host blocks are consecutive slices on both sides.
  const int64_t most = shape_.layers == 1 ? host_blocks_ : 1;
  for (int64_t h = from; h < to;) {
    if (!staged_[h]) {
      ++h;
      continue;
    }
    int64_t n = 1;
    while (n < most && h + n < to && staged_[h + n]) ++n;
    uint8_t* dst = staging_.as<uint8_t>() + h * slice_bytes();
    const uint8_t* src = block_ptr(static_cast<int32_t>(-1 - h), staged_layer_);
    const auto bytes = static_cast<std::size_t>(n * slice_bytes());
    if (overlapped)
      dev_.copy_async(dst, src, bytes, CopyKind::host_to_device);
    else
      dev_.copy(dst, src, bytes, CopyKind::host_to_device);
    traffic_.to_device += n * slice_bytes();
    h += n;
  }
}

int64_t PagedCache::staging_needed(int64_t req, int64_t from, int64_t to) const {
  const Req& r = at(req);
  int64_t need = 0;
  for (int64_t i = std::max<int64_t>(from, 0) / block_tokens_; i < r.cold && i * block_tokens_ < std::min(to, r.len); ++i)
    need = std::max<int64_t>(need, -r.table[i]);  // slot h = -1 - table[i], needing h + 1 slots
  return need;
}

int64_t PagedCache::add(int64_t max_tokens) {
  MT_CHECK(max_tokens > 0, "kv cache: a request needs max_tokens > 0");
  Req r;
  r.live = true;
  reqs_.push_back(std::move(r));
  const int64_t id = static_cast<int64_t>(reqs_.size()) - 1;
  if (!add_residual(dev_, id)) {
    reqs_.back().live = false;
    return -1;
  }
  return id;
}

bool PagedCache::append(int64_t req) {
  Req& r = const_cast<Req&>(at(req));
  const int64_t slot = r.len % block_tokens_;
  if (slot == 0) {  // a new block (offloading: the oldest device block moves to the host first)
    if (offloading() && static_cast<int64_t>(r.table.size()) - r.cold >= hot_blocks_ && !evict_oldest(r)) return false;
    if (free_.empty()) return false;
    const int32_t b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    r.table.push_back(b);
  } else if (refs_[r.table.back()] > 1) {  // copy on write: the last block is shared with a fork
    const int32_t b = copy_block(r.table.back(), slot);
    if (b < 0) return false;
    unref_block(r.table.back());  // still held by the fork
    r.table.back() = b;
  }
  ++r.len;
  return true;
}

int32_t PagedCache::copy_block(int32_t from, int64_t tokens) {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  for (int64_t l = 0; l < shape_.layers; ++l)
    dev_.copy(block_ptr(b, l), block_ptr(from, l), static_cast<std::size_t>(tokens * shape_.entry_bytes()), CopyKind::device_to_device);
  return b;
}

int64_t PagedCache::fork(int64_t req) {
  Req copy = at(req);
  // The KIVI types: completing the residual rewrites its tokens' records, so the blocks that hold any of its
  // positions are the fork's own copies from the start (-1 when the pool cannot give them).
  std::vector<int32_t> own;
  if (quantized_length(req) != copy.len) {
    for (int64_t i = quantized_length(req) / block_tokens_; i < static_cast<int64_t>(copy.table.size()); ++i) {
      const int32_t b = copy_block(copy.table[i], block_tokens_);
      if (b < 0) {
        for (int32_t o : own) unref_block(o);
        return -1;
      }
      own.push_back(b);
    }
  }
  const std::size_t shared = copy.table.size() - own.size();
  for (std::size_t i = 0; i < shared; ++i) ++(copy.table[i] >= 0 ? refs_[copy.table[i]] : host_refs_[-1 - copy.table[i]]);
  std::copy(own.begin(), own.end(), copy.table.begin() + static_cast<std::ptrdiff_t>(shared));
  reqs_.push_back(std::move(copy));
  const int64_t id = static_cast<int64_t>(reqs_.size()) - 1;
  if (!add_residual(dev_, id)) {
    release(id);
    return -1;
  }
  if (shape_.kivi())
    dev_.copy(residual_[id].as<uint8_t>(), residual_[req].as<uint8_t>(), static_cast<std::size_t>(shape_.residual_bytes()),
              CopyKind::device_to_device);
  return id;
}

void PagedCache::release(int64_t req) {
  Req& r = const_cast<Req&>(at(req));
  for (int32_t b : r.table) {
    if (b >= 0) unref_block(b);
    if (b < 0 && --host_refs_[-1 - b] == 0) host_free_.push_back(-1 - b);
  }
  r.table.clear();
  r.len = r.cold = 0;
  r.live = false;
  drop_residual(req);
}

uint8_t* PagedCache::entry(int64_t req, int64_t layer, int64_t pos) {
  const Req& r = at(req);
  MT_CHECK(pos >= 0 && pos < r.len && layer >= 0 && layer < shape_.layers, "kv cache: entry out of range");
  return block_ptr(r.table[pos / block_tokens_], layer) + (pos % block_tokens_) * shape_.entry_bytes();
}

void PagedCache::require_staged(std::span<const int64_t> reqs, int64_t layer) const {
  for (int64_t req : reqs) {
    const Req& r = at(req);
    for (int64_t i = 0; i < r.cold; ++i)
      MT_CHECK(staged_layer_ == layer && staged_[-1 - r.table[i]],
               "kv cache: layer " + std::to_string(layer) + " of request " + std::to_string(req) +
                   " has offloaded blocks that are not staged (call stage() before the kernels)");
  }
}

void PagedCache::runs_in(int64_t req, int64_t layer, int64_t from, int64_t to, const RunFn& fn) const {
  const Req& r = at(req);
  from = std::max<int64_t>(from, 0);
  to = std::min(to, r.len);
  for (int64_t i = from / block_tokens_; from < to && i * block_tokens_ < to; ++i) {
    const int64_t first = std::max(i * block_tokens_, from);
    const int32_t b = r.table[i];
    const uint8_t* p = nullptr;
    if (b >= 0) {
      p = block_ptr(b, layer);
    } else {
      if (staged_layer_ != layer || !staged_[-1 - b]) require_staged({&req, 1}, layer);  // throws
      p = staging_.as<uint8_t>() + static_cast<int64_t>(-1 - b) * slice_bytes();
    }
    fn(p + (first - i * block_tokens_) * shape_.entry_bytes(), first, std::min((i + 1) * block_tokens_, to) - first);
  }
}

int64_t PagedCache::reserved_bytes() const {
  return (num_blocks_ - static_cast<int64_t>(free_.size())) * block_bytes() + residual_reserved();
}

std::vector<int64_t> PagedCache::live_requests() const {
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < reqs_.size(); ++i)
    if (reqs_[i].live) out.push_back(static_cast<int64_t>(i));
  return out;
}

}  // namespace memtrade::kvcache
