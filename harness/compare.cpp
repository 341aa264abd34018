#include "harness/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <set>

#include "common/dtype.hpp"
#include "harness/stats.hpp"

namespace memtrade {

namespace {

std::string fmt(const char* f, double v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

Json num(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

bool is_memory_metric(const std::string& k) { return k.rfind("peak_", 0) == 0 || k.rfind("host_peak_", 0) == 0; }
bool is_error_metric(const std::string& k) { return k == "max_abs_err" || k == "max_rel_err" || k == "rel_l2_err"; }

// The unit roundoff of the case's dtype parameter (fp32 when it has none or names no float type).
double case_unit_roundoff(const Summary& s) {
  const auto it = s.params.find("dtype");
  if (it != s.params.end() && it->is_string()) try {
      if (const double u = unit_roundoff(parse_dtype(it->get<std::string>())); u > 0) return u;
    } catch (const Error&) {
    }
  return unit_roundoff(DType::f32);
}

// The metrics a technique declared, from the results context (the current file's, else the baseline's).
const Json* declared_metric(const LoadedResults& cur, const LoadedResults& base, const Summary& s,
                            const std::string& counter) {
  // References into the context itself (the returned pointer must outlive this call).
  auto child = [](const Json& j, const std::string& key) -> const Json* {
    if (!j.is_object()) return nullptr;
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  };
  for (const LoadedResults* r : {&cur, &base}) {
    const Json* m = child(r->context, "memtrade");
    const Json* suites = m ? child(*m, "suites") : nullptr;
    const Json* suite = suites ? child(*suites, s.suite) : nullptr;
    const Json* metrics = suite ? child(*suite, "metrics") : nullptr;
    if (!metrics || !metrics->is_array() || metrics->empty()) continue;
    const Json& list = *metrics;
    for (int pass = 0; pass < 2; ++pass)  // exact names before prefixes
      for (const auto& m : list) {
        if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) continue;
        const std::string n = m["name"].get<std::string>();
        const bool prefix = !n.empty() && n.back() == '*';
        if (pass == 0 ? n == counter : prefix && counter.compare(0, n.size() - 1, n, 0, n.size() - 1) == 0) return &m;
      }
    return nullptr;
  }
  return nullptr;
}
bool is_count_metric(const std::string& k) { return k == "nan_count" || k == "inf_count"; }

// A CPU run's settings that move its times without changing its machine class (each is recorded in the
// results' context): "name 'baseline' -> 'current'" for each that differs, "" when none does or a side
// does not record it.
std::string cpu_setting_changes(const LoadedResults& base, const LoadedResults& cur) {
  std::string out;
  for (const char* key : {"simd_target", "blas_core", "huge_pages"}) {
    const Json& b = base.context.value("memtrade", Json::object()).value(key, Json());
    const Json& c = cur.context.value("memtrade", Json::object()).value(key, Json());
    if (!b.is_string() || !c.is_string() || b == c) continue;
    out += std::string(out.empty() ? "" : ", ") + key + " '" + b.get<std::string>() + "' -> '" + c.get<std::string>() + "'";
  }
  return out;
}

std::string machine_class_of(const LoadedResults& r, const std::string& backend) {
  const Json& mc = r.context.value("memtrade", Json::object()).value("machine_class", Json::object());
  return mc.is_object() && mc.contains(backend) && mc[backend].is_string() ? mc[backend].get<std::string>() : "";
}

// Claims by id: a verdict that leaves `reproduced` while the claim's data (its suite entry) is unchanged
// is a regression, and so is any `error` verdict; other changes are listed.
template <typename Add>
void compare_claims(const LoadedResults& base, const LoadedResults& cur, const CompareOptions& o, Add add) {
  auto by_id = [](const Json& list) {
    std::map<std::string, const Json*> m;
    if (list.is_array())
      for (const auto& c : list)
        if (c.is_object() && c.contains("id") && c["id"].is_string()) m[c["id"].get<std::string>()] = &c;
    return m;
  };
  const auto b = by_id(base.claims), c = by_id(cur.claims);
  auto text = [](const Json& j, const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : ""; };
  // The claim's data: its suite entry when recorded, else the statement and the expected text.
  auto data = [&](const Json& j) { return j.contains("spec") ? j["spec"].dump() : text(j, "statement") + "|" + text(j, "expected"); };
  for (const auto& [id, bj] : b) {
    const std::string name = "claim/" + id;
    const auto it = c.find(id);
    if (it == c.end()) {
      add({name, "verdict", text(*bj, "verdict"), nullptr, "", "missing",
           o.allow_missing ? "not in the current results (allowed)" : "not in the current results", !o.allow_missing});
      continue;
    }
    const std::string bv = text(*bj, "verdict"), cv = text(*it->second, "verdict");
    CompareRow row{name, "verdict", bv, cv, "", "ok", text(*it->second, "measured"), false};
    const bool same_data = data(*bj) == data(*it->second);
    if (cv == "error") {
      row.verdict = "regression";
      row.regression = true;
      row.detail = "the claim's check failed: " + text(*it->second, "note");
    } else if (bv != cv) {
      row.verdict = bv == "reproduced" && same_data ? "regression" : "verdict_changed";
      row.regression = row.verdict == "regression";
      if (!same_data) row.detail = "the claim's data changed; " + row.detail;
    }
    add(row);
  }
  for (const auto& [id, cj] : c)
    if (!b.count(id)) {
      const std::string v = text(*cj, "verdict");
      add({"claim/" + id, "verdict", nullptr, v, "", v == "error" ? "regression" : "new",
           v == "error" ? "the claim's check failed: " + text(*cj, "note") : "not in the baseline", v == "error"});
    }
}

// A record's identity: its name (suite/case/impl) and its backend. CPU and CUDA implementations may share
// a name (attention's naive and flash); a non-CPU record is shown as "name (backend)".
std::string record_id(const Summary& s) { return s.backend.empty() || s.backend == "cpu" ? s.name : s.name + " (" + s.backend + ")"; }

// One run's records by identity, built once per run.
using RunIndex = std::map<std::string, const Summary*>;
RunIndex index_run(const LoadedResults& r) {
  RunIndex m;
  for (const auto& s : r.cases) m.emplace(record_id(s), &s);
  return m;
}
const Summary* find_case(const RunIndex& run, const std::string& id) {
  const auto it = run.find(id);
  return it == run.end() ? nullptr : it->second;
}

// One declared metric against the baseline, by its rule (see compare.hpp).
CompareRow judge_declared(const std::string& name, const std::string& k, const Json& m, double bv, double cv, bool have) {
  CompareRow row{name, k, num(bv), num(cv), "", "ok", "", false};
  const std::string gate = m.value("gate", "report"), better = m.value("better", "-");
  const double ratio = m.value("ratio", 1.0), floor = m.value("floor", 0.0);
  auto regress = [&](const std::string& why) {
    row.verdict = "regression";
    row.regression = true;
    row.detail = why + " (declared rule: " + gate + ")";
  };
  if (!have) {
    if (gate != "report" && gate != "time") regress("metric not in the current results");
    return row;
  }
  if (std::isfinite(bv) && bv != 0) row.change = fmt("%+.2f%%", 100 * (cv / bv - 1));
  if (std::isfinite(bv) && !std::isfinite(cv) && gate != "report" && gate != "time")
    regress("NaN/Inf where the baseline was finite");
  else if (gate == "zero" && cv != 0)
    regress("must stay 0");
  else if (gate == "bound" && (better == "higher" ? cv < floor : cv > floor))
    regress(fmt("past the bound %.4g", floor));
  else if (gate == "exact" && std::isfinite(bv) && (better == "higher" ? cv < bv : better == "lower" ? cv > bv : cv != bv))
    regress("changed in the worse direction");
  else if (gate == "ratio" && std::isfinite(bv)) {
    const bool worse = better == "higher" ? (cv < bv / ratio && bv - cv > floor) : (cv > bv * ratio && cv - bv > floor);
    if (worse) regress(fmt("beyond %.4g x the baseline", ratio));
  }
  return row;
}

}  // namespace

RunTime summarize_run(const Summary& s, const CompareOptions& o) {
  RunTime r;
  const bool by_min = o.time_stat == CompareOptions::RunStat::min;
  const auto fastest = std::min_element(s.times_s.begin(), s.times_s.end());
  r.value = by_min ? *fastest : stats::median(s.times_s);
  // The minimum does not move when interference slows some repetitions; only the median needs them alike.
  const double cv = stats::cv(s.times_s);
  if (!by_min && cv > o.max_cv) {
    r.stable = false;
    r.why = fmt("repetitions spread %.0f%%", 100 * cv) + fmt(" (coefficient of variation above %.0f%%)", 100 * o.max_cv);
    return r;
  }
  // The calling thread's CPU time over wall time per repetition: on the CPU a repetition whose share fell
  // far below the run's best lost its core to another process.
  if (s.backend == "cpu" && s.cpu_times_s.size() == s.times_s.size() && s.times_s.size() > 1) {
    // By the minimum, only the fastest repetition's share matters (it is the one used).
    double best = 0, worst = HUGE_VAL;
    for (std::size_t i = 0; i < s.times_s.size(); ++i) {
      if (!(s.times_s[i] > 0)) continue;
      const double share = s.cpu_times_s[i] / s.times_s[i];
      best = std::max(best, share);
      if (!by_min || i == static_cast<std::size_t>(fastest - s.times_s.begin())) worst = std::min(worst, share);
    }
    if (best > 0 && worst < o.min_cpu_share * best) {
      r.stable = false;
      r.why = fmt("pre-empted: CPU/wall fell to %.2f", worst) + fmt(" in one repetition against %.2f in the best", best);
    }
  }
  return r;
}

CompareResult compare_results(const LoadedResults& base, const LoadedResults& cur, const CompareOptions& o) {
  return compare_runs({base}, {cur}, o);
}

CompareResult compare_runs(const std::vector<LoadedResults>& base_runs, const std::vector<LoadedResults>& cur_runs,
                           const CompareOptions& o) {
  if (base_runs.empty() || cur_runs.empty()) throw Error("compare: each side needs at least one results file");
  const LoadedResults& base = base_runs.front();
  const LoadedResults& cur = cur_runs.front();
  CompareResult R;
  R.baseline_path = base.path.string();
  R.current_path = cur.path.string();
  R.time_gate = o.time_gate;
  R.baseline_runs = static_cast<int>(base_runs.size());
  R.current_runs = static_cast<int>(cur_runs.size());
  std::vector<std::pair<std::regex, double>> effects;
  for (const auto& [pattern, f] : o.min_effect_for) {
    try {
      effects.emplace_back(std::regex(pattern, std::regex::ECMAScript), f);
    } catch (const std::regex_error& e) {
      throw Error("minimum effect pattern '" + pattern + "' is not a valid regular expression: " + e.what());
    }
  }
  auto min_effect_of = [&](const std::string& name) {
    for (const auto& [re, f] : effects)
      if (std::regex_search(name, re)) return f;
    return o.time_min_effect;
  };
  std::vector<RunIndex> base_index, cur_index;
  for (const auto& r : base_runs) base_index.push_back(index_run(r));
  for (const auto& r : cur_runs) cur_index.push_back(index_run(r));
  const RunIndex& cur_by_name = cur_index.front();
  std::set<std::string> base_names;
  std::set<std::string> noted_backends;
  int untestable = 0;  // time checks with too few (stable) runs for the test to reach alpha

  auto add = [&](CompareRow row) {
    const bool listed = !row.regression && (row.verdict == "new_metric" || row.verdict == "new" || row.verdict == "not_compared");
    ++(listed ? R.listed : R.checks);
    if (row.regression) ++R.regressions;
    R.rows.push_back(std::move(row));
  };

  for (const auto& b : base.cases) {
    const std::string id = record_id(b);
    base_names.insert(id);
    auto it = cur_by_name.find(id);
    if (it == cur_by_name.end()) {
      add({id, "case", b.status, nullptr, "", "missing",
           o.allow_missing ? "not in the current results (allowed)" : "not in the current results", !o.allow_missing});
      continue;
    }
    const Summary& c = *it->second;
    if (b.status != c.status) {
      const bool worse = b.status == "ok" || (b.status == "skipped" && c.status == "error");
      add({id, "status", b.status, c.status, b.status + " -> " + c.status, worse ? "regression" : "status_changed",
           c.detail, worse});
      continue;
    }
    if (b.status != "ok") continue;

    // A dispatcher that chose differently (counters named choice_*, e.g. attention/auto picking flash
    // instead of naive after a new tuning) ran another implementation: its figures are not comparable.
    std::string changed_choice;
    for (const auto& [k, bv] : b.counters)
      if (k.rfind("choice_", 0) == 0 && c.counters.count(k) && c.counters.at(k) != bv) changed_choice = k;
    if (!changed_choice.empty()) {
      add({id, changed_choice, num(b.counters.at(changed_choice)), num(c.counters.at(changed_choice)), "",
           "not_compared", "the dispatcher chose another implementation than in the baseline", false});
      continue;
    }

    for (const auto& [k, bv] : b.counters) {
      const auto cit = c.counters.find(k);
      const bool have = cit != c.counters.end();
      const double cv = have ? cit->second : std::nan("");
      if (is_memory_metric(k)) {
        if (!have) {
          add({id, k, num(bv), nullptr, "", "missing", "metric not in the current results", true});
          continue;
        }
        const double d = cv - bv;
        CompareRow row{id, k, num(bv), num(cv), (d >= 0 ? "+" : "") + fmt("%.0f B", d), "ok", "", false};
        if (d > o.memory_tolerance_bytes) {
          row.verdict = "regression";
          row.regression = true;
          row.detail = "grew by " + format_bytes(d) + fmt(" (%+.2f%%)", bv > 0 ? 100 * d / bv : 0.0);
        } else if (d < 0) {
          row.verdict = "improved";
        }
        // Exact and repeatable: every current run must have recorded the same figure.
        for (std::size_t r = 1; r < cur_runs.size() && !row.regression; ++r)
          if (const Summary* other = find_case(cur_index[r], id); other && other->status == "ok") {
            const auto o_it = other->counters.find(k);
            if (o_it != other->counters.end() && o_it->second != cv) {
              row.verdict = "regression";
              row.regression = true;
              row.detail = "not repeatable: " + cur_runs[r].path.filename().string() + fmt(" recorded %.0f B", o_it->second);
            }
          }
        add(row);
      } else if (k == "untracked_bytes") {
        CompareRow row{id, k, num(bv), num(cv), "", "ok", "", false};
        if (!have || !std::isfinite(cv)) {
          row.verdict = "not_compared";
          row.detail = "not recorded in the current run (no heap probe in this build)";
        } else {
          row.change = (cv >= bv ? "+" : "") + fmt("%.0f B", cv - bv);
          // Library buffers that depend on the thread count (OpenBLAS's threaded path: 512 KiB plus about
          // 1 KiB per thread) may differ between machines: a quarter of the baseline's figure is allowed too.
          const double allowance = std::max(o.untracked_allowance_bytes, 0.25 * bv);
          if (cv - bv > allowance) {
            row.verdict = "regression";
            row.regression = true;
            row.detail = "heap allocated outside the tracked pools grew by " + format_bytes(cv - bv) + " (allowance " +
                         format_bytes(allowance) + ")";
          } else if (bv - cv > allowance) {  // the same allowance both ways: a few bytes of path or
            row.verdict = "improved";        // environment strings are neither better nor worse
          }
        }
        add(row);
      } else if (is_error_metric(k)) {
        CompareRow row{id, k, num(bv), num(cv), "", "ok", "", false};
        const bool gated = k == "rel_l2_err";
        const double floor = std::max(o.error_floor, o.error_floor_u * case_unit_roundoff(c));
        if (std::isfinite(bv) && !std::isfinite(cv)) {
          row.verdict = "regression";
          row.regression = true;
          row.detail = "error is NaN/Inf (or absent) where the baseline was finite";
        } else if (std::isfinite(bv) && std::isfinite(cv)) {
          row.change = bv > 0 ? fmt("x%.3g", cv / bv) : fmt("%+.3g", cv - bv);
          if (cv > o.error_ratio * bv && cv - bv > floor) {
            row.verdict = gated ? "regression" : "changed";
            row.regression = gated;
            row.detail = gated ? fmt("above %.3g x baseline", o.error_ratio) + fmt(" and the floor %.2e", floor)
                               : "order-dependent metric: listed, not gated (error_ok and rel_l2_err gate)";
          } else if (bv > o.error_ratio * cv && bv - cv > floor) {
            row.verdict = gated ? "improved" : "changed";
            if (!gated) row.detail = "order-dependent metric: listed, not gated (error_ok and rel_l2_err gate)";
          }
        }
        add(row);
      } else if (k == "error_ok") {
        CompareRow row{id, k, num(bv), num(cv), "", "ok", "", false};
        if (have && cv == 0 && bv != 0) {
          row.verdict = "regression";
          row.regression = true;
          row.detail = "the error is outside the technique's rule against the float64 oracle: " + c.detail;
        } else if (have && cv == 0) {
          row.verdict = "still_failing";
          row.detail = "outside the rule in the baseline too";
        }
        add(row);
      } else if (is_count_metric(k)) {
        CompareRow row{id, k, num(bv), num(cv), "", "ok", "", false};
        if (!(cv <= bv)) {
          row.verdict = "regression";
          row.regression = true;
          row.detail = "more non-finite values than the baseline";
        }
        add(row);
      } else if (const Json* m = declared_metric(cur, base, c, k)) {
        const std::string gate = m->value("gate", "report");
        if (gate != "report" && gate != "time") add(judge_declared(id, k, *m, bv, cv, have));
      }
    }
    // Counters the baseline does not have: listed (a new peak tag, a new metric).
    for (const auto& [k, cv] : c.counters)
      if (!b.counters.count(k)) {
        CompareRow row{id, k, nullptr, num(cv), "", "new_metric", "not in the baseline", false};
        if (k == "untracked_bytes" && cv > o.untracked_allowance_bytes)
          row.detail += "; " + format_bytes(cv) + " allocated outside the tracked pools";
        if (k != "error_ok") add(row);
      }
    // A verdict against the oracle that fails now where the baseline did not record one.
    if (!b.counters.count("error_ok") && c.counters.count("error_ok") && c.counters.at("error_ok") == 0)
      add({id, "error_ok", nullptr, 0, "", "regression",
           "the error is outside the technique's rule against the float64 oracle: " + c.detail, true});

    // Time, over the runs of each side.
    std::vector<double> bt, ct;
    int dropped = 0;
    std::string why;
    // One value per run, NaN where the run has no stable time for the case.
    auto collect = [&](const std::vector<LoadedResults>& runs, const std::vector<RunIndex>& index) {
      std::vector<double> out;
      for (std::size_t i = 0; i < runs.size(); ++i) {
        const LoadedResults& run = runs[i];
        const Summary* s = find_case(index[i], id);
        out.push_back(std::nan(""));
        if (!s || s->status != "ok" || s->times_s.empty()) continue;
        const RunTime t = summarize_run(*s, o);
        if (t.stable) out.back() = t.value;
        else {
          ++dropped;
          if (why.empty()) why = run.path.filename().string() + ": " + t.why;
        }
      }
      return out;
    };
    const std::vector<double> b_all = collect(base_runs, base_index), c_all = collect(cur_runs, cur_index);
    const bool paired = o.paired && b_all.size() == c_all.size();
    for (std::size_t i = 0; i < std::max(b_all.size(), c_all.size()); ++i) {
      const bool have_b = i < b_all.size() && !std::isnan(b_all[i]), have_c = i < c_all.size() && !std::isnan(c_all[i]);
      if (paired && !(have_b && have_c)) continue;  // a pair needs both halves
      if (have_b) bt.push_back(b_all[i]);
      if (have_c) ct.push_back(c_all[i]);
    }
    if (bt.empty() && ct.empty() && !dropped) continue;
    const std::string mb = machine_class_of(base, b.backend), mc = machine_class_of(cur, c.backend);
    if (mb.empty() || mb != mc) {
      R.same_machine_class = false;
      if (noted_backends.insert(b.backend).second)
        R.notes.push_back("time not compared on " + b.backend + ": baseline machine class '" + mb +
                          "' differs from current '" + mc + "'");
      add({id, "time", nullptr, nullptr, "", "not_compared", "different machine class", false});
      continue;
    }
    if (b.backend == "cpu" && noted_backends.insert("cpu settings").second)
      if (const std::string changed = cpu_setting_changes(base, cur_runs.front()); !changed.empty())
        R.notes.push_back("cpu times compared across different settings (" + changed +
                          "): a time change may come from them");
    if (bt.empty() || ct.empty()) {
      R.unstable.push_back(b.name);
      add({id, "time", nullptr, nullptr, "", "unstable", "no stable run on one side (" + why + ")", false});
      continue;
    }
    const double effect = min_effect_of(b.name);
    const auto t = paired ? stats::compare_pairs(bt, ct) : stats::compare_runs(bt, ct);
    const char* per_run = o.time_stat == CompareOptions::RunStat::min ? "fastest repetitions" : "medians";
    CompareRow row{id, "time", num(t.baseline_median), num(t.candidate_median), fmt("%+.1f%%", 100 * (t.ratio - 1)),
                   "ok",
                   paired ? "median of " + std::to_string(bt.size()) + " paired rounds' ratios" +
                                fmt(" %.4g", t.ratio) + fmt(" (%.4g s", t.baseline_median) +
                                fmt(" -> %.4g s)", t.candidate_median) +
                                fmt(", one-sided signed-rank p = %.3g", t.ratio >= 1 ? t.p_slower : t.p_faster)
                          : "median of the runs' " + std::string(per_run) + fmt(" %.4g s", t.baseline_median) + " (" + std::to_string(bt.size()) +
                                " runs)" + fmt(" -> %.4g s", t.candidate_median) + " (" + std::to_string(ct.size()) +
                                " runs)" + fmt(", one-sided p = %.3g", t.ratio >= 1 ? t.p_slower : t.p_faster),
                   false};
    if (dropped) row.detail += ", " + std::to_string(dropped) + " unstable run(s) left out";
    // One-sided tests: "slower" and "faster" are separate questions, each at alpha.
    const bool testable = t.min_p < o.time_alpha;
    const bool slower_sig = testable && t.p_slower < o.time_alpha, faster_sig = testable && t.p_faster < o.time_alpha;
    if (!testable) {
      ++untestable;
      row.detail += fmt(" (smallest possible p %.3g: too few runs to test)", t.min_p);
    }
    if (t.ratio > 1 + effect) {
      if (slower_sig && o.time_gate) {
        row.verdict = "regression";
        row.regression = true;
        R.time_regressions.emplace_back(id, b.name);
      } else if (slower_sig) {
        row.verdict = "slower";
        row.detail += " (time is report-only)";
      } else if (dropped) {
        row.verdict = "unstable";
        R.unstable.push_back(b.name);
        row.detail += "; not significant without the unstable runs (" + why + ")";
      } else {
        row.verdict = "slower";
        if (testable) row.detail += " (not significant)";
      }
    } else if (t.ratio < 1 / (1 + effect)) {
      row.verdict = "faster";
      if (!faster_sig && testable) row.detail += " (not significant)";
    }
    add(row);
  }
  if (untestable)
    R.notes.push_back("time is listed, not gated, for " + std::to_string(untestable) +
                      " case(s): too few stable runs for the test to reach p < " + fmt("%g", o.time_alpha) +
                      " (time gates on independent runs: 5 a side at alpha 0.01, or 7 paired rounds, e.g. memtrade ab --runs 7)");
  compare_claims(base, cur, o, add);
  for (const auto& c : cur.cases)
    if (!base_names.count(record_id(c))) add({record_id(c), "case", nullptr, c.status, "", "new", "not in the baseline", false});
  return R;
}

static std::string cell(const Json& j) {
  if (j.is_null()) return "-";
  if (j.is_string()) return j.get<std::string>();
  if (j.is_number_integer()) return std::to_string(j.get<long long>());
  return fmt("%.6g", j.get<double>());
}

// The markdown form, for a pull request or a CI summary: the summary line first, then the rows in sections
// by what they ask of a reader: regressions (gated), rows to look at that do not gate (verdict, status and
// time changes, failures that persist, rows missing from the current run), and, folded, the improvements
// and everything only listed (order-dependent errors, new cases, rows not compared).
static std::string markdown_compare(const CompareResult& r, const std::vector<const CompareRow*>& shown,
                                    const std::map<std::string, int>& new_metrics, const std::string& summary) {
  static const std::set<std::string> kLook = {"verdict_changed", "status_changed", "still_failing", "unstable", "slower",
                                              "missing"};
  static const std::set<std::string> kBetter = {"improved", "faster"};
  std::vector<const CompareRow*> reg, look, better, listed;
  for (auto* row : shown) {
    if (row->regression) reg.push_back(row);
    else if (kLook.count(row->verdict)) look.push_back(row);
    else if (kBetter.count(row->verdict)) better.push_back(row);
    else listed.push_back(row);
  }
  auto table = [](const std::vector<const CompareRow*>& rows) {
    std::string t = "\n| case | metric | baseline | current | change | verdict | detail |\n|---|---|---|---|---|---|---|\n";
    for (auto* row : rows)
      t += "| " + row->name + " | " + row->metric + " | " + cell(row->baseline) + " | " + cell(row->current) + " | " +
           row->change + " | " + (row->regression ? "**" + row->verdict + "**" : row->verdict) + " | " + row->detail + " |\n";
    return t;
  };
  auto folded = [&](const std::string& title, const std::vector<const CompareRow*>& rows) {
    return rows.empty() ? std::string()
                        : "\n<details><summary>" + title + " (" + std::to_string(rows.size()) + ")</summary>\n" +
                              table(rows) + "\n</details>\n";
  };
  std::string out = "**memtrade compare**: " + summary + "\n\nbaseline `" + r.baseline_path + "`, current `" +
                    r.current_path + "`\n";
  for (const auto& n : r.notes) out += "\n> note: " + n + "\n";
  if (!new_metrics.empty()) {
    out += "\n> note: counters the baseline lacks (listed, not compared):";
    for (const auto& [m, n] : new_metrics) out += " " + m + " (" + std::to_string(n) + " cases)";
    out += "\n";
  }
  out += "\n### Regressions (" + std::to_string(reg.size()) + ")\n" + (reg.empty() ? "\nNone.\n" : table(reg));
  if (!look.empty())
    out += "\n### Changed, not gated (" + std::to_string(look.size()) + ")\n" + table(look);
  out += folded("Improvements", better);
  out += folded("Listed, not gated: order-dependent errors, new cases and counters, rows not compared", listed);
  return out;
}

std::string format_compare(const CompareResult& r, bool md) {
  std::vector<const CompareRow*> shown;
  std::map<std::string, int> new_metrics;  // summarized in one line each: a new counter appears in many cases
  for (const auto& row : r.rows)
    if (row.verdict == "new_metric") ++new_metrics[row.metric];
    else if (row.verdict != "ok") shown.push_back(&row);
  std::stable_sort(shown.begin(), shown.end(), [](auto* a, auto* b) { return a->regression > b->regression; });
  std::string out;
  char line[1024];
  std::snprintf(line, sizeof line, "%d regression(s) in %d checks (time %s; %d baseline and %d current run(s))%s%s%s",
                r.regressions, r.checks, r.time_gate ? "gates" : "report-only", r.baseline_runs, r.current_runs,
                r.unstable.empty() ? "" : (", " + std::to_string(r.unstable.size()) + " unstable").c_str(),
                r.listed ? (", " + std::to_string(r.listed) + " listed, not compared").c_str() : "",
                r.regressions ? "" : ": clean");
  const std::string summary = line;
  if (md) return markdown_compare(r, shown, new_metrics, summary);
  if (!shown.empty()) {
    std::snprintf(line, sizeof line, "%-58s %-18s %-14s %-14s %-10s %-14s %s\n", "case", "metric", "baseline", "current",
                  "change", "verdict", "detail");
    out += line;
    for (auto* row : shown) {
      std::snprintf(line, sizeof line, "%-58s %-18s %-14s %-14s %-10s %-14s %s\n", row->name.c_str(), row->metric.c_str(),
                    cell(row->baseline).c_str(), cell(row->current).c_str(), row->change.c_str(),
                    row->verdict.c_str(), row->detail.c_str());
      out += line;
    }
  }
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  if (!new_metrics.empty()) {
    out += "note: counters the baseline lacks (listed, not compared):";
    for (const auto& [m, n] : new_metrics) out += " " + m + " (" + std::to_string(n) + " cases)";
    out += "\n";
  }
  return out + summary + "\n";
}

Json compare_to_json(const CompareResult& r) {
  Json j = Json::object();
  j["baseline"] = r.baseline_path;
  j["current"] = r.current_path;
  j["time_mode"] = r.time_gate ? "gate" : "report";
  j["same_machine_class"] = r.same_machine_class;
  j["notes"] = r.notes;
  j["regressions"] = r.regressions;
  j["checks"] = r.checks;
  j["listed"] = r.listed;
  j["baseline_runs"] = r.baseline_runs;
  j["current_runs"] = r.current_runs;
  j["unstable"] = r.unstable;
  Json rows = Json::array();
  for (const auto& row : r.rows)
    rows.push_back({{"name", row.name}, {"metric", row.metric}, {"baseline", row.baseline}, {"current", row.current},
                    {"change", row.change}, {"verdict", row.verdict}, {"detail", row.detail},
                    {"regression", row.regression}});
  j["rows"] = rows;
  return j;
}

}  // namespace memtrade
