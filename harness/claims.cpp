#include "harness/claims.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "harness/stats.hpp"

namespace memtrade {

namespace {
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

std::string fmt(const char* f, double a, double b, double c) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

std::string Band::str() const {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "literal" + a temporary string.
  std::string s;
  if (lo && hi) s.append("[").append(num(*lo)).append(", ").append(num(*hi)).append("]");
  else if (lo) s.append(">= ").append(num(*lo));
  else if (hi) s.append("<= ").append(num(*hi));
  else s = "any value";
  return s;
}

double fp16_kv_bytes_per_token(const Json& model) {
  return 2.0 * model.at("layers").get<double>() * model.at("kv_heads").get<double>() * model.at("head_dim").get<double>() * 2;
}

Band claim_band(const ClaimSpec& spec, const std::string& key) {
  const auto fail = [&](const std::string& why) {
    return Error("claim '" + spec.id + "': '" + key + "' " + why + " (expected [lo, hi], null for no limit)");
  };
  if (!spec.data.is_object() || !spec.data.contains(key)) throw fail("is missing");
  const Json& b = spec.data[key];
  if (!b.is_array() || b.size() != 2) throw fail("is not a two-element list");
  Band out;
  for (int i = 0; i < 2; ++i) {
    if (b[i].is_null()) continue;
    if (!b[i].is_number() || !std::isfinite(b[i].get<double>())) throw fail("holds a non-number");
    (i == 0 ? out.lo : out.hi) = b[i].get<double>();
  }
  if (out.lo && out.hi && *out.lo > *out.hi) throw fail("has lo > hi");
  return out;
}

std::string decide(double v, double u, const Band& band) {
  if (std::isnan(v) || std::isnan(u)) return "inconclusive";
  u = std::fabs(u);
  const double a = v - u, b = v + u;
  if (band.contains(a) && band.contains(b)) return "reproduced";
  // Entirely outside: both ends on the same side of the band.
  if ((band.hi && a > *band.hi) || (band.lo && b < *band.lo)) return "not_reproduced";
  return "inconclusive";
}

std::string combine_verdicts(const std::vector<std::string>& vs) {
  if (vs.empty()) return "inconclusive";
  int rep = 0, not_rep = 0;
  for (const auto& v : vs) {
    rep += v == "reproduced";
    not_rep += v == "not_reproduced";
  }
  if (rep == static_cast<int>(vs.size())) return "reproduced";
  if (not_rep > 0) return "not_reproduced";
  return "inconclusive";
}

TimeRatio time_ratio(const Record& num, const Record& den, double noise) {
  const double ratio = stats::median(num.times_s) / stats::median(den.times_s);
  return {ratio, ratio * std::max(noise, std::hypot(stats::cv(num.times_s), stats::cv(den.times_s)))};
}

const Record* same_case(const std::vector<Record>& recs, const Record& like, const std::string& impl) {
  for (const auto& r : recs)
    if (r.impl == impl && r.status == "ok" && r.kase.id == like.kase.id && r.backend == like.backend) return &r;
  return nullptr;
}

}  // namespace memtrade
