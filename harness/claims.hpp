// Deciding a published claim from measurements (see ClaimCheck in registry.hpp).
//
// Every claim states its measurable form in its suite file: the quantity measured, the band the source
// gives for it (`band`: [lo, hi], either end may be null for "no limit") and the conditions. A check
// measures the quantity with an uncertainty u (0 for exact figures such as tracked bytes; the spread
// between runs or batches for noisy ones) and decides:
//   reproduced      the whole interval [v - u, v + u] lies inside the band;
//   not_reproduced  the whole interval lies outside it;
//   inconclusive    the interval straddles an edge: the measurement cannot tell (noise, or a model too
//                   small to show the effect);
// out_of_scope is for what memtrade does not measure (with the reason), and error for a check that
// could not run (the runner turns an exception into it).
#pragma once

#include <optional>
#include <string>

#include "harness/registry.hpp"

namespace memtrade {

struct Band {
  std::optional<double> lo, hi;
  bool contains(double v) const { return (!lo || v >= *lo) && (!hi || v <= *hi); }
  std::string str() const;  // "[0.005, 0.01]", "<= 0.6", ">= 10"
};

// The claim's band from its suite data (`key`, default "band"); throws Error naming the claim when it
// is missing or malformed.
Band claim_band(const ClaimSpec& spec, const std::string& key = "band");

// reproduced | not_reproduced | inconclusive, as above. NaN is inconclusive.
std::string decide(double value, double uncertainty, const Band& band);

// Combines the verdicts of the parts of one claim, which must all hold (every size, both halves of a
// statement): reproduced when every part is; not_reproduced when any part is; otherwise inconclusive.
std::string combine_verdicts(const std::vector<std::string>& verdicts);

// printf-style text of up to three numbers, for a claim's `measured` and `note` lines.
std::string fmt(const char* f, double a, double b = 0, double c = 0);

// The ok record of implementation `impl` for the same case and backend as `like`, or null.
const Record* same_case(const std::vector<Record>& recs, const Record& like, const std::string& impl);

// A model configuration of a claim's data ({"layers", "kv_heads", "head_dim", ...}): its K and V bytes per
// token in fp16 at every layer, 2 x layers x kv_heads x head_dim x 2, the memory models' KV term.
double fp16_kv_bytes_per_token(const Json& model);

// A time ratio of two records of one run (medians of their repetitions) and its uncertainty: the larger
// of `noise` (the run-to-run allowance) and the repetitions' combined coefficient of variation, times
// the ratio.
struct TimeRatio {
  double ratio = 0, u = 0;
};
TimeRatio time_ratio(const Record& num, const Record& den, double noise);

}  // namespace memtrade
