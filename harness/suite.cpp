#include "harness/suite.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "memtrade/build_info.hpp"

namespace memtrade {

namespace {

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what) {
  throw Error("suite file " + file.string() + ": " + what);
}

std::string required_string(const Json& j, const char* key, const std::filesystem::path& file) {
  if (!j.contains(key) || !j[key].is_string()) fail(file, std::string("missing string field '") + key + "'");
  return j[key].get<std::string>();
}

std::string value_text(const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Expands one grid entry (axis -> list of values) into parameter objects, first axis outermost.
void expand(const Json& grid, const std::filesystem::path& file, std::vector<Json>& out) {
  if (!grid.is_object() || grid.empty()) fail(file, "each grid entry must be a non-empty object of axis -> [values]");
  std::vector<Json> partial{Json::object()};
  for (const auto& [axis, values] : grid.items()) {
    if (!values.is_array() || values.empty()) fail(file, "grid axis '" + axis + "' must be a non-empty list");
    std::vector<Json> next;
    for (const auto& p : partial)
      for (const auto& v : values) {
        if (!(v.is_number_integer() || v.is_string() || v.is_boolean() || v.is_number_float()))
          fail(file, "grid axis '" + axis + "' has a value that is not a number, string or boolean: " + v.dump());
        Json q = p;
        q[axis] = v;
        next.push_back(std::move(q));
      }
    partial = std::move(next);
  }
  out.insert(out.end(), partial.begin(), partial.end());
}

}  // namespace

std::string case_id(const Json& params) {
  std::string id;
  for (const auto& [k, v] : params.items()) id += (id.empty() ? "" : ",") + k + "=" + value_text(v);
  return id;
}

const Profile& SuiteSpec::profile(const std::string& wanted) const {
  std::string known;
  for (const auto& p : profiles) {
    if (p.name == wanted) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error("suite '" + name + "' has no profile '" + wanted + "' (profiles: " + known + ")");
}

SuiteSpec load_suite(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw Error("suite file " + file.string() + ": cannot be opened");
  Json j;
  try {
    j = Json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    fail(file, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(file, "top level must be an object");
  SuiteSpec s;
  s.file = file;
  s.name = required_string(j, "suite", file);
  s.technique = required_string(j, "technique", file);
  s.description = j.value("description", "");
  s.x_param = required_string(j, "x_param", file);
  s.x_label = j.value("x_label", s.x_param);
  if (!j.contains("profiles") || !j["profiles"].is_object() || j["profiles"].empty())
    fail(file, "missing 'profiles' object");
  for (const auto& [pname, pj] : j["profiles"].items()) {
    Profile p;
    p.name = pname;
    if (!pj.is_object()) fail(file, "profile '" + pname + "' must be an object");
    if (pj.contains("repetitions")) {
      if (!pj["repetitions"].is_number_integer() || pj["repetitions"].get<int>() < 1)
        fail(file, "profile '" + pname + "': repetitions must be an integer >= 1");
      p.repetitions = pj["repetitions"].get<int>();
    }
    if (pj.contains("min_time_s")) {
      if (!pj["min_time_s"].is_number() || pj["min_time_s"].get<double>() <= 0)
        fail(file, "profile '" + pname + "': min_time_s must be a positive number");
      p.min_time_s = pj["min_time_s"].get<double>();
    }
    if (pj.contains("capacity_bytes")) {
      if (!pj["capacity_bytes"].is_number_integer() || pj["capacity_bytes"].get<int64_t>() < 1)
        fail(file, "profile '" + pname + "': capacity_bytes must be a positive integer");
      p.capacity = pj["capacity_bytes"].get<std::size_t>();
    }
    if (!pj.contains("grid") || !pj["grid"].is_array() || pj["grid"].empty())
      fail(file, "profile '" + pname + "' needs a non-empty 'grid' list");
    std::vector<Json> params;
    for (const auto& g : pj["grid"]) expand(g, file, params);
    for (auto& prm : params) {
      Case c;
      c.suite = s.name;
      c.id = case_id(prm);
      if (!prm.contains(s.x_param) || !prm[s.x_param].is_number())
        fail(file, "profile '" + pname + "': case " + c.id + " lacks the numeric x parameter '" + s.x_param + "'");
      c.x = prm[s.x_param].get<double>();
      c.params = std::move(prm);
      if (std::any_of(p.cases.begin(), p.cases.end(), [&](const Case& o) { return o.id == c.id; }))
        fail(file, "profile '" + pname + "' lists case " + c.id + " twice");
      p.cases.push_back(std::move(c));
    }
    s.profiles.push_back(std::move(p));
  }
  if (j.contains("claims")) {
    if (!j["claims"].is_array()) fail(file, "'claims' must be a list");
    for (const auto& cj : j["claims"]) {
      ClaimSpec c;
      c.id = required_string(cj, "id", file);
      c.statement = required_string(cj, "statement", file);
      c.source = required_string(cj, "source", file);
      c.expected = required_string(cj, "expected", file);
      c.data = cj;
      s.claims.push_back(std::move(c));
    }
  }
  return s;
}

std::filesystem::path default_suites_dir() {
  if (const char* env = std::getenv("MEMTRADE_SUITES")) return env;
  return std::filesystem::path(build::source_dir) / "suites";
}

std::vector<SuiteSpec> load_all_suites(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) throw Error("suites directory " + dir.string() + " does not exist");
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<SuiteSpec> out;
  for (const auto& f : files) out.push_back(load_suite(f));
  return out;
}

}  // namespace memtrade
