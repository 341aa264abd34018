#include "harness/registry.hpp"

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

void Registry::add(Technique t) {
  for (const auto& x : techniques_)
    if (x.name == t.name) throw Error("technique '" + t.name + "' registered twice");
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
