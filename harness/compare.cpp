#include "harness/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
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

std::string machine_class_of(const LoadedResults& r, const std::string& backend) {
  const Json& mc = r.context.value("memtrade", Json::object()).value("machine_class", Json::object());
  return mc.is_object() && mc.contains(backend) && mc[backend].is_string() ? mc[backend].get<std::string>() : "";
}

// Smallest two-sided p an exact U test can reach with these sample sizes: 2 / C(n1 + n2, n1).
double min_possible_p(std::size_t n1, std::size_t n2) {
  double c = 1;
  for (std::size_t i = 1; i <= n1; ++i) c = c * static_cast<double>(n2 + i) / static_cast<double>(i);
  return std::min(1.0, 2.0 / c);
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

CompareResult compare_results(const LoadedResults& base, const LoadedResults& cur, const CompareOptions& o) {
  CompareResult R;
  R.baseline_path = base.path.string();
  R.current_path = cur.path.string();
  R.time_gate = o.time_gate;
  std::map<std::string, const Summary*> cur_by_name;
  for (const auto& s : cur.cases) cur_by_name[s.name] = &s;
  std::set<std::string> base_names;
  std::set<std::string> noted_backends;
  bool warned_reps = false;

  auto add = [&](CompareRow row) {
    ++R.checks;
    if (row.regression) ++R.regressions;
    R.rows.push_back(std::move(row));
  };

  for (const auto& b : base.cases) {
    base_names.insert(b.name);
    auto it = cur_by_name.find(b.name);
    if (it == cur_by_name.end()) {
      add({b.name, "case", b.status, nullptr, "", "missing",
           o.allow_missing ? "not in the current results (allowed)" : "not in the current results", !o.allow_missing});
      continue;
    }
    const Summary& c = *it->second;
    if (b.status != c.status) {
      const bool worse = b.status == "ok" || (b.status == "skipped" && c.status == "error");
      add({b.name, "status", b.status, c.status, b.status + " -> " + c.status, worse ? "regression" : "status_changed",
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
      add({b.name, changed_choice, num(b.counters.at(changed_choice)), num(c.counters.at(changed_choice)), "",
           "not_compared", "the dispatcher chose another implementation than in the baseline", false});
      continue;
    }

    for (const auto& [k, bv] : b.counters) {
      const auto cit = c.counters.find(k);
      const bool have = cit != c.counters.end();
      const double cv = have ? cit->second : std::nan("");
      if (is_memory_metric(k)) {
        if (!have) {
          add({b.name, k, num(bv), nullptr, "", "missing", "metric not in the current results", true});
          continue;
        }
        const double d = cv - bv;
        CompareRow row{b.name, k, num(bv), num(cv), (d >= 0 ? "+" : "") + fmt("%.0f B", d), "ok", "", false};
        if (d > o.memory_tolerance_bytes) {
          row.verdict = "regression";
          row.regression = true;
          row.detail = "grew by " + format_bytes(d) + fmt(" (%+.2f%%)", bv > 0 ? 100 * d / bv : 0.0);
        } else if (d < 0) {
          row.verdict = "improved";
        }
        add(row);
      } else if (is_error_metric(k)) {
        CompareRow row{b.name, k, num(bv), num(cv), "", "ok", "", false};
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
            row.verdict = "improved";
          }
        }
        add(row);
      } else if (k == "error_ok") {
        CompareRow row{b.name, k, num(bv), num(cv), "", "ok", "", false};
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
        CompareRow row{b.name, k, num(bv), num(cv), "", "ok", "", false};
        if (!(cv <= bv)) {
          row.verdict = "regression";
          row.regression = true;
          row.detail = "more non-finite values than the baseline";
        }
        add(row);
      } else if (const Json* m = declared_metric(cur, base, c, k)) {
        const std::string gate = m->value("gate", "report");
        if (gate != "report" && gate != "time") add(judge_declared(b.name, k, *m, bv, cv, have));
      }
    }
    // A verdict against the oracle that fails now where the baseline did not record one.
    if (!b.counters.count("error_ok") && c.counters.count("error_ok") && c.counters.at("error_ok") == 0)
      add({b.name, "error_ok", nullptr, 0, "", "regression",
           "the error is outside the technique's rule against the float64 oracle: " + c.detail, true});

    // Time.
    if (b.times_s.empty() || c.times_s.empty()) continue;
    const std::string mb = machine_class_of(base, b.backend), mc = machine_class_of(cur, c.backend);
    if (mb.empty() || mb != mc) {
      R.same_machine_class = false;
      if (noted_backends.insert(b.backend).second)
        R.notes.push_back("time not compared on " + b.backend + ": baseline machine class '" + mb +
                          "' differs from current '" + mc + "'");
      add({b.name, "time", nullptr, nullptr, "", "not_compared", "different machine class", false});
      continue;
    }
    const double mp = min_possible_p(b.times_s.size(), c.times_s.size());
    if (mp >= o.time_alpha && !warned_reps) {
      warned_reps = true;
      R.notes.push_back(fmt("too few repetitions for the time test: with these sample sizes the smallest possible "
                            "p is %.3g, not below alpha",
                            mp) +
                        fmt(" = %.3g; record more repetitions", o.time_alpha));
    }
    const double mb_t = stats::median(b.times_s), mc_t = stats::median(c.times_s);
    const auto mw = stats::mann_whitney_u(b.times_s, c.times_s);
    const double ratio = mc_t / mb_t;
    CompareRow row{b.name, "time", num(mb_t), num(mc_t), fmt("%+.1f%%", 100 * (ratio - 1)), "ok",
                   fmt("median %.4g s", mb_t) + fmt(" -> %.4g s", mc_t) + fmt(", p = %.3g", mw.p_two_sided), false};
    const bool significant = mw.p_two_sided < o.time_alpha;
    if (significant && ratio > 1 + o.time_min_effect) {
      row.verdict = o.time_gate ? "regression" : "slower";
      row.regression = o.time_gate;
      if (!o.time_gate) row.detail += " (time is report-only)";
    } else if (significant && ratio < 1 / (1 + o.time_min_effect)) {
      row.verdict = "faster";
    }
    add(row);
  }
  for (const auto& c : cur.cases)
    if (!base_names.count(c.name)) add({c.name, "case", nullptr, c.status, "", "new", "not in the baseline", false});
  return R;
}

static std::string cell(const Json& j) {
  if (j.is_null()) return "-";
  if (j.is_string()) return j.get<std::string>();
  if (j.is_number_integer()) return std::to_string(j.get<long long>());
  return fmt("%.6g", j.get<double>());
}

std::string format_compare(const CompareResult& r, bool md) {
  std::vector<const CompareRow*> shown;
  for (const auto& row : r.rows)
    if (row.verdict != "ok") shown.push_back(&row);
  std::stable_sort(shown.begin(), shown.end(), [](auto* a, auto* b) { return a->regression > b->regression; });
  std::string out;
  char line[1024];
  if (md) {
    out += "| case | metric | baseline | current | change | verdict | detail |\n|---|---|---|---|---|---|---|\n";
    for (auto* row : shown)
      out += "| " + row->name + " | " + row->metric + " | " + cell(row->baseline) + " | " + cell(row->current) + " | " +
             row->change + " | " + (row->regression ? "**" + row->verdict + "**" : row->verdict) + " | " + row->detail + " |\n";
  } else if (!shown.empty()) {
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
  for (const auto& n : r.notes) out += (md ? "> note: " : "note: ") + n + "\n";
  std::snprintf(line, sizeof line, "%s%d regression(s) in %d checks (time %s)%s\n", md ? "\n" : "", r.regressions,
                r.checks, r.time_gate ? "gates" : "report-only", r.regressions ? "" : ": clean");
  out += line;
  return out;
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
  Json rows = Json::array();
  for (const auto& row : r.rows)
    rows.push_back({{"name", row.name}, {"metric", row.metric}, {"baseline", row.baseline}, {"current", row.current},
                    {"change", row.change}, {"verdict", row.verdict}, {"detail", row.detail},
                    {"regression", row.regression}});
  j["rows"] = rows;
  return j;
}

}  // namespace memtrade
