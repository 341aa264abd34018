// The KV cache: head records of every storage type, the paged allocator's bookkeeping over long random
// sequences, copy on write, refusals, paged decode equal to contiguous decode bit for bit, the CUDA
// kernel's plan (token addresses and splits) and record slices, and the decoder's logits equal to the
// full-sequence forward's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <omp.h>
#include <random>
#include <set>
#include <span>
#include <tuple>

#include "datasets/random.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "impls/kvcache/decoder.hpp"
#include "impls/kvcache/record.hpp"
#include "impls/kvcache/serving.hpp"
#include "host_memory_devices.hpp"
#include "kv_fixtures.hpp"
#include "model/train.hpp"
#include "model_fixtures.hpp"
#include "simd_targets.hpp"
#include "test_util.hpp"

using namespace memtrade;
using namespace memtrade::kvcache;
using namespace memtrade::test::kv;

namespace {

// ||a - ref|| / ||ref|| in double.
double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double e = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    e += std::pow(static_cast<double>(a[i]) - ref[i], 2);
    n += std::pow(static_cast<double>(ref[i]), 2);
  }
  return std::sqrt(e / n);
}

// fn() must throw an Error whose message contains `what`.
template <class F>
void expect_error_naming(F&& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming \"" << what << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// The windows decoded (all rows at once) through an fp32 cache by a decoder with weights w; then
// fn(layer, record r of the entry: K of head r or V of head r - kv_heads, its head_dim values) for every
// record of every token.
template <class F>
void each_fp32_record(const model::Config& cfg, std::span<const float> w, const datasets::Batch& windows, F&& fn) {
  auto dev = make_cpu_device();
  ContiguousCache cache(*dev, KvShape{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32});
  Decoder d(*dev, cfg, w, cache);
  const int64_t B = windows.batch, T = windows.context;
  std::vector<int64_t> reqs;
  for (int64_t i = 0; i < B; ++i) reqs.push_back(cache.add(T));
  std::vector<float> z(static_cast<std::size_t>(B * cfg.vocab));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> tok;
    for (int64_t i = 0; i < B; ++i) tok.push_back(windows.inputs[i * T + t]);
    d.step(reqs, tok, z.data());
  }
  for (int64_t r : reqs)
    for (int64_t l = 0; l < cfg.layers; ++l)
      for (int64_t pos = 0; pos < T; ++pos)
        for (int64_t h = 0; h < 2 * cfg.kv_heads; ++h)
          fn(l, h, reinterpret_cast<const float*>(cache.entry(r, l, pos) + h * cache.shape().head_bytes()));
}

}  // namespace

TEST(KvRecords, QuantizedRecordsStayWithinHalfAStepAndEdgeCasesAreDefined) {
  const int64_t hd = 64;
  const auto x = normals(hd, 3, 5.f);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::abs(v));
  for (KvType t : kTypes) {
    const KvShape s{1, 1, hd, t};
    std::vector<uint8_t> rec(s.head_bytes());
    std::vector<float> y(hd);
    // fp8-e4m3-static: the scale calibration would give for this vector (amax / 448).
    const float ss = t == KvType::fp8_e4m3_static ? amax / 448.f : 1.f;
    encode_head(t, x.data(), hd, rec.data(), ss);
    decode_head(t, rec.data(), hd, y.data(), ss);
    for (int64_t i = 0; i < hd; ++i) {
      // fp32 exact; bf16/fp16 half an ulp (2^-9 / 2^-12 relative); int8 / int4 half a step amax/127 / 2
      // or amax/7 / 2; q8_0 half a step of its block (d = block amax / 127) plus the fp16 rounding of d
      // (127 codes x 2^-11 d); q4_0 a whole step d = block amax / 8 (the element opposite the block's max
      // clips to code 15: 7 d for 8 d) plus 8 x 2^-11 d;
      // fp8-e4m3 half an ulp of a 3-bit mantissa (2^-4 relative) or half the subnormal step; fp8-e5m2 (no
      // scale) half an ulp of a 2-bit mantissa (2^-3 relative) or half its subnormal step 2^-16.
      const double err = std::abs(static_cast<double>(y[i]) - x[i]);
      double block_amax = 0;
      for (int64_t k = i / 32 * 32; k < i / 32 * 32 + 32; ++k) block_amax = std::max(block_amax, std::abs(static_cast<double>(x[k])));
      const double bound = t == KvType::f32    ? 0
                           : t == KvType::q8_0 ? block_amax / 127 * (0.5 + 127 * std::ldexp(1.0, -11)) * (1 + 1e-6)
                           : t == KvType::q4_0 ? block_amax / 8 * (1 + 8 * std::ldexp(1.0, -11)) * (1 + 1e-6)
                           : t == KvType::fp8_e5m2 ? std::ldexp(std::abs(x[i]), -3) + std::ldexp(1.0, -17)
                           : t == KvType::bf16 ? std::ldexp(std::abs(x[i]), -8)
                           : t == KvType::f16  ? std::ldexp(std::abs(x[i]), -11)
                           : t == KvType::int8 ? amax / 127.0 / 2 * (1 + 1e-6)
                           : t == KvType::int4 || t == KvType::int4_smooth ? amax / 7.0 / 2 * (1 + 1e-6)
                                               : std::ldexp(std::abs(x[i]), -4) + std::ldexp(amax / 448.0, -9);
      EXPECT_LE(err, bound) << kv_type_name(t) << " element " << i;
    }
    const std::vector<float> zeros(hd, 0.f);
    encode_head(t, zeros.data(), hd, rec.data(), ss);
    decode_head(t, rec.data(), hd, y.data(), ss);
    for (float v : y) EXPECT_EQ(v, 0.f) << kv_type_name(t);
    if (t == KvType::fp8_e5m2) {  // element by element: NaN stays NaN, Inf saturates to the largest finite value
      auto bad = x;
      bad[5] = NAN;
      bad[6] = -std::numeric_limits<float>::infinity();
      bad[7] = 1e6f;
      encode_head(t, bad.data(), hd, rec.data());
      decode_head(t, rec.data(), hd, y.data());
      EXPECT_TRUE(std::isnan(y[5]));
      EXPECT_EQ(y[6], -57344.f);
      EXPECT_EQ(y[7], 57344.f);
      EXPECT_TRUE(std::isfinite(y[4]));
    }
    if (t == KvType::fp8_e4m3_static) {  // element by element: NaN stays NaN, beyond the range saturates
      auto bad = x;
      bad[5] = NAN;
      bad[6] = std::numeric_limits<float>::infinity();
      bad[7] = -1000 * amax;
      encode_head(t, bad.data(), hd, rec.data(), ss);
      decode_head(t, rec.data(), hd, y.data(), ss);
      EXPECT_TRUE(std::isnan(y[5]));
      EXPECT_EQ(y[6], 448.f * ss);
      EXPECT_EQ(y[7], -448.f * ss);
      EXPECT_EQ(y[4], [&] {
        std::vector<float> z(hd);
        encode_head(t, x.data(), hd, rec.data(), ss);
        decode_head(t, rec.data(), hd, z.data(), ss);
        return z[4];
      }());
    }
    if (t == KvType::int8 || t == KvType::fp8_e4m3 || t == KvType::int4 || t == KvType::int4_smooth) {
      auto bad = x;
      bad[5] = NAN;
      encode_head(t, bad.data(), hd, rec.data());
      decode_head(t, rec.data(), hd, y.data());
      for (float v : y) EXPECT_TRUE(std::isnan(v)) << kv_type_name(t) << ": a NaN input makes the whole record NaN";
      bad[5] = std::numeric_limits<float>::infinity();
      encode_head(t, bad.data(), hd, rec.data());
      decode_head(t, rec.data(), hd, y.data());
      EXPECT_TRUE(std::isnan(y[0])) << kv_type_name(t);
    }
    if (t == KvType::q8_0 || t == KvType::q4_0) {  // a NaN or Inf makes its block of 32 NaN, not the record
      for (const float b : {NAN, std::numeric_limits<float>::infinity()}) {
        auto bad = x;
        bad[40] = b;
        encode_head(t, bad.data(), hd, rec.data());
        decode_head(t, rec.data(), hd, y.data());
        for (int64_t i = 0; i < hd; ++i) {
          if (i >= 32) EXPECT_TRUE(std::isnan(y[i])) << kv_type_name(t) << " element " << i;
          else EXPECT_TRUE(std::isfinite(y[i])) << kv_type_name(t) << " element " << i;
        }
      }
    }
  }
  EXPECT_EQ((KvShape{30, 3, 64, KvType::int8}).token_bytes() * 2 - 30 * 2 * 3 * 4 * 2,
            (KvShape{30, 3, 64, KvType::bf16}).token_bytes());  // half of bf16 plus the scales
  EXPECT_EQ((KvShape{30, 3, 64, KvType::int4}).token_bytes(), 30 * 2 * 3 * (32 + 4));  // a byte per two values
  EXPECT_EQ((KvShape{30, 3, 64, KvType::q8_0}).token_bytes(), 30 * 2 * 3 * (64 + 2 * 2));  // an fp16 scale per 32
  EXPECT_EQ((KvShape{30, 3, 64, KvType::q4_0}).token_bytes(), 30 * 2 * 3 * (32 + 2 * 2));
  EXPECT_THROW(ContiguousCache(*make_cpu_device(), KvShape{1, 1, 48, KvType::q4_0}), Error);  // not blocks of 32
  EXPECT_THROW(ContiguousCache(*make_cpu_device(), KvShape{1, 1, 7, KvType::int4}), Error);  // odd head_dim
  EXPECT_EQ((KvShape{30, 3, 64, KvType::fp8_e4m3_static}).token_bytes() * 2,
            (KvShape{30, 3, 64, KvType::bf16}).token_bytes());  // exactly half: the scales live in the shape
  EXPECT_EQ((KvShape{30, 3, 64, KvType::fp8_e5m2}).token_bytes() * 2, (KvShape{30, 3, 64, KvType::bf16}).token_bytes());
}

TEST(KvRecords, Q8_0AndQ4_0EqualGgmlsBlocksBitForBit) {
  // tests/gguf/kv_blocks.py: blocks of 32 values and the gguf package's Q8_0 / Q4_0 quantize + dequantize
  // of them (ggml's reference quantizers); memtrade's records of the same values decode to the same bits.
  const auto dir = test::scratch_dir() / "kv_blocks";
  const std::string cmd = "python3 " MEMTRADE_SOURCE_DIR "/tests/gguf/kv_blocks.py '" + dir.string() + "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "python3 with the gguf package is needed (python3 -m pip install gguf)";
  auto read = [&](const char* name) {
    std::ifstream in(dir / name, std::ios::binary);
    std::vector<float> v(std::filesystem::file_size(dir / name) / 4);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    return v;
  };
  const auto x = read("x.f32");
  ASSERT_GT(x.size(), 0u);
  ASSERT_EQ(x.size() % 64, 0u);  // records of 64 values: two blocks each
  for (const auto& [t, file] : {std::pair{KvType::q8_0, "q8_0.f32"}, std::pair{KvType::q4_0, "q4_0.f32"}}) {
    const auto want = read(file);
    ASSERT_EQ(want.size(), x.size());
    const int64_t hd = 64;
    std::vector<uint8_t> rec(static_cast<std::size_t>(KvShape{1, 1, hd, t}.head_bytes()));
    std::vector<float> y(hd);
    int64_t differ = 0;
    for (std::size_t r = 0; r < x.size(); r += hd) {
      encode_head(t, x.data() + r, hd, rec.data());
      decode_head(t, rec.data(), hd, y.data());
      for (int64_t i = 0; i < hd; ++i)
        if (detail::float_as_bits(y[i]) != detail::float_as_bits(want[r + i]) && ++differ <= 5)
          ADD_FAILURE() << kv_type_name(t) << " value " << r + i << ": " << x[r + i] << " -> " << y[i] << ", ggml "
                        << want[r + i];
    }
    EXPECT_EQ(differ, 0) << kv_type_name(t);
  }
}

// The KIVI types: a request's tokens as stored, against the fp16 values of what was written. Keys per channel
// over each complete group of 32 tokens, values per token over blocks of 32 channels: within half a step
// (the fp16 step's rounding adds at most top x 2^-11 of a step at the top of the range), the step being the
// range / top of that channel's group (K) or of that block (V), top = 15 (int4-kivi) or 3 (int2-kivi); the
// incomplete group's tokens equal to fp16.
namespace {
struct KiviInputs {
  std::vector<std::vector<float>> k, v;  // per position: [kv_heads][head_dim]
};
KiviInputs kivi_inputs(const KvShape& s, int64_t len, uint64_t seed, int64_t outlier_channel = -1) {
  KiviInputs in;
  for (int64_t p = 0; p < len; ++p) {
    in.k.push_back(normals(s.kv_heads * s.head_dim, seed * 7919 + static_cast<uint64_t>(2 * p)));
    in.v.push_back(normals(s.kv_heads * s.head_dim, seed * 7919 + static_cast<uint64_t>(2 * p + 1)));
    if (outlier_channel >= 0)
      for (int64_t h = 0; h < s.kv_heads; ++h) in.k.back()[h * s.head_dim + outlier_channel] *= 100.f;
  }
  return in;
}
float f16r(float x) { return to_float(to_f16(x)); }
}  // namespace

TEST(KvKivi, KeysPerChannelAndValuesPerTokenWithinHalfAStepAndTheResidualInFp16) {
  for (const KvType type : {KvType::int4_kivi, KvType::int2_kivi})
  for (const int64_t R : {int64_t{32}, int64_t{128}}) {  // KIVI's residual length: one group, or four
    SCOPED_TRACE(std::string(kv_type_name(type)) + " R=" + std::to_string(R));
    auto dev = make_cpu_device();
    KvShape s{2, 2, 64, type};
    s.residual = R;
    const int bits = type == KvType::int2_kivi ? 2 : 4;
    const double top = (1 << bits) - 1;
    EXPECT_EQ(s.head_bytes(), 64 * bits / 8 + 64 / 8);  // the codes, then two (s, m) fp16 pairs
    const int64_t len = 3 * R - 21;                     // two residuals quantized, R - 21 tokens in the third
    const KiviInputs in = kivi_inputs(s, len, 3);
    ContiguousCache c(*dev, s);
    PagedCache pc(*dev, s, 16, (len + 15) / 16);
    const int64_t r = c.add(len), pcr = pc.add(len);
    for (int64_t p = 0; p < len; ++p) {
      ASSERT_TRUE(c.append(r));
      ASSERT_TRUE(pc.append(pcr));
      for (int64_t l = 0; l < s.layers; ++l) {
        c.write_token(r, l, p, in.k[p].data(), in.v[p].data());
        pc.write_token(pcr, l, p, in.k[p].data(), in.v[p].data());
      }
      ASSERT_EQ(c.quantized_length(r), (p + 1) / R * R) << "a residual is quantized when its R tokens are in";
    }
    EXPECT_EQ(c.quantized_length(r), 2 * R);
    const int64_t n = s.kv_heads * s.head_dim;
    std::vector<float> k(n), v(n);
    double worst_k = 0, worst_v = 0;
    for (int64_t l = 0; l < s.layers; ++l)
      for (int64_t p = 0; p < len; ++p) {
        c.read_token(r, l, p, k.data(), v.data());
        for (int64_t i = 0; i < n; ++i) {
          if (p >= 2 * R) {  // the residual: fp16 of the input
            ASSERT_EQ(k[i], f16r(in.k[p][i])) << p << " " << i;
            ASSERT_EQ(v[i], f16r(in.v[p][i])) << p << " " << i;
            continue;
          }
          float klo = INFINITY, khi = -INFINITY, vlo = INFINITY, vhi = -INFINITY;
          for (int64_t j = p / 32 * 32; j < p / 32 * 32 + 32; ++j) {  // channel i over the group
            klo = std::min(klo, f16r(in.k[j][i]));
            khi = std::max(khi, f16r(in.k[j][i]));
          }
          for (int64_t e = i / 32 * 32; e < i / 32 * 32 + 32; ++e) {  // element i's block of the token
            vlo = std::min(vlo, f16r(in.v[p][e]));
            vhi = std::max(vhi, f16r(in.v[p][e]));
          }
          const double sk = (khi - klo) / top, sv = (vhi - vlo) / top;
          const double ek = std::fabs(k[i] - f16r(in.k[p][i])), ev = std::fabs(v[i] - f16r(in.v[p][i]));
          ASSERT_LE(ek, sk * (0.5 + top * 0x1p-11) + 1e-6) << "key, position " << p << " element " << i;
          ASSERT_LE(ev, sv * (0.5 + top * 0x1p-11) + 1e-6) << "value, position " << p << " element " << i;
          worst_k = std::max(worst_k, ek / sk);
          worst_v = std::max(worst_v, ev / sv);
        }
      }
    EXPECT_GT(worst_k, 0.3);  // the codes are used: errors reach near half a step
    EXPECT_GT(worst_v, 0.3);
    // The kernel at head_dim 64 (two pairs per record; the other kernel tests take 32, one pair) against the
    // float64 kernel over the same stored values, on every SIMD target; splits of 32 and 48 tokens (one that
    // cuts the residual and the groups elsewhere than their edges), and the paged cache's output bit for bit
    // the contiguous one's.
    test::for_each_simd_target([&](int64_t) {
      const int64_t heads = 6;
      const auto q = normals(heads * s.head_dim, 12);
      std::vector<float> o(q.size()), po(q.size());
      std::vector<double> ref(q.size());
      for (int64_t l = 0; l < s.layers; ++l)
        for (const int64_t split : {int64_t{32}, int64_t{48}}) {
          decode_attention(c, std::vector<int64_t>{r}, l, q.data(), heads, o.data(), split);
          decode_attention(pc, std::vector<int64_t>{pcr}, l, q.data(), heads, po.data(), split);
          decode_attention_ref(c, r, l, q.data(), heads, ref.data());
          EXPECT_LE(error_stats(std::vector<double>(o.begin(), o.end()), ref).rel_l2,
                    2.0 * (s.head_dim + len + 8) * std::ldexp(1.0, -24))
              << "layer " << l << " split " << split;
          EXPECT_EQ(std::memcmp(o.data(), po.data(), o.size() * 4), 0) << "layer " << l << " split " << split;
        }
    });
    // A write out of order, record-by-record encoding, offload and a head size that is not a multiple of 32
    // are refused.
    EXPECT_THROW(c.write_token(r, 0, 10, in.k[0].data(), in.v[0].data()), Error);
    std::vector<uint8_t> rec(static_cast<std::size_t>(s.head_bytes()));
    EXPECT_THROW(encode_head(type, in.k[0].data(), 64, rec.data()), Error);
    EXPECT_THROW(decode_head(type, rec.data(), 64, k.data()), Error);
    PagedCache p(*dev, s, 16, 8);
    EXPECT_THROW(p.enable_offload(4, 1), Error);
    EXPECT_THROW((ContiguousCache{*dev, KvShape{1, 1, 48, type}}), Error);
    const int64_t pr = p.add(40);
    ASSERT_TRUE(p.append(pr));
    p.write_token(pr, 0, 0, in.k[0].data(), in.v[0].data());
    p.write_token(pr, 1, 0, in.k[0].data(), in.v[0].data());
    // The CUDA plan: splits of whole groups, each request's residual at the layer and its tokens in records.
    expect_error_naming([&] { plan_decode(p, std::vector<int64_t>{pr}, 0, 4, 48); }, "multiple of its groups' 32 tokens");
    const DecodePlan plan = plan_decode(p, std::vector<int64_t>{pr}, 1, 4);
    ASSERT_EQ(plan.residual.size(), 1u);
    EXPECT_EQ(plan.residual[0], reinterpret_cast<uint64_t>(p.residual(pr, 1)));
    EXPECT_EQ(plan.quantized, std::vector<int32_t>{0});
    EXPECT_EQ(plan.residual_entry_bytes, 2 * s.kv_heads * s.head_dim * 2);
    // The residual is the request's and is counted: R tokens of fp16 K and V at every layer.
    EXPECT_EQ(s.residual_bytes(), s.layers * R * 2 * s.kv_heads * s.head_dim * 2);
    EXPECT_EQ(c.reserved_bytes(), len * s.token_bytes() + s.residual_bytes());
    EXPECT_EQ(p.reserved_bytes(), p.block_bytes() + s.residual_bytes());
    EXPECT_EQ(static_cast<int64_t>(dev->memory().by_tag(Tag::kv).live),
              c.reserved_bytes() + p.num_blocks() * p.block_bytes() + s.residual_bytes() +
                  pc.num_blocks() * pc.block_bytes() + s.residual_bytes());  // the whole pools are held
    c.release(r);
    EXPECT_EQ(c.reserved_bytes(), 0);
  }
  // R is a positive multiple of the 32-token key group, and only the KIVI types keep one.
  for (const int64_t R : {int64_t{0}, int64_t{48}, int64_t{-32}}) {
    KvShape bad{1, 1, 64, KvType::int4_kivi};
    bad.residual = R;
    EXPECT_THROW(bad.validate(), Error) << R;
  }
  KvShape int8{1, 1, 64, KvType::int8};
  int8.residual = 64;
  EXPECT_THROW(int8.validate(), Error);
}

TEST(KvKivi, AKeyOutlierChannelSetsOnlyItsOwnStepAndNonFiniteInputsStayInTheirChannelOrBlock) {
  // One key channel 100x the others (SmolLM2's keys have such channels): per-token int4 spends its step on
  // it, KIVI's per-channel steps keep the other channels' error where it was.
  auto dev = make_cpu_device();
  const KvShape s{1, 1, 64, KvType::int4_kivi};
  const int64_t len = 64, outlier = 5;
  auto other_channels_error = [&](const KiviInputs& in, KvType t) {
    KvShape st = s;
    st.type = t;
    ContiguousCache c(*dev, st);
    const int64_t r = c.add(len);
    double e = 0;
    for (int64_t p = 0; p < len; ++p) {
      EXPECT_TRUE(c.append(r));
      c.write_token(r, 0, p, in.k[p].data(), in.v[p].data());
    }
    std::vector<float> k(64), v(64);
    for (int64_t p = 0; p < len; ++p) {
      c.read_token(r, 0, p, k.data(), v.data());
      for (int64_t i = 0; i < 64; ++i)
        if (i != outlier) e = std::max(e, static_cast<double>(std::fabs(k[i] - in.k[p][i])));
    }
    return e;
  };
  const KiviInputs plain = kivi_inputs(s, len, 5), spiked = kivi_inputs(s, len, 5, outlier);
  const double kivi_plain = other_channels_error(plain, KvType::int4_kivi), kivi_spiked = other_channels_error(spiked, KvType::int4_kivi);
  const double int4_spiked = other_channels_error(spiked, KvType::int4);
  EXPECT_EQ(kivi_spiked, kivi_plain) << "the other channels' steps do not see the outlier";
  EXPECT_GT(int4_spiked, 10 * kivi_spiked) << "per-token int4: the outlier sets every channel's step";

  // A NaN in key channel 9 of one token: that channel is NaN over its group, every other value finite; a NaN
  // in a value: that token's block of 32 is NaN. The other group is untouched.
  KiviInputs bad = kivi_inputs(s, len, 6);
  bad.k[40][9] = NAN;
  bad.v[50][33] = INFINITY;
  ContiguousCache c(*dev, s);
  const int64_t r = c.add(len);
  for (int64_t p = 0; p < len; ++p) {
    ASSERT_TRUE(c.append(r));
    c.write_token(r, 0, p, bad.k[p].data(), bad.v[p].data());
  }
  std::vector<float> k(64), v(64);
  for (int64_t p = 0; p < len; ++p) {
    c.read_token(r, 0, p, k.data(), v.data());
    for (int64_t i = 0; i < 64; ++i) {
      EXPECT_EQ(std::isnan(k[i]), p >= 32 && i == 9) << p << " " << i;
      EXPECT_EQ(std::isfinite(v[i]), !(p == 50 && i >= 32)) << p << " " << i;
    }
  }
}

TEST(KvKivi, AForkInsideAGroupKeepsEachRequestsOwnTokens) {
  // Blocks of 5 tokens (a group spans seven of them); request a of 40 tokens (8 in its residual at R = 32,
  // all 40 at R = 64) is forked, then both grow to 70 with tokens of their own: each reads back what a
  // contiguous cache holding its own tokens reads, bit for bit, and no block leaks.
  for (const int64_t R : {int64_t{32}, int64_t{64}}) {
  SCOPED_TRACE("R=" + std::to_string(R));
  auto dev = make_cpu_device();
  KvShape s{2, 2, 32, KvType::int4_kivi};
  s.residual = R;
  PagedCache p(*dev, s, 5, 100);
  ContiguousCache ca(*dev, s), cf(*dev, s);
  const KiviInputs a = kivi_inputs(s, 70, 1), f = kivi_inputs(s, 70, 2);
  const int64_t ra = p.add(70), rca = ca.add(70), rcf = cf.add(70);
  auto put = [&](KvCache& c, int64_t r, const KiviInputs& in, int64_t pos) {
    ASSERT_TRUE(c.append(r));
    for (int64_t l = 0; l < s.layers; ++l) c.write_token(r, l, pos, in.k[pos].data(), in.v[pos].data());
  };
  for (int64_t t = 0; t < 40; ++t) {
    put(p, ra, a, t);
    put(ca, rca, a, t);
    put(cf, rcf, a, t);  // the fork's prefix is a's
  }
  const int64_t free_before = p.free_blocks();
  const int64_t rf = p.fork(ra);
  ASSERT_GE(rf, 0);
  EXPECT_EQ(free_before - p.free_blocks(), R == 32 ? 2 : 8)
      << "the blocks holding the residual's positions (32..39, or 0..39) are the fork's own copies";
  for (int64_t t = 40; t < 70; ++t) {
    put(p, ra, a, t);
    put(ca, rca, a, t);
    put(p, rf, f, t);
    put(cf, rcf, f, t);
  }
  const int64_t n = s.kv_heads * s.head_dim;
  std::vector<float> k1(n), v1(n), k2(n), v2(n);
  for (int64_t l = 0; l < s.layers; ++l)
    for (int64_t t = 0; t < 70; ++t) {
      p.read_token(ra, l, t, k1.data(), v1.data());
      ca.read_token(rca, l, t, k2.data(), v2.data());
      ASSERT_EQ(std::memcmp(k1.data(), k2.data(), n * 4), 0) << "a, position " << t;
      ASSERT_EQ(std::memcmp(v1.data(), v2.data(), n * 4), 0) << "a, position " << t;
      p.read_token(rf, l, t, k1.data(), v1.data());
      cf.read_token(rcf, l, t, k2.data(), v2.data());
      ASSERT_EQ(std::memcmp(k1.data(), k2.data(), n * 4), 0) << "fork, position " << t;
      ASSERT_EQ(std::memcmp(v1.data(), v2.data(), n * 4), 0) << "fork, position " << t;
    }
  p.release(ra);
  p.release(rf);
  EXPECT_EQ(p.free_blocks(), p.num_blocks());
  EXPECT_EQ(p.reserved_bytes(), 0);
  }
}

TEST(PagedCache, RandomOperationsNeverLeakOrDoubleFreeBlocks) {
  auto dev = make_cpu_device();
  const KvShape s{2, 1, 4, KvType::f32};
  PagedCache c(*dev, s, 4, 64);
  std::mt19937_64 rng(5);
  std::vector<int64_t> live;
  int64_t refusals = 0;
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 2 || live.empty()) {
      live.push_back(c.add(1000));
    } else if (op < 7) {
      const int64_t r = live[rng() % live.size()];
      if (c.append(r)) write_token(c, r, c.length(r) - 1, static_cast<uint64_t>(r));
      else ++refusals;
    } else if (op < 8) {
      const int64_t r = live[rng() % live.size()];
      if (c.length(r) > 0) live.push_back(c.fork(r));
    } else {
      const std::size_t i = rng() % live.size();
      c.release(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // Bookkeeping: every block in use is referenced exactly refcount times by the live tables, and
    // blocks in use plus free blocks make the pool.
    std::map<int32_t, int32_t> refs;
    for (int64_t r : live) {
      EXPECT_EQ(static_cast<int64_t>(c.table(r).size()), (c.length(r) + 3) / 4);
      for (int32_t b : c.table(r)) ++refs[b];
    }
    for (const auto& [b, n] : refs) ASSERT_EQ(c.refcount(b), n) << "block " << b << " at step " << step;
    ASSERT_EQ(static_cast<int64_t>(refs.size()) + c.free_blocks(), c.num_blocks()) << "at step " << step;
  }
  EXPECT_GT(refusals, 0) << "the pool never ran out: the test does not reach the refusal path";
  for (int64_t r : live) c.release(r);
  EXPECT_EQ(c.free_blocks(), c.num_blocks());
  EXPECT_EQ(c.reserved_bytes(), 0);
}

TEST(PagedCache, CopyOnWriteLeavesTheOtherRequestUntouched) {
  auto dev = make_cpu_device();
  const KvShape s{2, 2, 8, KvType::bf16};
  PagedCache c(*dev, s, 4, 8);
  const int64_t a = c.add(16);
  for (int64_t t = 0; t < 6; ++t) {
    ASSERT_TRUE(c.append(a));
    write_token(c, a, t, 1);
  }
  const int64_t f = c.fork(a);
  EXPECT_EQ(c.table(f), c.table(a));
  std::vector<uint8_t> before(c.entry(a, 1, 5), c.entry(a, 1, 5) + s.entry_bytes());
  ASSERT_TRUE(c.append(f));  // into the shared second block: copied first
  EXPECT_NE(c.table(f)[1], c.table(a)[1]);
  EXPECT_EQ(c.table(f)[0], c.table(a)[0]);  // the full first block stays shared
  write_token(c, f, 6, 2);
  ASSERT_TRUE(c.append(a));
  write_token(c, a, 6, 3);
  EXPECT_EQ(std::memcmp(before.data(), c.entry(a, 1, 5), s.entry_bytes()), 0);
  EXPECT_EQ(std::memcmp(c.entry(f, 1, 5), c.entry(a, 1, 5), s.entry_bytes()), 0);  // the copied prefix
  EXPECT_NE(std::memcmp(c.entry(f, 1, 6), c.entry(a, 1, 6), s.entry_bytes()), 0);  // their own tokens
}

// write_tokens on a device cache, each request whole (encoded on the host and copied), stores the bytes a host
// cache holds after writing in place: every storage type, both layouts, two layers, KIVI residuals of 32 and
// 64 tokens with requests that end inside and at the edge of a residual. Whole requests take one copy per run
// of adjacent entries: one per request in the contiguous cache, at most one per block in the paged one (not
// one per token); the KIVI types one more per residual (its slots). KiviRunsStore... below covers shorter runs.
TEST(KvCache, WriteTokenThroughCopiesStoresWhatAHostCacheHolds) {
  auto cpu = make_cpu_device();
  test::HostBehindCopies far;
  for (const int64_t hd : {32, 40, 64})
    for (KvType t : kCacheTypes) {
      if (!takes(t, hd)) continue;
      KvShape s{2, 2, hd, t};
      random_static_scales(s, 3);
      if (is_kivi(t) && hd == 64) s.residual = 64;
      const int64_t copies_before = far.copies();
      const TwoLayouts a = two_layouts(*cpu, s, 3, 128, 7), b = two_layouts(far, s, 3, 128, 7);
      const std::string what = std::string(kv_type_name(t)) + " head_dim " + std::to_string(hd);
      int64_t bound = 0;  // copies per layer over both layouts
      for (const int64_t n : b.len)
        bound += s.kivi() ? 4 * (n / s.residual + 1) + (n + 15) / 16  // per residual: slots, entries (contiguous);
                                                                        // slots (paged); and the blocks
                          : 1 + (n + 15) / 16;
      EXPECT_LE(far.copies() - copies_before, s.layers * bound) << what;
      for (const bool paged : {false, true})
        for (std::size_t r = 0; r < a.len.size(); ++r)
          for (int64_t l = 0; l < s.layers; ++l) {
            const KvCache& ca = paged ? static_cast<const KvCache&>(*a.p) : *a.c;
            const KvCache& cb = paged ? static_cast<const KvCache&>(*b.p) : *b.c;
            const int64_t ra = paged ? a.rp[r] : a.rc[r], rb = paged ? b.rp[r] : b.rc[r];
            for (int64_t pos = 0; pos < a.len[r]; ++pos) {
              const uint8_t *ea = nullptr, *eb = nullptr;
              ca.runs_in(ra, l, pos, pos + 1, [&](const uint8_t* e, int64_t, int64_t) { ea = e; });
              cb.runs_in(rb, l, pos, pos + 1, [&](const uint8_t* e, int64_t, int64_t) { eb = e; });
              ASSERT_EQ(std::memcmp(ea, eb, static_cast<std::size_t>(s.entry_bytes())), 0)
                  << what << (paged ? " paged" : " contiguous") << " request " << r << " layer " << l << " token " << pos;
            }
            if (s.kivi()) {  // the residual's tokens not yet quantized
              ASSERT_EQ(std::memcmp(ca.residual(ra, l), cb.residual(rb, l),
                                    static_cast<std::size_t>((a.len[r] % s.residual) * s.residual_entry_bytes())),
                        0)
                  << what << " request " << r << " layer " << l << ": residual";
            }
          }
    }
  EXPECT_GT(far.copies(), 0);
}

// write_token and write_tokens on a device cache (through copies) store what they store in place on the CPU:
// one token, then a run of three adjacent entries in one copy; a range past the request is an error naming it.
TEST(KvCache, WriteTokensCopiesARunOnceAndARangePastTheRequestIsAnError) {
  auto cpu = make_cpu_device();
  test::HostBehindCopies far;
  const KvShape s{1, 2, 16, KvType::int8};
  kvcache::ContiguousCache host(*cpu, s), dev(far, s);
  const int64_t rh = host.add(8), rd = dev.add(8);
  const auto k = normals(4 * 2 * 16, 5), v = normals(4 * 2 * 16, 6);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(host.append(rh) && dev.append(rd));
  const std::string msg = test::error_of([&] { dev.write_tokens(rd, 0, 2, 3, k.data(), v.data()); });
  EXPECT_NE(msg.find("[2, 5)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 tokens"), std::string::npos) << msg;
  const int64_t before = far.copies();
  dev.write_token(rd, 0, 0, k.data(), v.data());
  dev.write_tokens(rd, 0, 1, 3, k.data() + 32, v.data() + 32);
  EXPECT_EQ(far.copies() - before, 2) << "one token, then three adjacent entries in one copy";
  host.write_tokens(rh, 0, 0, 4, k.data(), v.data());
  EXPECT_EQ(std::memcmp(host.entry(rh, 0, 0), dev.entry(rd, 0, 0), static_cast<std::size_t>(4 * s.entry_bytes())), 0);
}

// The KIVI types written in runs of any length that end at the request's last token (runs inside a residual,
// crossing one or more residual edges, ending at one) store what writing each token as it is appended stores,
// in place and through a device's copies, in both layouts. A device cache takes, per layer and per piece of a
// run within one residual, one copy of its residual slots and one of its zeroed records or, where the piece
// completes the residual, one of the residual's records (a contiguous request: one run), after reading back the
// slots written before the piece. A run that does not end at the request's last token is an error.
TEST(KvCache, KiviRunsStoreWhatTokenByTokenWritesStore) {
  auto cpu = make_cpu_device();
  test::HostBehindCopies far;
  const std::vector<int64_t> runs = {1, 5, 26, 40, 1, 63, 64, 3, 97, 20};  // 320 tokens
  for (KvType t : {KvType::int4_kivi, KvType::int2_kivi})
    for (const int64_t R : {32, 64}) {
      KvShape s{2, 2, 64, t};
      s.residual = R;
      const std::string what = std::string(kv_type_name(t)) + " residual " + std::to_string(R);
      PagedCache one(*cpu, s, 16, 32), host(*cpu, s, 16, 32), paged(far, s, 16, 32);
      ContiguousCache cont(far, s);
      const int64_t r1 = one.add(400), rh = host.add(400), rp = paged.add(400), rc = cont.add(400);
      int64_t pos = 0;
      for (const int64_t n : runs) {
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(one.append(r1) && host.append(rh) && paged.append(rp) && cont.append(rc));
          write_token(one, r1, pos + i, 7);
        }
        write_tokens(host, rh, pos, n, 7);
        write_tokens(paged, rp, pos, n, 7);
        int64_t want = 0;  // the contiguous cache's copies
        for (int64_t a = pos; a < pos + n;) {
          const int64_t s0 = a % R, m = std::min(R - s0, pos + n - a);
          want += 2 + (s0 + m == R && s0 > 0 ? 1 : 0);
          a += m;
        }
        const int64_t before = far.copies();
        write_tokens(cont, rc, pos, n, 7);
        EXPECT_EQ(far.copies() - before, s.layers * want) << what << " run of " << n << " from " << pos;
        pos += n;
        const std::tuple<KvCache*, int64_t, const char*> written[] = {
            {&host, rh, "paged in place"}, {&paged, rp, "paged through copies"}, {&cont, rc, "contiguous through copies"}};
        for (int64_t l = 0; l < s.layers; ++l)
          for (const auto& [c, r, name] : written) {
            const std::string where = what + " " + name + " layer " + std::to_string(l) + " after " +
                                      std::to_string(pos) + " tokens";
            for (int64_t p = 0; p < pos; ++p)
              ASSERT_EQ(std::memcmp(one.entry(r1, l, p), c->entry(r, l, p), static_cast<std::size_t>(s.entry_bytes())), 0)
                  << where << ": token " << p;
            ASSERT_EQ(std::memcmp(one.residual(r1, l), c->residual(r, l),
                                  static_cast<std::size_t>((pos % R) * s.residual_entry_bytes())),
                      0)
                << where << ": residual";
          }
      }
      ASSERT_TRUE(cont.append(rc) && cont.append(rc));
      const std::string msg = test::error_of([&] { write_tokens(cont, rc, pos, 1, 7); });
      EXPECT_NE(msg.find("ending at the request's last"), std::string::npos) << msg;
    }
}

TEST(KvCache, RunningOutIsARefusalNotACrash) {
  auto dev = make_cpu_device();
  const KvShape s{1, 1, 4, KvType::f32};
  PagedCache p(*dev, s, 2, 2);
  const int64_t r = p.add(100);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(p.append(r));
  EXPECT_FALSE(p.append(r));
  EXPECT_EQ(p.length(r), 4);
  dev->memory().set_capacity(dev->memory().total().live + 3 * s.token_bytes());
  ContiguousCache c(*dev, s);
  EXPECT_GE(c.add(3), 0);
  EXPECT_EQ(c.add(3), -1);  // no room left in the pool
  EXPECT_THROW(c.entry(7, 0, 0), Error);
}

TEST(DecodeAttention, PagedEqualsContiguousBitForBitOverRandomBlockTables) {
  auto dev = make_cpu_device();
  for (const int64_t hd : {32, 20})  // 20: the in-order dot of head sizes that are not a multiple of 16
  for (KvType t : kCacheTypes) {
    if (!takes(t, hd)) continue;
    KvShape s{2, 2, hd, t};
    random_static_scales(s, 4);
    const int64_t heads = 6, B = 5;
    const TwoLayouts x = two_layouts(*dev, s, B, 300, 9 + static_cast<uint64_t>(hd));
    const auto q = normals(B * heads * s.head_dim, 77);
    std::vector<float> oc(q.size()), op(q.size());
    for (int64_t l = 0; l < s.layers; ++l) {
      decode_attention(*x.c, x.rc, l, q.data(), heads, oc.data());
      decode_attention(*x.p, x.rp, l, q.data(), heads, op.data());
      EXPECT_EQ(std::memcmp(oc.data(), op.data(), oc.size() * 4), 0) << kv_type_name(t) << " layer " << l;
      for (int64_t b = 0; b < B; ++b) {
        std::vector<double> ref(heads * s.head_dim);
        decode_attention_ref(*x.c, x.rc[b], l, &q[b * heads * s.head_dim], heads, ref.data());
        const auto e = error_stats(std::vector<double>(op.begin() + b * heads * s.head_dim,
                                                       op.begin() + (b + 1) * heads * s.head_dim),
                                   ref);
        EXPECT_LE(e.rel_l2, 2.0 * (s.head_dim + x.len[b] + 8) * std::ldexp(1.0, -24)) << kv_type_name(t);
      }
    }
  }
}

TEST(DecodePlan, EntriesAreTheCachesAndSplitsCoverEveryTokenInOrder) {
  auto dev = make_cpu_device();
  for (const int64_t hd : {128, 40})
    for (KvType t : {KvType::f32, KvType::int8, KvType::int4, KvType::fp8_e4m3_static}) {
      KvShape s{2, 3, hd, t};
      const TwoLayouts x = two_layouts(*dev, s, 4, 1100, 5, false);
      for (const bool paged : {false, true}) {
        const KvCache& c = paged ? static_cast<const KvCache&>(*x.p) : *x.c;
        const auto& reqs = paged ? x.rp : x.rc;
        for (int64_t l = 0; l < s.layers; ++l) {
          const DecodePlan p = plan_decode(c, reqs, l, 6, 512);
          ASSERT_EQ(p.length.size(), reqs.size());
          int64_t k = 0;
          for (std::size_t b = 0; b < reqs.size(); ++b) {
            EXPECT_EQ(p.block_tokens[b], paged && x.len[b] > 16 ? 16 : x.len[b]) << "a contiguous request (or one block) is one block";
            for (int64_t pos = 0; pos < x.len[b]; ++pos)
              ASSERT_EQ(plan_entry(p.blocks.data(), p.first_block[b], p.block_tokens[b], p.entry_bytes, pos),
                        const_cast<KvCache&>(c).entry(reqs[b], l, pos))
                  << kv_type_name(t) << (paged ? " paged" : " contiguous") << " request " << b << " token " << pos;
            // Splits of 512 positions in order; several take consecutive workspace slots.
            const int64_t n = (x.len[b] + 511) / 512;
            EXPECT_EQ(p.first_slot[b + 1] - p.first_slot[b], n > 1 ? n : 0);
            for (int64_t i = 0; i < n; ++i, ++k) {
              EXPECT_EQ(p.split_req[k], static_cast<int32_t>(b));
              EXPECT_EQ(p.split_from[k], i * 512);
              EXPECT_EQ(p.split_to[k], std::min<int64_t>(x.len[b], (i + 1) * 512));
              EXPECT_EQ(p.split_slot[k], n > 1 ? p.first_slot[b] + i : -1);
            }
          }
          EXPECT_EQ(static_cast<int64_t>(p.split_req.size()), k);
          // Whole-slice loads need head_dim = 32 x lane elements: 128 yes, 40 no.
          EXPECT_EQ(p.vector_loads, hd == 128) << kv_type_name(t) << " head_dim " << hd;
        }
      }
    }
  KvShape s{1, 2, 16, KvType::f32};
  const TwoLayouts x = two_layouts(*dev, s, 2, 10, 1, false);
  expect_error_naming([&] { plan_decode(*x.c, x.rc, 0, 3, 512); }, "multiple of kv_heads");
  expect_error_naming([&] { plan_decode(*x.c, x.rc, 0, 4, 0); }, "split_tokens");
}

TEST(KvRecords, LaneSlicesCutIntoTheRecordsCodes) {
  std::mt19937_64 rng(3);
  for (KvType t : kTypes) {
    const int64_t hd = 256;
    const KvShape s{1, 1, hd, t};
    std::vector<uint8_t> r(static_cast<std::size_t>(s.head_bytes()));
    for (auto& b : r) b = static_cast<uint8_t>(rng());
    for (const int e : {2, 4, 8}) {
      const int64_t slice = e * s.elem_bits() / 8;
      for (int lane = 0; lane < 32; ++lane) {
        uint32_t w[8] = {};
        std::memcpy(w, r.data() + lane * slice, static_cast<std::size_t>(slice));
        for (int i = 0; i < e; ++i) {
          const uint32_t c = s.elem_bits() == 32 ? slice_code<32>(w, i)
                             : s.elem_bits() == 16 ? slice_code<16>(w, i)
                             : s.elem_bits() == 8  ? slice_code<8>(w, i)
                                                   : slice_code<4>(w, i);
          ASSERT_EQ(c, record_code(t, r.data(), lane * e + i)) << kv_type_name(t) << " E " << e << " lane " << lane;
        }
      }
    }
  }
}

TEST(PagedCache, OffloadKeepsEveryTokenAndItsBookkeeping) {
  // Random add / append / fork / release on a cache that keeps 2 blocks per request on the device and
  // the rest in a host pool: device and host reference counts match the live tables, no block leaks, the
  // cold blocks are a prefix of each table, and every token reads back what was written for it.
  auto dev = make_cpu_device();
  const KvShape s{2, 1, 4, KvType::bf16};
  PagedCache c(*dev, s, 4, 24);
  c.enable_offload(40, 2);
  std::mt19937_64 rng(17);
  std::vector<int64_t> live;
  std::map<int64_t, std::vector<uint64_t>> seeds;  // per request, the seed its token pos was written with
  int64_t refusals = 0, evictions = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 20);
    if (op < 2 || live.empty()) {
      live.push_back(c.add(1000));
      seeds[live.back()];
    } else if (op < 16) {
      const int64_t r = live[rng() % live.size()];
      const int64_t to_host = c.traffic().to_host;
      if (c.append(r)) {
        const uint64_t seed = rng() % 1000;
        write_token(c, r, c.length(r) - 1, seed);
        seeds[r].push_back(seed);
        if (c.traffic().to_host > to_host) {
          EXPECT_EQ(c.traffic().to_host - to_host, c.block_bytes());
          ++evictions;
        }
      } else {
        ++refusals;
      }
    } else if (op < 17) {
      const int64_t r = live[rng() % live.size()];
      if (c.length(r) > 0) {
        live.push_back(c.fork(r));
        seeds[live.back()] = seeds[r];
      }
    } else {
      const std::size_t i = rng() % live.size();
      c.release(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::map<int32_t, int32_t> dev_refs, host_refs;
    for (int64_t r : live) {
      const auto& t = c.table(r);
      int64_t hot = 0;
      for (std::size_t i = 0; i < t.size(); ++i) {
        if (t[i] >= 0) {
          ++hot;
          ++dev_refs[t[i]];
        } else {
          ASSERT_EQ(hot, 0) << "a cold block after a hot one";
          ++host_refs[t[i]];
        }
      }
      ASSERT_LE(hot, 2);
    }
    for (const auto& [b, n] : dev_refs) ASSERT_EQ(c.refcount(b), n) << "block " << b << " at step " << step;
    ASSERT_EQ(static_cast<int64_t>(dev_refs.size()) + c.free_blocks(), c.num_blocks()) << "at step " << step;
    ASSERT_EQ(static_cast<int64_t>(host_refs.size()), c.host_blocks_used()) << "at step " << step;
  }
  EXPECT_GT(refusals, 0) << "the pools never ran out";
  EXPECT_GT(evictions, 50);
  std::vector<uint8_t> want(s.entry_bytes() * s.layers);
  for (int64_t r : live)
    for (int64_t pos = 0; pos < c.length(r); ++pos) {
      ContiguousCache one(*dev, s);
      const int64_t q = one.add(pos + 1);
      for (int64_t i = 0; i <= pos; ++i) one.append(q);
      write_token(one, q, pos, seeds[r][pos]);
      for (int64_t l = 0; l < s.layers; ++l)
        ASSERT_EQ(std::memcmp(c.entry(r, l, pos), one.entry(q, l, pos), s.entry_bytes()), 0) << "req " << r << " pos " << pos;
    }
  for (int64_t r : live) c.release(r);
  EXPECT_EQ(c.free_blocks(), c.num_blocks());
  EXPECT_EQ(c.host_blocks_used(), 0);
}

TEST(DecodeAttention, SplitsGiveTheSameBitsForAnyLayoutAndThreadCountOnEverySimdTarget) {
  // Contexts of several splits (split_tokens 32 and 48: partial chunks and partial splits), blocks of 5
  // tokens (not a multiple of the kernel's chunk), group sizes 1, 3 and 6 (one and two register blocks of
  // query heads) and 130 (the 16- and 32-bit types' scores then take one pass per KV head), head sizes
  // with and without a vector tail; on every SIMD target this machine runs.
  auto dev = make_cpu_device();
  test::for_each_simd_target([&](int64_t) {
    for (const int64_t hd : {32, 20})
      for (const int64_t group : {1, 3, 6, 130})
        for (KvType t : kCacheTypes) {
          if (!takes(t, hd)) continue;
          SCOPED_TRACE(std::string(kv_type_name(t)) + " head_dim " + std::to_string(hd) + " group " + std::to_string(group));
          KvShape s{1, 2, hd, t};
          random_static_scales(s, 5);
          const int64_t heads = 2 * group, lens[] = {1, 31, 97, 130};
          ContiguousCache c(*dev, s);
          PagedCache p(*dev, s, 5, 200);
          std::vector<int64_t> rc, rp;
          for (int64_t b = 0; b < 4; ++b) {
            rc.push_back(c.add(lens[b]));
            rp.push_back(p.add(lens[b]));
            for (int64_t i = 0; i < lens[b]; ++i) {
              ASSERT_TRUE(c.append(rc[b]) && p.append(rp[b]));
              write_token(c, rc[b], i, static_cast<uint64_t>(b));
              write_token(p, rp[b], i, static_cast<uint64_t>(b));
            }
          }
          const auto q = normals(4 * heads * hd, 31);
          for (const int64_t split : {32, 48}) {
            std::vector<float> oc(q.size()), op(q.size()), o1(q.size());
            const auto peak = dev->memory().by_tag(Tag::workspace).peak;
            decode_attention(c, rc, 0, q.data(), heads, oc.data(), split);
            decode_attention(p, rp, 0, q.data(), heads, op.data(), split);
            const int threads = omp_get_max_threads();
            omp_set_num_threads(1);
            decode_attention(p, rp, 0, q.data(), heads, o1.data(), split);
            omp_set_num_threads(threads);
            EXPECT_EQ(std::memcmp(oc.data(), op.data(), oc.size() * 4), 0) << "split " << split;
            EXPECT_EQ(std::memcmp(op.data(), o1.data(), op.size() * 4), 0) << "split " << split << ", one thread";
            // The workspace: one slot of heads x (head_dim + 2) floats per split of a request of several;
            // int4-smooth's smoothed queries beside them (4 requests x heads x head_dim floats).
            int64_t slots = 0;
            for (int64_t len : lens) slots += decode_splits(len, split) > 1 ? decode_splits(len, split) : 0;
            // The KIVI types': a group's scaled queries and score biases per thread (heads x (head_dim + 1) floats).
            const int64_t smoothed = t == KvType::int4_smooth ? 4 * heads * hd * 4 : 0;
            const int64_t kivi = kvcache::is_kivi(t) ? omp_get_max_threads() * heads * (hd + 1) * 4 : 0;
            EXPECT_EQ(dev->memory().by_tag(Tag::workspace).peak,
                      std::max<std::size_t>(peak, slots * heads * (hd + 2) * 4 + smoothed + kivi));
            for (int64_t b = 0; b < 4; ++b) {
              std::vector<double> ref(heads * hd);
              decode_attention_ref(c, rc[b], 0, &q[b * heads * hd], heads, ref.data());
              const auto e = error_stats(std::vector<double>(op.begin() + b * heads * hd, op.begin() + (b + 1) * heads * hd), ref);
              EXPECT_LE(e.rel_l2, 2.0 * (hd + lens[b] + 8) * std::ldexp(1.0, -24)) << "request " << b << " split " << split;
            }
          }
          std::vector<float> o(q.size());
          EXPECT_THROW(decode_attention(c, rc, 0, q.data(), heads, o.data(), 24), Error);  // not a multiple of 16
          EXPECT_THROW(decode_attention(c, rc, 0, q.data(), heads, o.data(), 0), Error);
        }
  });
}

TEST(DecodeAttention, ANaNKeyOrValueGivesNaNOutputsOnEverySimdTarget) {
  // One token's K or V record of request 0 encoded from a vector with a NaN in it. A NaN key makes the
  // scores, so every output element of the KV head's query heads, NaN. A NaN value does that where the
  // record has one scale (int8, fp8-e4m3, int4: the scale is NaN, the codes 0); where elements are stored
  // one by one (fp32, bf16, fp16, a NaN code of fp8-e4m3-static) only that element of the outputs is NaN.
  // The other KV head and request 1 are unchanged. Head size 32 takes the kernel's vector decodes, 20 its
  // element tails too.
  auto dev = make_cpu_device();
  test::for_each_simd_target([&](int64_t) {
    for (const int64_t hd : {32, 20})
      for (KvType t : kTypes)
        for (const int kv : {0, 1}) {
          if (!takes(t, hd)) continue;
          SCOPED_TRACE(std::string(kv_type_name(t)) + " head_dim " + std::to_string(hd) + (kv ? " V" : " K"));
          KvShape s{1, 2, hd, t};
          random_static_scales(s, 5);
          const int64_t group = 2, heads = 2 * group, len = 40, bad = hd - 3;  // in the element tail at 20
          ContiguousCache c(*dev, s);
          std::vector<int64_t> r;
          for (int64_t b = 0; b < 2; ++b) {
            r.push_back(c.add(len));
            for (int64_t i = 0; i < len; ++i) {
              ASSERT_TRUE(c.append(r[b]));
              write_token(c, r[b], i, static_cast<uint64_t>(b));
            }
          }
          const auto q = normals(2 * heads * hd, 31);
          std::vector<float> clean(q.size()), o(q.size());
          decode_attention(c, r, 0, q.data(), heads, clean.data());
          auto x = normals(hd, 8);
          x[bad] = NAN;
          const int64_t g = 1, rec = kv * s.kv_heads + g;  // KV head 1: query heads 2 and 3
          encode_head(t, x.data(), hd, c.entry(r[0], 0, 17) + rec * s.head_bytes(), s.record_scales(0, kv, g));
          decode_attention(c, r, 0, q.data(), heads, o.data());
          const bool per_element = kv == 1 && (t == KvType::f32 || t == KvType::bf16 || t == KvType::f16 ||
                                               t == KvType::fp8_e4m3_static || t == KvType::fp8_e5m2);
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t e = 0; e < hd; ++e) {
              const float v = o[h * hd + e];
              if (h / group != g)
                ASSERT_EQ(detail::float_as_bits(v), detail::float_as_bits(clean[h * hd + e])) << "head " << h;
              else if (!per_element || e == bad)
                ASSERT_TRUE(std::isnan(v)) << "head " << h << " element " << e;
              else
                ASSERT_TRUE(std::isfinite(v)) << "head " << h << " element " << e;
              ASSERT_EQ(detail::float_as_bits(o[heads * hd + h * hd + e]), detail::float_as_bits(clean[heads * hd + h * hd + e]))
                  << "request 1, head " << h;
            }
        }
  });
}

TEST(DecodeAttention, OffloadedEqualsPagedBitForBitAndCountsItsCopies) {
  auto dev = make_cpu_device();
  for (KvType t : {KvType::f32, KvType::int8}) {
    const KvShape s{3, 2, 32, t};
    const int64_t heads = 4, block = 8, hot = 3;
    const std::vector<int64_t> len = {5, 61, 200};
    const auto B = static_cast<int64_t>(len.size());
    OffloadPair x = offload_pair(*dev, s, len, block, hot);
    PagedCache &p = *x.p, &o = *x.o;
    EXPECT_EQ(x.cold, 0 + 5 + 22);  // blocks beyond the hot ones: full blocks of the longer requests
    EXPECT_EQ(o.host_blocks_used(), x.cold);
    EXPECT_EQ(o.traffic().to_host, x.cold * o.block_bytes());
    int64_t hot_blocks = 0;
    for (int64_t b = 0; b < B; ++b) hot_blocks += std::min<int64_t>(hot, (len[b] + block - 1) / block);
    EXPECT_EQ(o.reserved_bytes(), hot_blocks * o.block_bytes());
    const auto q = normals(B * heads * s.head_dim, 78);
    std::vector<float> yp(q.size()), yo(q.size());
    EXPECT_THROW(decode_attention(o, x.ro, 0, q.data(), heads, yo.data()), Error);  // not staged
    for (int64_t l = 0; l < s.layers; ++l) {
      o.reset_traffic();
      o.stage(x.ro, l);
      EXPECT_EQ(o.traffic().to_device, x.cold * block * s.entry_bytes());
      decode_attention(p, x.rp, l, q.data(), heads, yp.data());
      decode_attention(o, x.ro, l, q.data(), heads, yo.data());
      EXPECT_EQ(std::memcmp(yp.data(), yo.data(), yp.size() * 4), 0) << kv_type_name(t) << " layer " << l;
    }
  }
}

TEST(PagedCache, OffloadRefusesWhenTheHostPoolIsFull) {
  auto dev = make_cpu_device();
  const KvShape s{1, 1, 4, KvType::f32};
  PagedCache c(*dev, s, 2, 8);
  c.enable_offload(1, 1);
  EXPECT_THROW(c.enable_offload(1, 1), Error);
  const int64_t r = c.add(100);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(c.append(r));  // block 0 went to the host at the third token
  EXPECT_FALSE(c.append(r));                              // block 1 has nowhere to go
  EXPECT_EQ(c.length(r), 4);
  EXPECT_EQ(c.host_blocks_used(), 1);
}

TEST(Decoder, LogitsEqualTheFullForwardForEveryLayout) {
  const model::Config cfg = test::tiny_model();
  const auto w = test::test_weights(cfg, 4);
  const int64_t T = cfg.context;
  const datasets::Batch b = test::random_tokens(2, T, 11);
  auto dev = make_cpu_device();
  model::TrainOptions o = test::train_options(precision::Policy::fp32, 2, T);
  o.inference_only = true;
  const auto full = model::make_trainer_cpu(cfg, o, *dev, w)->logits(b);
  for (const char* layout : {"contiguous", "paged", "offload"}) {
    const KvShape s{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32};
    std::unique_ptr<KvCache> cache;
    if (layout == std::string("contiguous")) {
      cache = std::make_unique<ContiguousCache>(*dev, s);
    } else {
      auto p = std::make_unique<PagedCache>(*dev, s, 3, 64);
      if (layout == std::string("offload")) p->enable_offload(64, 2);  // 6 tokens on the device per request
      cache = std::move(p);
    }
    Decoder d(*dev, cfg, w, *cache);
    const std::vector<int64_t> reqs = {cache->add(T), cache->add(T)};
    std::vector<float> z(2 * cfg.vocab);
    double worst = 0, scale = 0;
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<int32_t> tok = {b.inputs[t], b.inputs[T + t]};
      d.step(reqs, tok, z.data());
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t v = 0; v < cfg.vocab; ++v) {
          const double want = full[(r * T + t) * cfg.vocab + v];
          worst = std::max(worst, std::abs(z[r * cfg.vocab + v] - want));
          scale = std::max(scale, std::abs(want));
        }
    }
    // fp32 rounding through 2 layers of width 32 in another summation order: a few hundred ulps of the
    // largest logit; a wrong position or mask moves logits by O(1).
    EXPECT_LE(worst, 1e-4 * std::max(scale, 1.0)) << layout;
    if (layout == std::string("offload")) {
      EXPECT_GT(static_cast<PagedCache&>(*cache).host_blocks_used(), 0);
    }
  }
}

TEST(Serving, EveryRequestFinishesAndPagingReservesOnlyWhatIsUsed) {
  auto dev = make_cpu_device();
  const KvShape s{1, 1, 2, KvType::f32};
  TraceSpec t = trace_spec("sharegpt");
  t.requests = 60;
  t.max_len = 512;
  const int64_t budget = 2048;  // four contiguous reservations: paging must run more requests at once
  ContiguousCache c(*dev, s, budget);
  PagedCache p(*dev, s, 16, budget / 16);
  const ServingStats sc = simulate(c, false, t, budget), sp = simulate(p, true, t, budget);
  EXPECT_EQ(sc.finished, 60);
  EXPECT_EQ(sp.finished, 60);
  EXPECT_EQ(sc.max_concurrency, 4);
  EXPECT_GT(sp.max_concurrency, sc.max_concurrency);
  EXPECT_GT(sp.utilization, sc.utilization);
  EXPECT_LE(sp.utilization, 1.0);
  EXPECT_GT(sp.preemptions, 0) << "a budget this tight must preempt";
  EXPECT_EQ(sc.preemptions, 0);
  EXPECT_EQ(p.free_blocks(), p.num_blocks());  // everything released at the end
  EXPECT_EQ(c.reserved_bytes(), 0);
  // The same stream every time (seeded).
  PagedCache p2(*dev, s, 16, budget / 16);
  EXPECT_EQ(simulate(p2, true, t, budget).decode_tokens, sp.decode_tokens);
  EXPECT_THROW(trace_spec("bogus"), Error);
}

TEST(Serving, ABudgetInBytesHoldsEachStorageTypesTokens) {
  // Llama-2-7B's KV shape: 512 KiB per token in fp16; int8 adds a 4-byte scale per head record, q4_0 two
  // fp16 scales per 128 values.
  KvShape s{32, 32, 128, KvType::f16};
  const int64_t gib8 = int64_t{8} << 30;
  EXPECT_EQ(budget_tokens_of(s, gib8, 16, 4096), 16384);
  s.type = KvType::fp8_e4m3_static;
  EXPECT_EQ(budget_tokens_of(s, gib8, 16, 4096), 32768);
  s.type = KvType::int8;  // 2 x 32 x 32 x (128 + 4) bytes: 31775 tokens, whole blocks of 16
  EXPECT_EQ(budget_tokens_of(s, gib8, 16, 4096), 31760);
  s.type = KvType::q4_0;  // 2 x 32 x 32 x (64 + 8) bytes: 58254 tokens
  EXPECT_EQ(budget_tokens_of(s, gib8, 16, 4096), 58240);
  EXPECT_EQ(budget_tokens_of(s, gib8, 32, 4096), 58240);
  EXPECT_EQ(budget_tokens_of(s, gib8, 7, 4096), 58254);  // 8322 blocks of 7
  // A budget that does not hold max_len and a block is an error naming the bytes.
  try {
    budget_tokens_of(KvShape{32, 32, 128, KvType::f16}, int64_t{1} << 30, 16, 4096);
    ADD_FAILURE() << "a 1 GiB budget (2048 fp16 tokens) cannot hold max_len 4096";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2048 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(budget_tokens_of(KvShape{32, 32, 128, KvType::f16}, 0, 16, 4096), Error);
  EXPECT_THROW(budget_tokens_of(KvShape{32, 32, 100, KvType::q4_0}, gib8, 16, 4096), Error);  // not whole blocks of 32

  // Under one byte budget a smaller storage type runs more requests at once (paged), and serves the stream
  // in fewer steps; the stream is the same.
  auto dev = make_cpu_device();
  TraceSpec t = trace_spec("sharegpt");
  t.requests = 80;
  t.max_len = 1024;
  const KvShape tiny{1, 1, 2, KvType::f32};
  ServingStats prev;
  for (KvType kt : {KvType::f16, KvType::int8, KvType::q4_0}) {
    const int64_t tokens = budget_tokens_of(KvShape{32, 32, 128, kt}, int64_t{2} << 30, 16, t.max_len);
    PagedCache p(*dev, tiny, 16, tokens / 16);
    const ServingStats st = simulate(p, true, t, tokens);
    EXPECT_EQ(st.finished, t.requests) << kv_type_name(kt);
    if (kt != KvType::f16) {
      EXPECT_GT(st.concurrency, prev.concurrency) << kv_type_name(kt);
      EXPECT_LT(st.steps, prev.steps) << kv_type_name(kt);
    }
    prev = st;
  }
}

namespace {
KvShape with_residual(KvShape s, int64_t r) {
  s.residual = r;
  return s;
}
}  // namespace

TEST(Serving, KiviResidualTakesItsBytesFromTheBudgetPerRunningRequest) {
  // Llama-2-7B's shape in int4-kivi: 2 x 32 x 32 x (64 code bytes + 4 fp16 pairs) = 160 KiB per token; a
  // request's residual is 32 fp16 tokens at every layer, 16 MiB = 102.4 of those tokens, 3.2 per fp16 token.
  const KvShape kivi{32, 32, 128, KvType::int4_kivi};
  ASSERT_EQ(kivi.token_bytes(), 163840);
  const ResidualModel m = residual_model(kivi);
  EXPECT_EQ(m.group, 32);
  EXPECT_EQ(m.tokens, 103);
  EXPECT_DOUBLE_EQ(m.per_token, 3.2);
  EXPECT_EQ(residual_model(KvShape{32, 32, 128, KvType::int4}).tokens, 0);
  EXPECT_EQ(budget_tokens_of(kivi, int64_t{8} << 30, 16, 4096), 52416);
  // int2-kivi: 2 x 32 x 32 x (32 code bytes + 4 fp16 pairs) = 96 KiB per token; the same 16 MiB residual is
  // 170.7 of its tokens, 5.33 per fp16 token.
  const KvShape kivi2{32, 32, 128, KvType::int2_kivi};
  ASSERT_EQ(kivi2.token_bytes(), 98304);
  const ResidualModel m2 = residual_model(kivi2);
  EXPECT_EQ(m2.tokens, 171);
  EXPECT_DOUBLE_EQ(m2.per_token, 16.0 / 3.0);
  // KIVI's R = 128: four times the bytes (64 MiB, 409.6 int4-kivi tokens), entering the pool 128 at a time, at
  // the same bytes per fp16 token; R must be a multiple of the key group.
  const KvShape kivi128 = with_residual(kivi, 128);
  const ResidualModel m128 = residual_model(kivi128);
  EXPECT_EQ(m128.group, 128);
  EXPECT_EQ(m128.tokens, 410);
  EXPECT_DOUBLE_EQ(m128.per_token, 3.2);
  EXPECT_THROW(residual_model(with_residual(kivi, 48)), Error);
  EXPECT_THROW(residual_model(with_residual(kivi, 0)), Error);
  const KvShape int8_64{32, 32, 128, KvType::int8, {}, {}, 64};  // int8 keeps no residual
  EXPECT_THROW(budget_tokens_of(int8_64, int64_t{8} << 30, 16, 4096), Error);
  EXPECT_EQ(budget_tokens_of(kivi128, int64_t{8} << 30, 16, 4096), 52416);  // the pool is the budget's
  EXPECT_THROW(budget_tokens_of(kivi128, (4096 + 16 + 200) * kivi.token_bytes(), 16, 4096), Error);
  EXPECT_NO_THROW(budget_tokens_of(kivi, (4096 + 16 + 200) * kivi.token_bytes(), 16, 4096));
  // A budget that holds max_len and a block but not a request's residual as well: an error that says so.
  try {
    budget_tokens_of(kivi, (4096 + 16 + 50) * kivi.token_bytes(), 16, 4096);
    ADD_FAILURE() << "4160 tokens cannot hold max_len 4096, a residual of 103 tokens and a block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("residual (103 tokens)"), std::string::npos) << e.what();
  }

  // Under one byte budget: short requests (Alpaca-like, 77 tokens on average) pay the residual's 103 tokens
  // each, so int4-kivi runs fewer of them at once than int4, and fewer than int8; long ones (ShareGPT-like)
  // amortize it, and it runs more than int8.
  auto dev = make_cpu_device();
  const KvShape tiny{1, 1, 2, KvType::f32};
  auto run = [&](const char* trace, KvType kt) {
    TraceSpec t = trace_spec(trace);
    t.requests = 300;
    t.max_len = 1024;
    const KvShape s{32, 32, 128, kt};
    const int64_t tokens = budget_tokens_of(s, int64_t{2} << 30, 16, t.max_len);
    PagedCache p(*dev, tiny, 16, tokens / 16);
    const ServingStats st = simulate(p, true, t, tokens, residual_model(s));
    EXPECT_EQ(st.finished, t.requests) << trace << " " << kv_type_name(kt);
    EXPECT_EQ(p.free_blocks(), p.num_blocks()) << "blocks left held";
    EXPECT_GT(st.utilization, 0.0);
    EXPECT_LE(st.utilization, 1.0);
    return st;
  };
  const ServingStats ak = run("alpaca", KvType::int4_kivi), a4 = run("alpaca", KvType::int4), a8 = run("alpaca", KvType::int8);
  EXPECT_LT(ak.concurrency, a4.concurrency);
  EXPECT_LT(ak.concurrency, a8.concurrency);
  const ServingStats sk = run("sharegpt", KvType::int4_kivi), s4 = run("sharegpt", KvType::int4),
                     s8 = run("sharegpt", KvType::int8);
  EXPECT_LT(sk.concurrency, s4.concurrency);
  EXPECT_GT(sk.concurrency, s8.concurrency);
  // The residual's reservation is not live data: utilization falls below the same stream's in int4.
  EXPECT_LT(ak.utilization, a4.utilization);
  // A longer R holds more of every request's budget: fewer Alpaca-like requests run at once.
  {
    TraceSpec t = trace_spec("alpaca");
    t.requests = 300;
    t.max_len = 1024;
    const KvShape s = with_residual(KvShape{32, 32, 128, KvType::int4_kivi}, 128);
    const int64_t tokens = budget_tokens_of(s, int64_t{2} << 30, 16, t.max_len);
    PagedCache p(*dev, tiny, 16, tokens / 16);
    const ServingStats st = simulate(p, true, t, tokens, residual_model(s));
    EXPECT_EQ(st.finished, t.requests);
    EXPECT_EQ(p.free_blocks(), p.num_blocks());
    EXPECT_LT(st.concurrency, ak.concurrency);
  }

  // Tokens enter the pool a whole group at a time: one request of prompt 1 and output 1 (max_len 2), groups
  // of 4, a residual of 1 pool token at 0.5 per fp16 token. After its step the request holds the residual
  // alone (1 token reserved) with both tokens in it (live 2 x 0.5): utilization 1, a third of the budget.
  TraceSpec one = trace_spec("alpaca");
  one.requests = 1;
  one.max_len = 2;
  PagedCache p1(*dev, tiny, 1, 3);
  const ServingStats so = simulate(p1, true, one, 3, ResidualModel{4, 1, 0.5});
  EXPECT_EQ(so.steps, 1);
  EXPECT_DOUBLE_EQ(so.utilization, 1.0);
  EXPECT_DOUBLE_EQ(so.budget_utilization, 1.0 / 3.0);

  // Contiguous reservations grow by the residual too: max_len + 103 tokens per request.
  TraceSpec t = trace_spec("sharegpt");
  t.requests = 20;
  t.max_len = 512;
  ContiguousCache c(*dev, tiny, 4 * (512 + m.tokens));
  EXPECT_EQ(simulate(c, false, t, 4 * (512 + m.tokens), m).max_concurrency, 4);
  ContiguousCache c2(*dev, tiny, 4 * (512 + m.tokens) - 1);
  EXPECT_EQ(simulate(c2, false, t, 4 * (512 + m.tokens) - 1, m).max_concurrency, 3);
}

TEST(Decoder, QuantizedWeightsStayNearTheDenseLogitsAndReadFewerBytes) {
  const model::Config cfg = test::tiny_model();
  const auto w = test::test_weights(cfg, 4);
  const KvShape s{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32};
  auto dev = make_cpu_device();
  const datasets::Batch b = test::random_tokens(2, 6, 3);
  std::vector<float> zd(2 * cfg.vocab), zq(2 * cfg.vocab), z1(cfg.vocab);
  ContiguousCache cd(*dev, s), cq(*dev, s), c1(*dev, s);
  Decoder dense(*dev, cfg, w, cd), q8(*dev, cfg, w, cq, quant::parse_spec("int8")), one(*dev, cfg, w, c1, quant::parse_spec("int8"));
  EXPECT_LT(q8.weight_bytes_read(), 0.3 * dense.weight_bytes_read());
  {  // what the decoder says it stores is what the tracked pool holds for it
    auto solo = make_cpu_device();
    ContiguousCache cs(*solo, s);
    const Decoder d4(*solo, cfg, w, cs, quant::parse_spec("int4"));
    EXPECT_EQ(d4.weight_bytes_stored(), static_cast<double>(solo->memory().by_tag(Tag::weights).live));
  }
  const std::vector<int64_t> rd = {cd.add(6), cd.add(6)}, rq = {cq.add(6), cq.add(6)}, r1 = {c1.add(6)};
  double err = 0, ref = 0;
  for (int64_t t = 0; t < 6; ++t) {
    const std::vector<int32_t> tok = {b.inputs[t], b.inputs[6 + t]};
    dense.step(rd, tok, zd.data());
    q8.step(rq, tok, zq.data());  // batch 2: the panel matmul
    one.step(r1, std::vector<int32_t>{tok[0]}, z1.data());  // batch 1: the matvec
    for (int64_t v = 0; v < cfg.vocab; ++v) {
      err += std::pow(zq[v] - zd[v], 2);
      ref += std::pow(zd[v], 2);
      EXPECT_NEAR(z1[v], zq[v], 1e-3 * (1 + std::abs(zq[v])));  // matvec and matmul agree on request 0
    }
  }
  // int8 per channel: each weight within half a step of amax / 127; the logits move by about that
  // share, far from a wrong layer or a transposed matrix (O(1)).
  EXPECT_LT(std::sqrt(err / ref), 0.05);
  EXPECT_GT(std::sqrt(err / ref), 0.0) << "the quantized path must differ from the dense one";
}

TEST(Decoder, Int8ActivationsStayNearTheFloatActivationLogits) {
  // packed-a8 rounds each projection's input to int8 per block of 32 (at most 0.504 / 127 of the block's
  // amax per element): the logits move by about that share, not by O(1).
  const model::Config cfg = test::tiny_model();
  const auto w = test::test_weights(cfg, 4);
  const KvShape s{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32};
  auto dev = make_cpu_device();
  const datasets::Batch b = test::random_tokens(1, 6, 5);
  for (const char* fmt : {"int8", "int4", "nf4"}) {
    ContiguousCache cf(*dev, s), ci(*dev, s);
    Decoder fl(*dev, cfg, w, cf, quant::parse_spec(fmt)), in(*dev, cfg, w, ci, quant::parse_spec(fmt));
    in.set_int8_activations(true);
    const std::vector<int64_t> rf = {cf.add(6)}, ri = {ci.add(6)};
    std::vector<float> zf(cfg.vocab), zi(cfg.vocab);
    double err = 0, ref = 0;
    for (int64_t t = 0; t < 6; ++t) {
      fl.step(rf, std::vector<int32_t>{b.inputs[t]}, zf.data());
      in.step(ri, std::vector<int32_t>{b.inputs[t]}, zi.data());
      for (int64_t v = 0; v < cfg.vocab; ++v) {
        ASSERT_TRUE(std::isfinite(zi[v])) << fmt;
        err += std::pow(zi[v] - zf[v], 2);
        ref += std::pow(zf[v], 2);
      }
    }
    EXPECT_LT(std::sqrt(err / ref), 0.03) << fmt;
    EXPECT_GT(std::sqrt(err / ref), 0.0) << fmt << ": the int8 activations must change something";
  }
  // No integer codes, no int8 activations: a clear refusal.
  ContiguousCache c1(*dev, s), c2(*dev, s);
  Decoder dense(*dev, cfg, w, c1), fp8(*dev, cfg, w, c2, quant::parse_spec("fp8-e4m3"));
  EXPECT_THROW(dense.set_int8_activations(true), Error);
  try {
    fp8.set_int8_activations(true);
    ADD_FAILURE() << "fp8 weights were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not integers"), std::string::npos) << e.what();
  }
}

TEST(Decoder, FusedProjectionsGiveTheSeparateProjectionsBits) {
  // q/k/v and gate/up stacked into one matrix each: every row is quantized and multiplied as alone, so the
  // logits are those of the seven separate projections bit for bit, at batch 1 (matvec, fp32 or int8
  // activations), batch 3 (small-batch matmul), with a layer's weights staged from the host pool, and
  // the weights take no more bytes.
  const model::Config cfg = test::tiny_model();
  const auto w = test::test_weights(cfg, 4);
  const KvShape s{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32};
  const datasets::Batch b = test::random_tokens(3, 5, 11);
  for (const char* fmt : {"int8", "int4", "int4-asym-g64", "nf4"})
    for (const int64_t B : {1, 3})
      for (const bool a8 : {false, true})
        for (const int64_t host_layers : {0, 1}) {
          if (a8 && B > 1) continue;  // int8 activations are a batch-1 path
          auto dev = make_cpu_device();
          ContiguousCache cf(*dev, s), cs(*dev, s);
          Decoder fused(*dev, cfg, w, cf, quant::parse_spec(fmt), host_layers),
              sep(*dev, cfg, w, cs, quant::parse_spec(fmt), host_layers, false);
          fused.set_int8_activations(a8);
          sep.set_int8_activations(a8);
          EXPECT_LE(fused.weight_bytes_stored(), sep.weight_bytes_stored()) << fmt;
          std::vector<int64_t> rf, rs;
          for (int64_t i = 0; i < B; ++i) {
            rf.push_back(cf.add(5));
            rs.push_back(cs.add(5));
          }
          std::vector<float> zf(B * cfg.vocab), zs(B * cfg.vocab);
          for (int64_t t = 0; t < 5; ++t) {
            std::vector<int32_t> tok;
            for (int64_t i = 0; i < B; ++i) tok.push_back(b.inputs[i * 5 + t]);
            fused.step(rf, tok, zf.data());
            sep.step(rs, tok, zs.data());
            ASSERT_EQ(std::memcmp(zf.data(), zs.data(), zf.size() * sizeof(float)), 0)
                << fmt << " batch " << B << (a8 ? " int8 activations" : "") << " host layers " << host_layers
                << " step " << t;
          }
        }
  // nf4-dq quantizes across rows (absmax blocks of 256 groups, one mean per matrix), so stacking would
  // change its weights: it is never stacked, and gives the separate projections' logits.
  auto dev = make_cpu_device();
  ContiguousCache c1(*dev, s), c2(*dev, s);
  Decoder dq(*dev, cfg, w, c1, quant::parse_spec("nf4-dq")),
      dq_sep(*dev, cfg, w, c2, quant::parse_spec("nf4-dq"), 0, false);
  EXPECT_EQ(dq.weight_bytes_stored(), dq_sep.weight_bytes_stored());
  const std::vector<int64_t> r1 = {c1.add(2)}, r2 = {c2.add(2)};
  std::vector<float> z1(cfg.vocab), z2(cfg.vocab);
  dq.step(r1, std::vector<int32_t>{b.inputs[0]}, z1.data());
  dq_sep.step(r2, std::vector<int32_t>{b.inputs[0]}, z2.data());
  EXPECT_EQ(std::memcmp(z1.data(), z2.data(), z1.size() * sizeof(float)), 0);
}

TEST(Decoder, WeightOffloadGivesTheSameLogitsAndMovesEachOffloadedLayerEveryStep) {
  model::Config cfg = test::tiny_model();
  const KvShape s{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32};
  const datasets::Batch b = test::random_tokens(2, 5, 9);
  for (const bool tie : {false, true})
  for (const char* fmt : {"fp32", "int4"}) {
    cfg.tie_embeddings = tie;  // tied and dense: the head reads the embedding, no buffer of its own
    const auto w = test::test_weights(cfg, 4);
    std::optional<quant::Spec> spec;
    if (fmt != std::string("fp32")) spec = quant::parse_spec(fmt);
    auto home = make_cpu_device();
    ContiguousCache ch(*home, s);
    const Decoder resident(*home, cfg, w, ch, spec);
    const auto resident_bytes = static_cast<int64_t>(home->memory().by_tag(Tag::weights).live);
    for (int64_t host_layers = 1; host_layers <= cfg.layers; ++host_layers) {
      auto d0 = make_cpu_device(), d1 = make_cpu_device();
      ContiguousCache c0(*d0, s), c1(*d1, s);
      Decoder plain(*d0, cfg, w, c0, spec), off(*d1, cfg, w, c1, spec, host_layers);
      // The host pool holds the offloaded projections; the device the rest plus one staging layer.
      const auto host = static_cast<int64_t>(d1->host().by_tag(Tag::weights).live);
      EXPECT_EQ(host, off.weight_host_bytes()) << fmt;
      EXPECT_GT(host, 0);
      EXPECT_EQ(static_cast<int64_t>(d1->memory().by_tag(Tag::weights).live),
                resident_bytes - host + off.weight_staging_bytes()) << fmt;
      EXPECT_GE(off.weight_staging_bytes() * host_layers, host) << "the staging area holds one layer";
      EXPECT_EQ(off.weight_bytes_stored(), plain.weight_bytes_stored());
      const std::vector<int64_t> r0 = {c0.add(5), c0.add(5)}, r1 = {c1.add(5), c1.add(5)};
      std::vector<float> z0(2 * cfg.vocab), z1(2 * cfg.vocab);
      for (int64_t t = 0; t < 5; ++t) {
        const std::vector<int32_t> tok = {b.inputs[t], b.inputs[5 + t]};
        plain.step(r0, tok, z0.data());
        off.step(r1, tok, z1.data());
        EXPECT_EQ(z0, z1) << fmt << " host_layers " << host_layers << " step " << t;  // the same bytes, the same math
      }
      EXPECT_EQ(off.weight_bytes_to_device(), 5 * host);
      EXPECT_EQ(plain.weight_bytes_to_device(), 0);
    }
  }
  const auto w = test::test_weights(cfg, 4);
  auto dev = make_cpu_device();
  ContiguousCache c(*dev, s);
  EXPECT_THROW(Decoder(*dev, cfg, w, c, std::nullopt, cfg.layers + 1), Error);
  EXPECT_THROW(Decoder(*dev, cfg, w, c, std::nullopt, -1), Error);
}

TEST(KvRecords, SmoothedKeysSpendTheirStepsOnTheSmallChannelsAndKeepTheirBound) {
  // A key with one outlier channel (x50): per-token int4 sets its step by the outlier, so the other
  // channels lose almost everything; divided by lambda = amax_c^0.5 first, every channel is within half a
  // step of x / lambda, times lambda.
  const int64_t hd = 64;
  auto x = normals(hd, 8);
  x[10] *= 50.f;
  std::vector<float> lambda(hd);
  for (int64_t i = 0; i < hd; ++i) lambda[i] = std::sqrt(i == 10 ? 150.f : 3.f);  // amax_c of a calibration
  std::vector<uint8_t> rec(KvShape{1, 1, hd, KvType::int4_smooth}.head_bytes());
  std::vector<float> plain(hd), smooth(hd);
  encode_head(KvType::int4, x.data(), hd, rec.data());
  decode_head(KvType::int4, rec.data(), hd, plain.data());
  encode_head(KvType::int4_smooth, x.data(), hd, rec.data(), RecordScales(1.f, lambda.data()));
  decode_head(KvType::int4_smooth, rec.data(), hd, smooth.data(), RecordScales(1.f, lambda.data()));
  double amax_y = 0, e_plain = 0, e_smooth = 0;
  for (int64_t i = 0; i < hd; ++i) amax_y = std::max(amax_y, std::abs(static_cast<double>(x[i]) / lambda[i]));
  for (int64_t i = 0; i < hd; ++i) {
    EXPECT_LE(std::abs(smooth[i] - static_cast<double>(x[i])), lambda[i] * amax_y / 7 / 2 * (1 + 1e-5)) << i;
    if (i != 10) {
      e_plain += std::pow(plain[i] - static_cast<double>(x[i]), 2);
      e_smooth += std::pow(smooth[i] - static_cast<double>(x[i]), 2);
    }
  }
  EXPECT_LT(4 * e_smooth, e_plain) << "smoothing did not help the channels beside the outlier";
  // Without factors an int4-smooth record is a plain int4 record.
  std::vector<uint8_t> a(rec.size()), b(rec.size());
  encode_head(KvType::int4, x.data(), hd, a.data());
  encode_head(KvType::int4_smooth, x.data(), hd, b.data());
  EXPECT_EQ(a, b);
  // A NaN key makes the record NaN, as for int4.
  x[3] = NAN;
  encode_head(KvType::int4_smooth, x.data(), hd, rec.data(), RecordScales(1.f, lambda.data()));
  decode_head(KvType::int4_smooth, rec.data(), hd, smooth.data(), RecordScales(1.f, lambda.data()));
  for (float v : smooth) EXPECT_TRUE(std::isnan(v));
  // The factors are checked where the cache is made.
  auto dev = make_cpu_device();
  KvShape s{2, 3, 8, KvType::int4_smooth};
  s.key_smoothing.assign(2 * 3 * 8 - 1, 1.f);
  EXPECT_THROW(ContiguousCache(*dev, s), Error);
  s.key_smoothing.assign(2 * 3 * 8, 1.f);
  s.key_smoothing[5] = 0.f;
  EXPECT_THROW(PagedCache(*dev, s, 4, 4), Error);
  s.key_smoothing[5] = INFINITY;
  EXPECT_THROW(ContiguousCache(*dev, s), Error);
  s.key_smoothing[5] = 2.f;
  ContiguousCache c(*dev, s);
  EXPECT_EQ(c.shape().smoothing(0, 0)[5], 2.f);
  EXPECT_EQ(c.shape().record_scales(1, 1, 2).smooth, nullptr);  // V records are plain int4
  EXPECT_EQ(c.shape().record_scales(1, 0, 2).smooth, c.shape().key_smoothing.data() + (1 * 3 + 2) * 8);
}

TEST(KvRecords, StaticScalesAreCheckedWhereTheCacheIsMade) {
  auto dev = make_cpu_device();
  KvShape s{2, 3, 8, KvType::fp8_e4m3_static};
  s.static_scales.assign(11, 1.f);  // 2 layers x K, V x 3 heads = 12
  EXPECT_THROW(ContiguousCache(*dev, s), Error);
  s.static_scales.assign(12, 1.f);
  s.static_scales[7] = 0.f;
  EXPECT_THROW(PagedCache(*dev, s, 4, 4), Error);
  s.static_scales[7] = NAN;
  EXPECT_THROW(ContiguousCache(*dev, s), Error);
  s.static_scales[7] = 0.25f;
  ContiguousCache c(*dev, s);
  EXPECT_EQ(c.shape().scale(1, 0, 1), 0.25f);  // (layer 1, K, head 1)
  EXPECT_EQ(c.shape().scale(0, 1, 0), 1.f);
}

TEST(Decoder, CalibratedStaticFp8ScalesAreTheAmaxOver448AndKeepE4m3Precision) {
  const model::Config cfg = test::tiny_model();
  const auto w = test::test_weights(cfg, 4);
  const int64_t T = 8;
  const datasets::Batch calib = test::random_tokens(4, T, 21), eval = test::random_tokens(2, T, 22);
  const std::vector<float> scales = calibrate_kv_scales(cfg, w, std::nullopt, calib);
  ASSERT_EQ(static_cast<int64_t>(scales.size()), cfg.layers * 2 * cfg.kv_heads);
  // Each scale is the amax over the calibration windows' K or V of its head, / 448: recomputed here from
  // a decoder over an fp32 cache.
  {
    std::vector<float> amax(scales.size(), 0.f);
    each_fp32_record(cfg, w, calib, [&](int64_t l, int64_t h, const float* x) {
      float& m = amax[(l * 2 + h / cfg.kv_heads) * cfg.kv_heads + h % cfg.kv_heads];
      for (int64_t i = 0; i < cfg.head_dim(); ++i) m = std::max(m, std::abs(x[i]));
    });
    for (std::size_t i = 0; i < scales.size(); ++i) EXPECT_EQ(scales[i], amax[i] / 448.f) << i;
  }
  // Through a cache with these scales, the calibration windows' K and V (within the calibrated range by
  // construction) keep E4M3's precision: half an ulp of 3 mantissa bits, or half the subnormal step s 2^-9.
  // Layer 0 only: its K and V come from the embeddings alone, so the fp32 and fp8 decoders compute the
  // same values before storing them (later layers see the 8-bit attention of the layers before).
  {
    auto d32 = make_cpu_device(), d8 = make_cpu_device();
    KvShape s{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32};
    ContiguousCache c32(*d32, s);
    s.type = KvType::fp8_e4m3_static;
    s.static_scales = scales;
    ContiguousCache c8(*d8, s);
    Decoder a32(*d32, cfg, w, c32), a8(*d8, cfg, w, c8);
    const std::vector<int64_t> r32 = {c32.add(T)}, r8 = {c8.add(T)};
    std::vector<float> z(cfg.vocab), x(s.head_dim);
    for (int64_t t = 0; t < T; ++t) {
      a32.step(r32, std::vector<int32_t>{calib.inputs[t]}, z.data());
      a8.step(r8, std::vector<int32_t>{calib.inputs[t]}, z.data());
    }
    int64_t checked = 0;
    for (int64_t l = 0; l < 1; ++l)
      for (int64_t pos = 0; pos < T; ++pos)
        for (int64_t h = 0; h < 2 * cfg.kv_heads; ++h) {
          const float sc = s.scale(l, h < cfg.kv_heads ? 0 : 1, h % cfg.kv_heads);
          const float* want = reinterpret_cast<const float*>(c32.entry(r32[0], l, pos) + h * c32.shape().head_bytes());
          decode_head(s.type, c8.entry(r8[0], l, pos) + h * s.head_bytes(), s.head_dim, x.data(), sc);
          for (int64_t i = 0; i < s.head_dim; ++i, ++checked)
            ASSERT_LE(std::abs(x[i] - want[i]), std::ldexp(std::abs(want[i]), -4) + std::ldexp(sc, -10))
                << "layer " << l << " pos " << pos << " record " << h << " element " << i;
        }
    EXPECT_EQ(checked, T * 2 * cfg.kv_heads * cfg.head_dim());
  }
  // Where V outgrows E4M3's range (448), unit scales saturate it and calibrated scales do not: the same
  // model with every v_proj weight x1000, logits through each cache against the fp32 cache's.
  auto big = w;
  const auto L = model::param_layout(cfg);
  for (const auto& P : L.layer)
    for (int64_t i = 0; i < cfg.kv_dim() * cfg.dim; ++i) big[P.wv + i] *= 1000.f;
  const std::vector<float> big_scales = calibrate_kv_scales(cfg, big, std::nullopt, calib);
  ASSERT_GT(*std::max_element(big_scales.begin(), big_scales.end()), 1.f) << "V must exceed 448 for this check";
  auto logits = [&](KvShape s) {
    auto dev = make_cpu_device();
    ContiguousCache cache(*dev, s);
    Decoder d(*dev, cfg, big, cache);
    const std::vector<int64_t> reqs = {cache.add(T), cache.add(T)};
    std::vector<float> z(2 * cfg.vocab), all;
    for (int64_t t = 0; t < T; ++t) {
      d.step(reqs, std::vector<int32_t>{calib.inputs[t], calib.inputs[T + t]}, z.data());
      all.insert(all.end(), z.begin(), z.end());
    }
    return all;
  };
  KvShape s{cfg.layers, cfg.kv_heads, cfg.head_dim(), KvType::f32};
  const auto ref = logits(s);
  s.type = KvType::fp8_e4m3_static;
  const auto unit = logits(s);
  s.static_scales = big_scales;
  const auto calibrated = logits(s);
  auto rel = [&](const std::vector<float>& a) { return rel_l2(a, ref); };
  EXPECT_GT(rel(calibrated), 0.0);
  EXPECT_LT(5 * rel(calibrated), rel(unit)) << "calibrated " << rel(calibrated) << ", unit " << rel(unit);
  // A non-finite K stops the calibration with the layer's name.
  auto bad = w;
  bad[model::param_layout(cfg).layer[1].wk] = NAN;
  expect_error_naming([&] { calibrate_kv_scales(cfg, bad, std::nullopt, calib); }, "non-finite K at layer 1");
}

TEST(Decoder, CalibratedKeySmoothingIsTheChannelAmaxToTheHalfAndTamesAnOutlierChannel) {
  const model::Config cfg = test::tiny_model();
  auto w = test::test_weights(cfg, 4);
  // An outlier channel in every layer's keys: the row of W_k that makes channel 3 of kv head 0, x30.
  const auto L = model::param_layout(cfg);
  for (const auto& P : L.layer)
    for (int64_t i = 0; i < cfg.dim; ++i) w[P.wk + 3 * cfg.dim + i] *= 30.f;
  const int64_t T = 8, hd = cfg.head_dim();
  const datasets::Batch calib = test::random_tokens(4, T, 21);
  const std::vector<float> lambda = calibrate_key_smoothing(cfg, w, std::nullopt, calib);
  ASSERT_EQ(static_cast<int64_t>(lambda.size()), cfg.layers * cfg.kv_heads * hd);
  // Each factor is sqrt(amax) of its key channel over the calibration windows, recomputed from the K
  // records of a decoder over an fp32 cache.
  {
    std::vector<float> amax(lambda.size(), 0.f);
    each_fp32_record(cfg, w, calib, [&](int64_t l, int64_t h, const float* k) {
      if (h < cfg.kv_heads)  // keys only
        for (int64_t i = 0; i < hd; ++i) amax[(l * cfg.kv_heads + h) * hd + i] = std::max(amax[(l * cfg.kv_heads + h) * hd + i], std::abs(k[i]));
    });
    for (std::size_t i = 0; i < lambda.size(); ++i)
      EXPECT_EQ(lambda[i], amax[i] > 0 ? static_cast<float>(std::sqrt(static_cast<double>(amax[i]))) : 1.f) << i;
  }
  // Two windows through an fp32, an int4 and an int4-smooth cache: the keys layer 0 stores (the same
  // values in every decoder: they come from the embeddings alone) as decoded from each cache, and the
  // logits.
  const datasets::Batch eval = test::random_tokens(2, T, 22);
  std::vector<float> keys;  // layer 0's decoded keys, every channel but the outlier
  auto logits = [&](KvShape s) {
    auto dev = make_cpu_device();
    PagedCache cache(*dev, s, 4, 16);
    Decoder d(*dev, cfg, w, cache);
    const std::vector<int64_t> reqs = {cache.add(T), cache.add(T)};
    std::vector<float> z(2 * cfg.vocab), all;
    for (int64_t t = 0; t < T; ++t) {
      d.step(reqs, std::vector<int32_t>{eval.inputs[t], eval.inputs[T + t]}, z.data());
      all.insert(all.end(), z.begin(), z.end());
    }
    keys.clear();
    std::vector<float> k(hd);
    for (int64_t r : reqs)
      for (int64_t pos = 0; pos < T; ++pos)
        for (int64_t h = 0; h < cfg.kv_heads; ++h) {
          decode_head(s.type, cache.entry(r, 0, pos) + h * s.head_bytes(), hd, k.data(), s.record_scales(0, 0, h));
          for (int64_t i = 0; i < hd; ++i)
            if (h != 0 || (i != 3 && i != 3 + hd / 2)) keys.push_back(k[i]);  // 3 + hd / 2: its RoPE pair
        }
    return all;
  };
  KvShape s{cfg.layers, cfg.kv_heads, hd, KvType::f32};
  const auto ref = logits(s);
  const auto ref_keys = keys;
  s.type = KvType::int4;
  const auto plain = logits(s);
  const auto plain_keys = keys;
  s.type = KvType::int4_smooth;
  s.key_smoothing = lambda;
  const auto smooth = logits(s);
  const auto smooth_keys = keys;
  auto key_err = [&](const std::vector<float>& k) {
    double e = 0;
    for (std::size_t i = 0; i < k.size(); ++i) e += std::pow(static_cast<double>(k[i]) - ref_keys[i], 2);
    return e;
  };
  EXPECT_LT(3 * key_err(smooth_keys), key_err(plain_keys))
      << "int4-smooth " << key_err(smooth_keys) << ", int4 " << key_err(plain_keys);
  auto rel = [&](const std::vector<float>& a) { return rel_l2(a, ref); };
  EXPECT_GT(rel(smooth), 0.0);
  EXPECT_LT(1.5 * rel(smooth), rel(plain)) << "int4-smooth " << rel(smooth) << ", int4 " << rel(plain);
  // A non-finite K stops the calibration with the layer's name.
  auto bad = w;
  bad[L.layer[1].wk] = NAN;
  expect_error_naming([&] { calibrate_key_smoothing(cfg, bad, std::nullopt, calib); }, "non-finite K at layer 1");
  EXPECT_THROW(calibrate_key_smoothing(cfg, w, std::nullopt, calib, 0.0), Error);
}
