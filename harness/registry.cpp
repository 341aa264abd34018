#include "harness/registry.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "common/dtype.hpp"

namespace memtrade {

std::string_view role_name(Role r) {
  switch (r) {
    case Role::reference: return "reference";
    case Role::optimized: return "optimized";
    case Role::vendor: return "vendor";
  }
  return "?";
}

static const Json& param(const Case& c, const std::string& key) {
  auto it = c.params.find(key);
  if (it == c.params.end()) throw Error("case " + c.suite + "/" + c.id + " has no parameter '" + key + "'");
  return *it;
}

int64_t Case::integer(const std::string& key) const {
  const Json& v = param(*this, key);
  if (!v.is_number_integer())
    throw Error("case " + suite + "/" + id + ": parameter '" + key + "' must be an integer, got " + v.dump());
  return v.get<int64_t>();
}
int64_t Case::integer(const std::string& key, int64_t fallback) const {
  return params.contains(key) ? integer(key) : fallback;
}
std::string Case::text(const std::string& key) const {
  const Json& v = param(*this, key);
  if (!v.is_string()) throw Error("case " + suite + "/" + id + ": parameter '" + key + "' must be a string, got " + v.dump());
  return v.get<std::string>();
}
std::string Case::text(const std::string& key, const std::string& fallback) const {
  return params.contains(key) ? text(key) : fallback;
}
bool Case::flag(const std::string& key, bool fallback) const {
  if (!params.contains(key)) return fallback;
  const Json& v = param(*this, key);
  if (!v.is_boolean()) throw Error("case " + suite + "/" + id + ": parameter '" + key + "' must be true or false, got " + v.dump());
  return v.get<bool>();
}

double Record::counter(const std::string& key, double fallback) const {
  auto it = counters.find(key);
  return it == counters.end() ? fallback : it->second;
}

Verdict judge_error(const Technique& t, const Case& c, const Problem& p, const Impl& impl, const ErrorStats& err,
                    const ErrorStats& ref) {
  if (t.error_rule.judge) return t.error_rule.judge(c, p, impl, err, ref);
  if (!err.finite())
    return {false, std::to_string(err.nan_count) + " NaN and " + std::to_string(err.inf_count) +
                       " Inf where the oracle is finite"};
  if (impl.role == Role::reference) {
    double bound = 0;
    if (t.error_rule.reference_bound) {
      bound = t.error_rule.reference_bound(c, p);
    } else {
      const DType dt = parse_dtype(c.params.contains("dtype") ? c.text("dtype") : "fp32");
      bound = 8 * unit_roundoff(dt);
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "reference rel_l2_err %.3e vs bound %.3e", err.rel_l2, bound);
    return {err.rel_l2 <= bound, buf};
  }
  Tolerance tol = t.error_rule.tol;
  if (t.error_rule.approximation) tol.abs_floor += t.error_rule.approximation(c, p, impl);
  return within_tolerance(err, ref, tol);
}

Verdict judge_outputs(const Technique& t, const Case& c, const Problem& p, const Impl& impl, const ErrorStats& err,
                      const std::map<std::string, double>& counters, const ErrorStats& ref,
                      const std::map<std::string, double>& ref_counters) {
  auto part_of = [](const std::map<std::string, double>& m, const std::string& part, ErrorStats s) {
    s.max_abs = m.at("max_abs_err_" + part);
    if (auto it = m.find("rel_l2_err_" + part); it != m.end()) s.rel_l2 = it->second;
    return s;
  };
  auto has = [&](const std::string& part) {
    return counters.count("max_abs_err_" + part) && ref_counters.count("max_abs_err_" + part);
  };
  bool by_part = false;
  if (impl.role != Role::reference)
    for (const std::string& part : t.error_rule.parts) by_part = by_part || has(part);
  if (!by_part) return judge_error(t, c, p, impl, err, ref);
  for (const std::string& part : t.error_rule.parts) {
    if (!has(part)) continue;
    const Verdict v = judge_error(t, c, p, impl, part_of(counters, part, err), part_of(ref_counters, part, ref));
    if (!v.pass) return {false, part + ": " + v.why};
  }
  return {true, "every output within the rule"};
}

void check_case(const Technique& t, const Case& c, const std::string& where) {
  t.schema.check(c.params, where + ", case " + c.id);
}

std::vector<Impl>& registered_impls() {
  static std::vector<Impl> impls;
  return impls;
}

void Registry::add(Technique t) {
  for (const auto& x : techniques_)
    if (x.name == t.name) throw Error("technique '" + t.name + "' registered twice");
  std::vector<Impl> impls;
  for (const auto& i : registered_impls())
    if (i.technique == t.name) impls.push_back(i);
  impls.insert(impls.end(), t.impls.begin(), t.impls.end());
  t.impls = std::move(impls);
  std::stable_sort(t.impls.begin(), t.impls.end(), [](const Impl& a, const Impl& b) {
    return std::pair(a.backend, a.role) < std::pair(b.backend, b.role);
  });
  for (std::size_t i = 0; i < t.impls.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (t.impls[i].name == t.impls[j].name && t.impls[i].backend == t.impls[j].backend)
        throw Error("technique '" + t.name + "': implementation '" + t.impls[i].name + "' (" +
                    std::string(backend_name(t.impls[i].backend)) + ") registered twice");
  techniques_.push_back(std::move(t));
}

const Technique& Registry::get(const std::string& name) const {
  std::string known;
  for (const auto& t : techniques_) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  throw Error("unknown technique '" + name + "' (known: " + known + ")");
}

}  // namespace memtrade
