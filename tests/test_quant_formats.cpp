// impls/quant/formats: element codecs (FP8 against the CUDA headers' host conversions), NF4 codes,
// parameter fitting, names, layouts, packing, quantize / dequantize and their edge cases.
#include "impls/quant/formats.hpp"

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "datasets/random.hpp"
#include "tests/test_util.hpp"

using namespace memtrade;
using namespace memtrade::quant;

namespace {

uint32_t fbits(float f) { return detail::float_as_bits(f); }
float bitsf(uint32_t u) { return detail::bits_as_float(u); }
uint32_t rbits(uint64_t seed, uint64_t i) { return static_cast<uint32_t>(datasets::mix64(seed * 0x9E3779B97F4A7C15ull + i)); }

// The CUDA headers' conversions, host side: fp8 -> fp16 (exact, both formats fit fp16) -> float.
float cuda_fp8_to_float(uint8_t c, __nv_fp8_interpretation_t kind) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), kind);
  return half_bits_to_float(h.x);
}
uint8_t cuda_float_to_fp8(float f, __nv_fp8_interpretation_t kind) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, kind));
}

std::vector<float> normal_matrix(int64_t n, uint64_t seed, double sd = 1.0) {
  std::vector<float> w(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(sd * datasets::normal(seed, static_cast<uint64_t>(i)));
  return w;
}

std::vector<float> roundtrip(const QLayout& L, const std::vector<float>& W, const GroupParams* params = nullptr) {
  std::vector<uint8_t> blob(L.total_bytes());
  quantize(L, W.data(), blob.data(), params);
  std::vector<float> out(W.size());
  dequantize(L, blob.data(), out.data());
  return out;
}

const char* all_specs[] = {"int8",    "int4-g128", "int4-g7",  "int4-asym-g64", "int4-asym-g33", "fp8-e4m3",
                           "fp8-e5m2", "fp8-e4m3-tensor", "fp8-e5m2-tensor", "nf4", "nf4-g31", "nf4-dq", "nf4-dq-g128"};

}  // namespace

// ---------------------------------------------------------------- FP8 codecs

TEST(QuantFp8, AllCodesDecodeToCudaValues) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float a = fp8_e4m3_decode(code), b = fp8_e5m2_decode(code);
    const float ca = cuda_fp8_to_float(code, __NV_E4M3), cb = cuda_fp8_to_float(code, __NV_E5M2);
    if (std::isnan(ca))
      EXPECT_TRUE(std::isnan(a)) << c;
    else
      EXPECT_EQ(fbits(a), fbits(ca)) << "e4m3 code " << c << ": " << a << " vs " << ca;
    if (std::isnan(cb))
      EXPECT_TRUE(std::isnan(b)) << c;
    else
      EXPECT_EQ(fbits(b), fbits(cb)) << "e5m2 code " << c << ": " << b << " vs " << cb;
  }
  // OCP facts.
  EXPECT_EQ(fp8_e4m3_decode(0x7E), 448.f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_decode(0x7F)) && std::isnan(fp8_e4m3_decode(0xFF)));
  EXPECT_EQ(fp8_e4m3_decode(0x08), 0x1p-6f);  // min normal
  EXPECT_EQ(fp8_e4m3_decode(0x01), 0x1p-9f);  // min subnormal
  EXPECT_EQ(fp8_e5m2_decode(0x7B), 57344.f);
  EXPECT_EQ(fp8_e5m2_decode(0x7C), INFINITY);
  EXPECT_EQ(fp8_e5m2_decode(0xFC), -INFINITY);
  EXPECT_EQ(fp8_e5m2_decode(0x04), 0x1p-14f);
  EXPECT_EQ(fp8_e5m2_decode(0x01), 0x1p-16f);
  EXPECT_EQ(fbits(fp8_e4m3_decode(0x80)), 0x80000000u);  // -0
}

TEST(QuantFp8, EncodeMatchesCudaSatfinite) {
  std::vector<float> xs;
  for (uint64_t i = 0; i < 400000; ++i) {
    const uint32_t u = rbits(11, i);
    // Half fully random bit patterns, half with exponents around the fp8 ranges (2^-20 .. 2^17).
    if (i & 1) {
      xs.push_back(bitsf(u));
    } else {
      const uint32_t e = 107 + (u >> 24) % 38;
      xs.push_back(bitsf((u & 0x807FFFFFu) | (e << 23)));
    }
  }
  // Every fp8 value, every midpoint between neighbours (ties) and its float neighbours.
  for (int c = 0; c < 255; ++c)
    for (auto dec : {fp8_e4m3_decode, fp8_e5m2_decode}) {
      const float a = dec(static_cast<uint8_t>(c)), b = dec(static_cast<uint8_t>(c + 1));
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = 0.5f * (a + b);
      for (float v : {a, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f), -mid}) xs.push_back(v);
    }
  for (float v : {0.f, -0.f, INFINITY, -INFINITY, NAN, -NAN, 1e6f, -1e6f, 448.f, 464.f, 464.0001f, 57344.f, 61440.f,
                  FLT_MAX, FLT_MIN, FLT_TRUE_MIN, 0x1p-10f, 0x1p-17f, 0x1.0001p-10f})
    xs.push_back(v);
  int64_t bad4 = 0, bad5 = 0;
  for (float x : xs) {
    const uint8_t a = fp8_e4m3_encode(x), ca = cuda_float_to_fp8(x, __NV_E4M3);
    const uint8_t b = fp8_e5m2_encode(x), cb = cuda_float_to_fp8(x, __NV_E5M2);
    if (a != ca && bad4++ < 10) ADD_FAILURE() << "e4m3 " << x << " (" << std::hex << fbits(x) << "): " << int(a) << " vs " << int(ca);
    if (b != cb && bad5++ < 10) ADD_FAILURE() << "e5m2 " << x << " (" << std::hex << fbits(x) << "): " << int(b) << " vs " << int(cb);
  }
  EXPECT_EQ(bad4, 0);
  EXPECT_EQ(bad5, 0);
}

TEST(QuantFp8, SaturatesAndKeepsNaN) {
  EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(1e6f)), 448.f);
  EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(-1e6f)), -448.f);
  EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(INFINITY)), 448.f);
  EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(464.f)), 448.f);  // the tie above 448 would round to 480: saturate
  EXPECT_EQ(fp8_e5m2_decode(fp8_e5m2_encode(1e6f)), 57344.f);
  EXPECT_EQ(fp8_e5m2_decode(fp8_e5m2_encode(-INFINITY)), -57344.f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_decode(fp8_e4m3_encode(NAN))));
  EXPECT_TRUE(std::isnan(fp8_e5m2_decode(fp8_e5m2_encode(NAN))));
  // Round to nearest even: 17 lies between 16 and 18 (e4m3 step 2 there) -> 16; 19 -> 20.
  EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(17.f)), 16.f);
  EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(19.f)), 20.f);
  EXPECT_EQ(fp8_e4m3_encode(0x1p-10f), 0x00);  // half the smallest subnormal: ties to even zero
  EXPECT_EQ(fp8_e4m3_encode(0x1.0001p-10f), 0x01);
}

// ---------------------------------------------------------------- NF4

TEST(QuantNf4, CodesExactlyAsPublished) {
  const float want[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                          -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                          0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
                          0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(fbits(nf4_code(i)), fbits(want[i])) << i;
    EXPECT_EQ(nf4_encode(want[i]), i) << i;
    if (i < 15) {
      const float mid = 0.5f * (want[i] + want[i + 1]);
      EXPECT_EQ(nf4_encode(mid), i) << "a tie goes to the lower code";
      EXPECT_EQ(nf4_encode(std::nextafter(mid, 2.f)), i + 1);
    }
  }
  EXPECT_EQ(nf4_encode(-5.f), 0);
  EXPECT_EQ(nf4_encode(5.f), 15);
  // Nearest code by brute force over many values.
  for (int i = 0; i <= 20000; ++i) {
    const float x = -1.1f + 2.2f * static_cast<float>(i) / 20000.f;
    int best = 0;
    for (int j = 1; j < 16; ++j)
      if (std::fabs(x - want[j]) < std::fabs(x - want[best])) best = j;
    EXPECT_NEAR(std::fabs(x - nf4_code(nf4_encode(x))), std::fabs(x - want[best]), 1e-7f) << x;
  }
}

// ---------------------------------------------------------------- names

TEST(QuantSpec, ParseAndNameRoundTrip) {
  for (const char* n : all_specs) {
    const Spec s = parse_spec(n);
    EXPECT_EQ(parse_spec(spec_name(s)).format, s.format) << n;
    EXPECT_EQ(spec_name(parse_spec(spec_name(s))), spec_name(s)) << n;
  }
  EXPECT_EQ(parse_spec("int4").group, 128);
  EXPECT_EQ(parse_spec("int4-g64").group, 64);
  EXPECT_EQ(parse_spec("int4-asym-g64").format, Format::int4_asym);
  EXPECT_EQ(parse_spec("nf4").group, 64);
  EXPECT_TRUE(parse_spec("nf4-dq").double_quant);
  EXPECT_FALSE(parse_spec("fp8-e5m2-tensor").per_channel);
  EXPECT_TRUE(parse_spec("fp8-e4m3").per_channel);
  EXPECT_EQ(spec_name(parse_spec("int4")), "int4-g128");
  EXPECT_EQ(spec_name(parse_spec("nf4-dq")), "nf4-dq-g64");
  for (const char* bad : {"", "int3", "int4-g0", "int4-g-5", "int4-gx", "int4-g", "fp8", "fp8-e4m4", "int8-g64",
                          "nf4-dq-dq", "INT8", "int4-asym-g64-", "fp8-e4m3-tensor-x"}) {
    const std::string msg = test::error_of([&] { parse_spec(bad); });
    EXPECT_NE(msg, "(no error)") << "'" << bad << "'";
    EXPECT_NE(msg.find("int4-asym"), std::string::npos) << msg;  // lists the valid forms
  }
}

// ---------------------------------------------------------------- layouts

TEST(QuantLayout, ExactSizes) {
  const int64_t n = 4096;
  const auto sz = [&](const char* s) { return layout(parse_spec(s), n, n).total_bytes(); };
  EXPECT_EQ(sz("int4-g128"), std::size_t(n * n / 2 + n * 32 * 2));
  EXPECT_EQ(sz("int4-asym-g128"), std::size_t(n * n / 2 + n * 32 * 2 + n * 16));
  EXPECT_EQ(sz("int8"), std::size_t(n * n + n * 2));
  EXPECT_EQ(sz("fp8-e4m3"), std::size_t(n * n + n * 4));
  EXPECT_EQ(sz("fp8-e5m2-tensor"), std::size_t(n * n + 4));
  EXPECT_EQ(sz("nf4"), std::size_t(n * n / 2 + n * 64 * 4));
  EXPECT_EQ(sz("nf4-dq"), std::size_t(n * n / 2 + n * 64 + n * 64 / 256 * 4 + 4));
  EXPECT_NEAR(layout(parse_spec("nf4-dq"), n, n).bits_per_weight(), 4.0 + 8.0 / 64 + 32.0 / (64 * 256) + 32.0 / (n * n), 1e-12);
  EXPECT_NEAR(layout(parse_spec("nf4-dq"), 8192, 8192).bits_per_weight(), 4.127, 0.0005);
  EXPECT_DOUBLE_EQ(layout(parse_spec("int4-g128"), n, n).bits_per_weight(), 4.125);
  EXPECT_DOUBLE_EQ(layout(parse_spec("nf4"), n, n).bits_per_weight(), 4.5);

  // Odd shapes: per-row code padding, short last groups, 16-byte aligned sections.
  const QLayout L = layout(parse_spec("int4-asym-g2"), 3, 5);  // 3 groups per row (2, 2, 1)
  EXPECT_EQ(L.groups_per_row, 3);
  EXPECT_EQ(L.row_bytes, 3);
  EXPECT_EQ(L.zero_row_bytes, 2);
  EXPECT_EQ(L.codes.offset, 0u);
  EXPECT_EQ(L.codes.bytes, 9u);
  EXPECT_EQ(L.scales.offset, 16u);
  EXPECT_EQ(L.scales.bytes, 18u);
  EXPECT_EQ(L.zeros.offset, 48u);
  EXPECT_EQ(L.zeros.bytes, 6u);
  EXPECT_EQ(L.total_bytes(), 54u);
  EXPECT_EQ(L.num_params(), 9);
  const QLayout D = layout(parse_spec("nf4-dq-g3"), 7, 1000);  // 334 groups per row, 2338 absmax, 10 dq blocks
  EXPECT_EQ(D.codes.bytes, 7u * 500);
  EXPECT_EQ(D.scales.offset, 3504u);
  EXPECT_EQ(D.scales.bytes, 2338u);
  EXPECT_EQ(D.dq_scales.offset, 5856u);
  EXPECT_EQ(D.dq_scales.bytes, 40u);
  EXPECT_EQ(D.dq_mean.offset, 5904u);
  EXPECT_EQ(D.total_bytes(), 5908u);
  EXPECT_EQ(layout(parse_spec("fp8-e4m3-tensor"), 3, 3).num_params(), 1);
  EXPECT_EQ(layout(parse_spec("int8"), 3, 3).group, 3);
  EXPECT_EQ(layout(parse_spec("int4-g128"), 3, 100).group, 100);  // group larger than K: one group of K
}

TEST(QuantLayout, BadArgumentsThrow) {
  Spec s = parse_spec("int4");
  s.group = 0;
  EXPECT_NE(test::error_of([&] { layout(s, 4, 4); }).find("group"), std::string::npos);
  s.group = -3;
  EXPECT_THROW(layout(s, 4, 4), Error);
  EXPECT_THROW(layout(parse_spec("int8"), 0, 4), Error);
  EXPECT_THROW(layout(parse_spec("int8"), 4, -1), Error);
  Spec d = parse_spec("int8");
  d.double_quant = true;
  EXPECT_THROW(layout(d, 4, 4), Error);
}

// ---------------------------------------------------------------- packing

TEST(QuantPacking, NibbleOrderOnAHandWrittenRow) {
  // int4 (zero 8), scale 1: values -8, -7, 1, 7, 0 -> codes 0, 1, 9, 15, 8; odd K pads with the zero code 8.
  const QLayout L = layout(parse_spec("int4-g128"), 1, 5);
  const std::vector<float> W = {-8, -7, 1, 7, 0};
  const GroupParams p{1.f, 8.f};
  std::vector<uint8_t> blob(L.total_bytes(), 0xAB);
  quantize(L, W.data(), blob.data(), &p);
  EXPECT_EQ(blob[0], 0x10);
  EXPECT_EQ(blob[1], 0xF9);
  EXPECT_EQ(blob[2], 0x88);
  for (std::size_t i = 3; i < L.scales.offset; ++i) EXPECT_EQ(blob[i], 0) << "padding is zeroed";
  uint16_t sbits;
  std::memcpy(&sbits, blob.data() + L.scales.offset, 2);
  EXPECT_EQ(sbits, 0x3C00);  // fp16 1.0
  std::vector<float> out(5);
  dequantize(L, blob.data(), out.data());
  EXPECT_EQ(out, W);

  // int4-asym, 2 rows x 3 groups of 2 (K = 6): zero points 3, 0, 15 / 1, 2, 4, packed per row, low nibble first.
  const QLayout A = layout(parse_spec("int4-asym-g2"), 2, 6);
  const std::vector<GroupParams> ps = {{1, 3}, {1, 0}, {1, 15}, {0.5f, 1}, {0.5f, 2}, {0.5f, 4}};
  std::vector<float> WA = {-3, 0, 0, 15, -15, 0, -0.5f, 7, -1, 6.5f, 0, -2};
  std::vector<uint8_t> ba(A.total_bytes());
  quantize(A, WA.data(), ba.data(), ps.data());
  const uint8_t* z = ba.data() + A.zeros.offset;
  EXPECT_EQ(z[0], 0x03);
  EXPECT_EQ(z[1], 0x0F);
  EXPECT_EQ(z[2], 0x21);
  EXPECT_EQ(z[3], 0x04);
  // codes row 0: q = x/s + z -> 0, 3, 0, 15, 0, 15 ; row 1: 0, 15, 0, 15, 4, 0
  EXPECT_EQ(ba[0], 0x30);
  EXPECT_EQ(ba[1], 0xF0);
  EXPECT_EQ(ba[2], 0xF0);
  EXPECT_EQ(ba[3], 0xF0);
  EXPECT_EQ(ba[4], 0xF0);
  EXPECT_EQ(ba[5], 0x04);
  std::vector<float> outa(WA.size());
  dequantize(A, ba.data(), outa.data());
  EXPECT_EQ(outa, WA);
}

// ---------------------------------------------------------------- round trips

TEST(QuantRoundTrip, RepresentableValuesAreExact) {
  const int64_t K = 40;
  // int8: scale 2^-7, every code.
  {
    const QLayout L = layout(parse_spec("int8"), 2, 255);
    std::vector<float> W(2 * 255);
    for (int i = 0; i < 255; ++i) W[i] = W[255 + i] = static_cast<float>(i - 127) * 0x1p-7f;
    EXPECT_EQ(roundtrip(L, W), W);
    EXPECT_EQ(fit_group(L.spec, W.data(), 255).scale, 0x1p-7f);
  }
  // int4 / int4-asym: grid values under given params, including a short last group.
  for (const char* n : {"int4-g16", "int4-asym-g16"}) {
    const QLayout L = layout(parse_spec(n), 3, K);
    std::vector<GroupParams> P(static_cast<std::size_t>(L.num_params()));
    std::vector<float> W(3 * K);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t g = 0; g < L.groups_per_row; ++g) {
        GroupParams& p = P[r * L.groups_per_row + g];
        p.scale = to_float(to_f16(0.37f * static_cast<float>(r + g + 1)));
        p.zero = L.spec.format == Format::int4 ? 8.f : static_cast<float>((5 * r + 3 * g) % 16);
        for (int64_t k = g * 16; k < std::min(K, g * 16 + 16); ++k)
          W[r * K + k] = p.scale * (static_cast<float>((k * 7 + r) % 16) - p.zero);
      }
    EXPECT_EQ(roundtrip(L, W, P.data()), W) << n;
  }
  // fp8: every finite value, with the format's max in the tensor (scale exactly 1).
  for (const char* n : {"fp8-e4m3-tensor", "fp8-e5m2-tensor", "fp8-e4m3", "fp8-e5m2"}) {
    const Spec s = parse_spec(n);
    auto dec = s.format == Format::fp8_e4m3 ? fp8_e4m3_decode : fp8_e5m2_decode;
    const float mx = s.format == Format::fp8_e4m3 ? fp8_e4m3_max : fp8_e5m2_max;
    std::vector<float> W;
    for (int c = 0; c < 256; ++c)
      if (std::isfinite(dec(static_cast<uint8_t>(c)))) W.push_back(dec(static_cast<uint8_t>(c)));
    const auto cols = static_cast<int64_t>(W.size()) / 2;
    W.resize(static_cast<std::size_t>(2 * cols));
    W[0] = mx;
    W[cols] = -mx;
    const QLayout L = layout(s, 2, cols);
    const std::vector<float> out = roundtrip(L, W);
    for (std::size_t i = 0; i < W.size(); ++i) EXPECT_EQ(fbits(out[i]), fbits(W[i])) << n << " " << i;
  }
  // nf4: codes times an absmax that appears in each block.
  for (const char* n : {"nf4", "nf4-g16"}) {
    const QLayout L = layout(parse_spec(n), 2, 64);
    std::vector<float> W(128);
    for (int i = 0; i < 128; ++i) W[i] = nf4_code((i * 5) % 16) * 2.5f;
    W[0] = W[16] = W[32] = W[48] = W[64] = W[80] = W[96] = W[112] = -2.5f;
    EXPECT_EQ(roundtrip(L, W), W) << n;
  }
}

TEST(QuantRoundTrip, QdqEqualsDequantizeOfQuantize) {
  for (const char* n : all_specs) {
    const Spec s = parse_spec(n);
    if (s.double_quant) continue;  // the dequantized absmax differs from fit_group's (tested below)
    const int64_t N = 9, K = 150;
    const std::vector<float> W = normal_matrix(N * K, 5, 0.02);
    const QLayout L = layout(s, N, K);
    const std::vector<float> out = roundtrip(L, W);
    const GroupParams pt = fit_group(s, W.data(), N * K);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t g = 0; g < L.groups_per_row; ++g) {
        const int64_t k0 = g * L.group, k1 = std::min(K, k0 + L.group);
        const GroupParams p = s.per_channel || !(s.format == Format::fp8_e4m3 || s.format == Format::fp8_e5m2)
                                  ? fit_group(s, W.data() + r * K + k0, k1 - k0)
                                  : pt;
        for (int64_t k = k0; k < k1; ++k)
          ASSERT_EQ(fbits(qdq(s, W[r * K + k], p)), fbits(out[r * K + k])) << n << " r" << r << " k" << k;
      }
    // Parameters given explicitly (as GPTQ / AWQ pass them) give the same blob as RTN.
    std::vector<GroupParams> P;
    if (L.num_params() == 1) {
      P.push_back(pt);
    } else {
      for (int64_t r = 0; r < N; ++r)
        for (int64_t g = 0; g < L.groups_per_row; ++g) {
          const int64_t k0 = g * L.group, k1 = std::min(K, k0 + L.group);
          P.push_back(fit_group(s, W.data() + r * K + k0, k1 - k0));
        }
    }
    std::vector<uint8_t> a(L.total_bytes()), b(L.total_bytes());
    quantize(L, W.data(), a.data());
    quantize(L, W.data(), b.data(), P.data());
    EXPECT_EQ(a, b) << n;
  }
}

TEST(QuantRoundTrip, IntErrorWithinHalfAStep) {
  for (const char* n : {"int8", "int4-g32", "int4-g128", "int4-g7", "int4-asym-g64", "int4-asym-g33"}) {
    const Spec s = parse_spec(n);
    const int64_t N = 16, K = 515;
    std::vector<float> W = normal_matrix(N * K, 7, 0.05);
    for (int64_t k = 0; k < K; ++k) W[3 * K + k] = std::fabs(W[3 * K + k]) + 0.01f;  // an all-positive row
    for (int64_t k = 0; k < K; ++k) W[4 * K + k] = -std::fabs(W[4 * K + k]) - 0.3f;  // an all-negative row
    W[5 * K + 10] = 40.f;                                                            // an outlier
    const QLayout L = layout(s, N, K);
    const std::vector<float> out = roundtrip(L, W);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t g = 0; g < L.groups_per_row; ++g) {
        const int64_t k0 = g * L.group, k1 = std::min(K, k0 + L.group);
        const GroupParams p = fit_group(s, W.data() + r * K + k0, k1 - k0);
        EXPECT_EQ(to_float(to_f16(p.scale)), p.scale);  // storage precision
        for (int64_t k = k0; k < k1; ++k) {
          const float x = W[r * K + k];
          ASSERT_LE(std::fabs(x - out[r * K + k]), 0.5f * p.scale * (1 + 1e-6f) + 1e-7f * std::fabs(x))
              << n << " r" << r << " k" << k << " scale " << p.scale;
        }
      }
  }
}

TEST(QuantRoundTrip, FloatFormatsRelativeError) {
  // fp8: relative error <= 2^-(m+1) for values in the normal range of x/scale; nf4: within half the
  // largest gap between neighbouring codes (-1 .. -0.696) times absmax.
  const int64_t N = 8, K = 256;
  const std::vector<float> W = normal_matrix(N * K, 9);
  for (const char* n : {"fp8-e4m3", "fp8-e5m2"}) {
    const Spec s = parse_spec(n);
    const float rel = s.format == Format::fp8_e4m3 ? 0x1p-4f : 0x1p-3f;
    const std::vector<float> out = roundtrip(layout(s, N, K), W);
    for (int64_t i = 0; i < N * K; ++i) {
      const float amax = fit_group(s, W.data() + (i / K) * K, K).scale * (s.format == Format::fp8_e4m3 ? 448.f : 57344.f);
      if (std::fabs(W[i]) > amax * 0x1p-6f) {
        EXPECT_LE(std::fabs(W[i] - out[i]), rel * std::fabs(W[i]) * 1.0001f) << n;
      }
    }
  }
  const Spec s = parse_spec("nf4");
  const std::vector<float> out = roundtrip(layout(s, N, K), W);
  for (int64_t i = 0; i < N * K; ++i) {
    const float a = fit_group(s, W.data() + (i / 64) * 64, 64).scale;
    EXPECT_LE(std::fabs(W[i] - out[i]), a * (1.f - 0.6961928009986877f) / 2 * 1.0001f);
  }
}

TEST(QuantDoubleQuant, AbsmaxWithinHalfAnInt8StepAndCodesMatchIt) {
  const int64_t N = 40, K = 640;  // 400 absmax values: blocks of 256 and 144
  std::vector<float> W = normal_matrix(N * K, 13, 0.1);
  for (int64_t k = 0; k < 64; ++k) W[7 * K + k] = 0.f;  // an all-zero block
  const Spec s = parse_spec("nf4-dq");
  const QLayout L = layout(s, N, K);
  std::vector<uint8_t> blob(L.total_bytes());
  quantize(L, W.data(), blob.data());
  std::vector<float> out(W.size());
  dequantize(L, blob.data(), out.data());
  float s8[2];
  std::memcpy(s8, blob.data() + L.dq_scales.offset, 8);
  float mean;
  std::memcpy(&mean, blob.data() + L.dq_mean.offset, 4);
  double sum = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < L.groups_per_row; ++g) sum += fit_group(s, W.data() + r * K + g * 64, 64).scale;
  EXPECT_FLOAT_EQ(mean, static_cast<float>(sum / (N * L.groups_per_row)));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < L.groups_per_row; ++g) {
      const int64_t i = r * L.groups_per_row + g;
      const float a = fit_group(s, W.data() + r * K + g * 64, 64).scale;
      const GroupParams p = stored_params(L, blob.data(), r, g);
      EXPECT_LE(std::fabs(p.scale - a), 0.5f * s8[i / 256] * 1.001f + 1e-7f) << i;
      for (int64_t k = g * 64; k < g * 64 + 64; ++k)  // codes chosen against the dequantized absmax
        ASSERT_EQ(fbits(out[r * K + k]), fbits(qdq(s, W[r * K + k], p))) << i;
    }
  for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(out[7 * K + k], 0.f);
  EXPECT_THROW(quantize(L, W.data(), blob.data(), std::vector<GroupParams>(N * 10, GroupParams{1, 0}).data()), Error);
}

// ---------------------------------------------------------------- edge cases

TEST(QuantEdge, AllZeroGroupIsExactZeros) {
  for (const char* n : all_specs) {
    const Spec s = parse_spec(n);
    const int64_t N = 3, K = 300;
    std::vector<float> W = normal_matrix(N * K, 17);
    for (int64_t k = 0; k < K; ++k) W[1 * K + k] = 0.f;  // a whole row: every group of it
    const QLayout L = layout(s, N, K);
    std::vector<uint8_t> blob(L.total_bytes());
    quantize(L, W.data(), blob.data());
    std::vector<float> out(W.size());
    dequantize(L, blob.data(), out.data());
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(fbits(out[K + k]), 0u) << n << " k" << k;
    const bool tensor_scale = (s.format == Format::fp8_e4m3 || s.format == Format::fp8_e5m2) && !s.per_channel;
    if (!s.double_quant && !tensor_scale)
      for (int64_t g = 0; g < L.groups_per_row; ++g) {
        EXPECT_EQ(stored_params(L, blob.data(), 1, g).scale, 0.f) << n;
      }
    const GroupParams z = fit_group(s, W.data() + K, K);
    EXPECT_EQ(z.scale, 0.f);
    EXPECT_EQ(qdq(s, 0.f, z), 0.f);
    EXPECT_EQ(qdq(s, 1.f, z), 0.f);  // scale 0: everything to the zero code, no division by zero
  }
  // A whole zero matrix, every format (fp8 per tensor: scale 0).
  for (const char* n : all_specs) {
    const std::vector<float> W(4 * 70, 0.f);
    const std::vector<float> out = roundtrip(layout(parse_spec(n), 4, 70), W);
    for (float v : out) ASSERT_EQ(fbits(v), 0u) << n;
  }
}

TEST(QuantEdge, NonFiniteWeightNamesRowAndColumn) {
  for (const char* n : all_specs) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> W = normal_matrix(5 * 9, 3);
      W[2 * 9 + 3] = bad;
      const QLayout L = layout(parse_spec(n), 5, 9);
      std::vector<uint8_t> blob(L.total_bytes());
      const std::string msg = test::error_of([&] { quantize(L, W.data(), blob.data()); });
      EXPECT_NE(msg.find("row 2"), std::string::npos) << n << ": " << msg;
      EXPECT_NE(msg.find("column 3"), std::string::npos) << n << ": " << msg;
      EXPECT_NE(msg.find(std::isnan(bad) ? "NaN" : "Inf"), std::string::npos) << msg;
      EXPECT_THROW(fit_group(parse_spec(n), W.data() + 18, 9), Error) << n;
    }
  }
}

TEST(QuantEdge, ShortLastGroupHasItsOwnParameters) {
  const int64_t K = 100;  // g64: groups of 64 and 36
  for (const char* n : {"int4-g64", "int4-asym-g64", "nf4"}) {
    const Spec s = parse_spec(n);
    std::vector<float> W = normal_matrix(2 * K, 21);
    for (int64_t k = 64; k < K; ++k) W[k] *= 0.01f;  // the short group is much smaller
    const QLayout L = layout(s, 2, K);
    EXPECT_EQ(L.groups_per_row, 2);
    std::vector<uint8_t> blob(L.total_bytes());
    quantize(L, W.data(), blob.data());
    const GroupParams want = fit_group(s, W.data() + 64, 36);
    const GroupParams got = stored_params(L, blob.data(), 0, 1);
    EXPECT_EQ(got.scale, want.scale) << n;
    EXPECT_EQ(got.zero, want.zero) << n;
    EXPECT_LT(got.scale, 0.1f * stored_params(L, blob.data(), 0, 0).scale) << n;
  }
}

TEST(QuantEdge, ParamsMustBeInStoragePrecision) {
  const QLayout L = layout(parse_spec("int4-g4"), 1, 4);
  const std::vector<float> W = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<uint8_t> blob(L.total_bytes());
  GroupParams p{0.1f, 8.f};  // 0.1 is not an fp16 value
  EXPECT_THROW(quantize(L, W.data(), blob.data(), &p), Error);
  p = {to_float(to_f16(0.1f)), 3.f};  // int4 symmetric needs zero 8
  EXPECT_THROW(quantize(L, W.data(), blob.data(), &p), Error);
  p = {to_float(to_f16(0.1f)), 8.f};
  EXPECT_NO_THROW(quantize(L, W.data(), blob.data(), &p));
  const QLayout A = layout(parse_spec("int4-asym-g4"), 1, 4);
  std::vector<uint8_t> ba(A.total_bytes());
  GroupParams q{to_float(to_f16(0.1f)), 16.f};
  EXPECT_THROW(quantize(A, W.data(), ba.data(), &q), Error);
  q.zero = 2.5f;
  EXPECT_THROW(quantize(A, W.data(), ba.data(), &q), Error);
  // An fp16 scale overflow is an Error, not Inf.
  const float huge[2] = {1e7f, -1e7f};
  EXPECT_THROW(fit_group(parse_spec("int4"), huge, 2), Error);
}
