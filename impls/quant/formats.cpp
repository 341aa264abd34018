// Host side of the quantization formats: fitting, names, layouts, quantize / dequantize.
#include "impls/quant/formats.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

namespace memtrade::quant {

namespace {

bool has_f16_scale(Format f) { return traits(f).scale == ScaleType::f16; }
bool per_tensor(const Spec& s) { return traits(s.format).per_tensor_option && !s.per_channel; }

// The smallest fp16 value >= v (v >= 0 finite). Error when that is beyond fp16's range.
float round_up_f16(float v, const char* what) {
  f16_t h = to_f16(v);
  if (to_float(h) < v) ++h.bits;  // v > 0 here; the next bit pattern is the next larger value
  const float r = to_float(h);
  if (!std::isfinite(r))
    throw Error(std::string(what) + ": scale " + std::to_string(v) + " overflows fp16 (max 65504)");
  return r;
}

std::size_t align_up(std::size_t v) { return (v + section_align - 1) / section_align * section_align; }

template <class T>
void store(uint8_t* blob, const Section& s, int64_t i, T v) {
  std::memcpy(blob + s.offset + static_cast<std::size_t>(i) * sizeof(T), &v, sizeof(T));
}
template <class T>
T load(const uint8_t* blob, const Section& s, int64_t i) {
  T v;
  std::memcpy(&v, blob + s.offset + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
  return v;
}

static_assert(sizeof(f16_t) == 2 && sizeof(float) == 4 && sizeof(int8_t) == 1);

std::string finite_error(const char* where, float v, int64_t r, int64_t c) {
  return std::string(where) + ": weight at row " + std::to_string(r) + ", column " + std::to_string(c) + " is " +
         (std::isnan(v) ? "NaN" : "Inf") + " (only finite weights can be quantized)";
}

}  // namespace

const char* format_name(Format f) { return traits(f).name; }

int64_t group_size(const Spec& s, int64_t cols) {
  if (!traits(s.format).grouped) return cols;
  if (s.group <= 0) throw Error("quant: group size must be > 0, got " + std::to_string(s.group));
  return std::min(s.group, cols);
}

GroupParams fit_group(const Spec& s, const float* w, int64_t n) {
  if (n <= 0) throw Error("fit_group: group of " + std::to_string(n) + " values");
  float mn = 0.f, mx = 0.f;  // min / max including 0
  for (int64_t i = 0; i < n; ++i) {
    const float v = w[i];
    if (!std::isfinite(v))
      throw Error("fit_group: value " + std::to_string(i) + " of the group is " + (std::isnan(v) ? "NaN" : "Inf"));
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  const float amax = std::max(std::fabs(mn), std::fabs(mx));  // +0 for an all-zero group (never -0)
  const FormatTraits& t = traits(s.format);
  const std::string what = std::string("fit_group ") + t.name;
  GroupParams p;
  if (t.zero == ZeroPoint::packed4) {  // asymmetric: the grid spans [min, max]
    if (mx > mn) {
      p.scale = round_up_f16((mx - mn) / t.qmax, what.c_str());
      p.zero = std::clamp(std::rint(-mn / p.scale), 0.f, 15.f);
    }
    return p;
  }
  if (t.scale == ScaleType::f16) p.scale = amax > 0.f ? round_up_f16(amax / t.qmax, what.c_str()) : 0.f;
  else p.scale = t.qmax == 1.f ? amax : amax / t.qmax;
  if (t.zero == ZeroPoint::fixed8) p.zero = 8.f;
  return p;
}

// ------------------------------------------------------------------------------------- names

namespace {
const char* spec_forms =
    "int8, int4[-gN], int4-asym[-gN], fp8-e4m3[-tensor], fp8-e5m2[-tensor], nf4[-dq][-gN] (N > 0; int4 "
    "default g128, nf4 default g64)";

[[noreturn]] void bad_spec(std::string_view name, const std::string& why) {
  throw Error("unknown quantization spec '" + std::string(name) + "'" + (why.empty() ? "" : " (" + why + ")") +
              "; expected one of " + spec_forms);
}
}  // namespace

Spec parse_spec(std::string_view name) {
  std::vector<std::string_view> tok;
  for (std::size_t p = 0;;) {
    const std::size_t q = name.find('-', p);
    tok.push_back(name.substr(p, q == std::string_view::npos ? std::string_view::npos : q - p));
    if (q == std::string_view::npos) break;
    p = q + 1;
  }
  Spec s;
  std::size_t i = 1;
  auto take = [&](std::string_view t) {
    if (i < tok.size() && tok[i] == t) {
      ++i;
      return true;
    }
    return false;
  };
  auto take_group = [&] {
    if (i < tok.size() && tok[i].size() >= 2 && tok[i][0] == 'g') {
      const std::string_view d = tok[i].substr(1);
      int64_t g = 0;
      const auto [ptr, ec] = std::from_chars(d.data(), d.data() + d.size(), g);
      if (ec != std::errc() || ptr != d.data() + d.size()) bad_spec(name, "bad group '" + std::string(tok[i]) + "'");
      if (g <= 0) bad_spec(name, "group size must be > 0");
      s.group = g;
      ++i;
    }
  };
  const std::string_view head = tok[0];
  if (head == "int8") {
    s.format = Format::int8;
  } else if (head == "int4") {
    s.format = take("asym") ? Format::int4_asym : Format::int4;
    take_group();
  } else if (head == "fp8") {
    if (take("e4m3"))
      s.format = Format::fp8_e4m3;
    else if (take("e5m2"))
      s.format = Format::fp8_e5m2;
    else
      bad_spec(name, "fp8 needs e4m3 or e5m2");
    if (take("tensor")) s.per_channel = false;
  } else if (head == "nf4") {
    s.format = Format::nf4;
    s.group = traits(Format::nf4).default_group;
    s.double_quant = take("dq");
    take_group();
  } else {
    bad_spec(name, "");
  }
  if (i != tok.size()) bad_spec(name, "unexpected '" + std::string(tok[i]) + "'");
  return s;
}

std::string spec_name(const Spec& s) {
  std::string n = format_name(s.format);
  if (s.format == Format::nf4 && s.double_quant) n += "-dq";
  if (traits(s.format).grouped) n += "-g" + std::to_string(s.group);
  if (per_tensor(s)) n += "-tensor";
  return n;
}

// ------------------------------------------------------------------------------------- layout

bool rows_independent(const Spec& s) { return !per_tensor(s) && !s.double_quant; }

int64_t QLayout::num_params() const { return per_tensor(spec) ? 1 : rows * groups_per_row; }

QLayout layout(const Spec& s, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0)
    throw Error("quant layout: rows and cols must be > 0, got " + std::to_string(rows) + " x " + std::to_string(cols));
  if (s.double_quant && s.format != Format::nf4) throw Error("quant layout: double quantization is nf4 only");
  QLayout L;
  L.spec = s;
  L.rows = rows;
  L.cols = cols;
  L.group = group_size(s, cols);
  L.groups_per_row = (cols + L.group - 1) / L.group;
  const FormatTraits& t = traits(s.format);
  L.row_bytes = t.code_bits == 4 ? (cols + 1) / 2 : cols;
  L.zero_row_bytes = t.zero == ZeroPoint::packed4 ? (L.groups_per_row + 1) / 2 : 0;

  const auto R = static_cast<std::size_t>(rows);
  const auto ngroups = R * static_cast<std::size_t>(L.groups_per_row);
  std::size_t end = 0;
  auto add = [&](std::size_t bytes) {
    Section sec;
    if (bytes == 0) {
      sec.offset = end;
      return sec;
    }
    sec.offset = align_up(end);
    sec.bytes = bytes;
    end = sec.offset + bytes;
    return sec;
  };
  L.codes = add(R * static_cast<std::size_t>(L.row_bytes));
  const std::size_t nscales = per_tensor(s) ? 1 : t.grouped ? ngroups : R;
  if (s.double_quant) {  // nf4: int8 absmax codes, an fp32 scale per block of them, one fp32 mean
    L.scales = add(nscales * sizeof(int8_t));
    L.dq_scales = add((nscales + nf4_dq_block - 1) / nf4_dq_block * sizeof(float));
    L.dq_mean = add(sizeof(float));
  } else {
    L.scales = add(nscales * (t.scale == ScaleType::f16 ? sizeof(f16_t) : sizeof(float)));
  }
  if (t.zero == ZeroPoint::packed4) L.zeros = add(R * static_cast<std::size_t>(L.zero_row_bytes));
  L.total = end;
  return L;
}

// ------------------------------------------------------------------------------------- quantize

namespace {

void check_params(const QLayout& L, const GroupParams* params) {
  const Format f = L.spec.format;
  const int64_t n = L.num_params();
  for (int64_t i = 0; i < n; ++i) {
    const GroupParams& p = params[i];
    const std::string where = "quantize: params[" + std::to_string(i) + "] (row " +
                              std::to_string(i / L.groups_per_row) + ", group " + std::to_string(i % L.groups_per_row) +
                              ")";
    if (!std::isfinite(p.scale) || p.scale < 0.f) throw Error(where + ": scale must be finite and >= 0");
    if (has_f16_scale(f) && to_float(to_f16(p.scale)) != p.scale)
      throw Error(where + ": scale " + std::to_string(p.scale) + " is not an fp16 value (round it to storage precision)");
    const float want_zero = traits(f).zero == ZeroPoint::fixed8 ? 8.f : 0.f;
    if (traits(f).zero == ZeroPoint::packed4) {
      if (!(p.zero >= 0.f && p.zero <= 15.f && std::rint(p.zero) == p.zero))
        throw Error(where + ": int4-asym zero point must be an integer in [0, 15]");
    } else if (p.zero != want_zero) {
      throw Error(where + ": zero must be " + std::to_string(static_cast<int>(want_zero)) + " for " + format_name(f));
    }
  }
}

}  // namespace

void quantize(const QLayout& L, const float* W, uint8_t* blob, const GroupParams* params) {
  const Format f = L.spec.format;
  const int64_t N = L.rows, K = L.cols, G = L.group, ng = L.groups_per_row;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c)
      if (!std::isfinite(W[r * K + c])) throw Error(finite_error("quantize", W[r * K + c], r, c));
  if (L.spec.double_quant && params)
    throw Error("quantize: nf4 double quantization fits its own parameters (pass params = nullptr)");

  // Parameters per (row, group), in storage precision.
  std::vector<GroupParams> P(static_cast<std::size_t>(N * ng));
  if (params) {
    check_params(L, params);
    if (L.num_params() == 1)
      std::fill(P.begin(), P.end(), params[0]);
    else
      std::copy(params, params + N * ng, P.begin());
  } else if (per_tensor(L.spec)) {
    std::fill(P.begin(), P.end(), fit_group(L.spec, W, N * K));
  } else {
    for (int64_t r = 0; r < N; ++r)
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
        P[r * ng + g] = fit_group(L.spec, W + r * K + k0, k1 - k0);
      }
  }

  std::memset(blob, 0, L.total);

  // Scales (and zero points, double quantization).
  if (f == Format::nf4 && L.spec.double_quant) {
    const int64_t n = N * ng;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += P[i].scale;
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    store<float>(blob, L.dq_mean, 0, mean);
    for (int64_t b0 = 0; b0 < n; b0 += nf4_dq_block) {
      const int64_t b1 = std::min(n, b0 + nf4_dq_block);
      float cmax = 0.f;
      for (int64_t i = b0; i < b1; ++i) cmax = std::max(cmax, std::fabs(P[i].scale - mean));
      const float s8 = cmax / 127.f;
      store<float>(blob, L.dq_scales, b0 / nf4_dq_block, s8);
      for (int64_t i = b0; i < b1; ++i) {
        const float q = s8 > 0.f ? std::clamp(std::rint((P[i].scale - mean) / s8), -127.f, 127.f) : 0.f;
        const auto q8 = static_cast<int8_t>(q);
        store<int8_t>(blob, L.scales, i, q8);
        P[i].scale = nf4_dq_absmax(q8, s8, mean);  // encode against the absmax decoding will use
      }
    }
  } else {
    const FormatTraits& t = traits(f);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t g = 0; g < ng; ++g) {
        const GroupParams& p = P[r * ng + g];
        // The scale's slot: per group, per row (the row's first group), or per tensor (the first group).
        const int64_t slot = t.grouped ? r * ng + g : per_tensor(L.spec) ? 0 : r;
        if (!t.grouped && (g != 0 || (per_tensor(L.spec) && r != 0))) continue;
        if (t.scale == ScaleType::f16) store<f16_t>(blob, L.scales, slot, to_f16(p.scale));
        else store<float>(blob, L.scales, slot, p.scale);
        if (t.zero == ZeroPoint::packed4) {
          uint8_t* z = blob + L.zeros.offset + r * L.zero_row_bytes + (g >> 1);
          *z = static_cast<uint8_t>(*z | (static_cast<uint8_t>(p.zero) << (4 * (g & 1))));
        }
      }
  }

  // Codes.
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    const float* w = W + r * K;
    for (int64_t g = 0; g < ng; ++g) {
      const GroupParams& p = P[r * ng + g];
      const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
      for (int64_t k = k0; k < k1; ++k) {
        const uint8_t q = encode_value(f, w[k], p.scale, p.zero);
        if (four_bit(f))
          row[k >> 1] = static_cast<uint8_t>(row[k >> 1] | (q << (4 * (k & 1))));
        else
          row[k] = q;
      }
    }
    if (four_bit(f) && (K & 1)) {  // pad nibble: the code of zero in the last group
      const GroupParams& p = P[r * ng + ng - 1];
      row[K >> 1] = static_cast<uint8_t>(row[K >> 1] | (encode_value(f, 0.f, p.scale, p.zero) << 4));
    }
  }
}

void dequantize(const QLayout& L, const uint8_t* blob, float* W) {
  const Format f = L.spec.format;
  const int64_t N = L.rows, K = L.cols, G = L.group, ng = L.groups_per_row;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    for (int64_t g = 0; g < ng; ++g) {
      const GroupParams p = stored_params(L, blob, r, g);
      const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
      for (int64_t k = k0; k < k1; ++k)
        W[r * K + k] = decode_value(f, four_bit(f) ? nibble(row, k) : row[k], p.scale, p.zero);
    }
  }
}

}  // namespace memtrade::quant
