#include "model/lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "datasets/random.hpp"
#include "model/safetensors.hpp"

namespace memtrade::model {

namespace {

constexpr std::array<const char*, kProjCount> kProjNames = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                           "gate_proj", "up_proj", "down_proj"};

std::string module_path(int64_t l, Proj p) {
  const bool attn = p == Proj::q || p == Proj::k || p == Proj::v || p == Proj::o;
  return "base_model.model.model.layers." + std::to_string(l) + (attn ? ".self_attn." : ".mlp.") + proj_name(p);
}

Proj proj_from_name(const std::string& s) {
  for (int i = 0; i < kProjCount; ++i)
    if (s == kProjNames[i]) return static_cast<Proj>(i);
  throw Error("lora: unknown target module \"" + s + "\" (expected q_proj, k_proj, v_proj, o_proj, gate_proj, "
              "up_proj or down_proj)");
}

void check_values(const char* what, std::span<const float> v, int64_t n) {
  MT_CHECK(static_cast<int64_t>(v.size()) == n, std::string("lora: ") + what + " has " +
                                                    std::to_string(v.size()) + " values, expected " +
                                                    std::to_string(n));
}

// dst[i] = base[i] + sign * scaling * (B A)[i] for every adapted projection, in double.
std::vector<float> apply_adapters(const Config& c, const LoraOptions& o, std::span<const float> base,
                                  std::span<const float> ad, double sign) {
  const ParamLayout L = param_layout(c);
  const AdapterLayout AL = adapter_layout(c, o);
  check_values("the base", base, L.total);
  check_values("the adapters", ad, AL.total);
  std::vector<float> out(base.begin(), base.end());
  const double s = sign * static_cast<double>(o.scaling());
  const int64_t r = o.rank;
  for (int64_t l = 0; l < c.layers; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const auto site = AL.layer[l][p];
      if (!site.on()) continue;
      const auto [n_out, n_in] = proj_shape(c, static_cast<Proj>(p));
      const int64_t w = proj_offset(L, l, static_cast<Proj>(p));
      for (int64_t i = 0; i < n_out; ++i)
        for (int64_t j = 0; j < n_in; ++j) {
          double d = 0;
          for (int64_t k = 0; k < r; ++k)
            d += static_cast<double>(ad[site.b + i * r + k]) * static_cast<double>(ad[site.a + k * n_in + j]);
          out[w + i * n_in + j] = static_cast<float>(static_cast<double>(base[w + i * n_in + j]) + s * d);
        }
    }
  return out;
}

}  // namespace

const char* proj_name(Proj p) { return kProjNames[static_cast<int>(p)]; }

const char* lora_targets_name(LoraTargets t) {
  switch (t) {
    case LoraTargets::qv: return "qv";
    case LoraTargets::attention: return "attention";
    case LoraTargets::all_linear: return "all-linear";
  }
  return "?";
}

LoraTargets parse_lora_targets(const std::string& s) {
  if (s == "qv") return LoraTargets::qv;
  if (s == "attention") return LoraTargets::attention;
  if (s == "all-linear") return LoraTargets::all_linear;
  throw Error("lora: unknown targets \"" + s + "\" (expected qv, attention or all-linear)");
}

bool adapted(LoraTargets t, Proj p) {
  switch (t) {
    case LoraTargets::qv: return p == Proj::q || p == Proj::v;
    case LoraTargets::attention: return p == Proj::q || p == Proj::k || p == Proj::v || p == Proj::o;
    case LoraTargets::all_linear: return true;
  }
  return false;
}

std::array<int64_t, 2> proj_shape(const Config& c, Proj p) {
  switch (p) {
    case Proj::q:
    case Proj::o: return {c.dim, c.dim};
    case Proj::k:
    case Proj::v: return {c.kv_dim(), c.dim};
    case Proj::gate:
    case Proj::up: return {c.ffn, c.dim};
    case Proj::down: return {c.dim, c.ffn};
  }
  return {0, 0};
}

int64_t proj_offset(const ParamLayout& L, int64_t l, Proj p) {
  const auto& P = L.layer.at(l);
  const std::array<int64_t, kProjCount> off = {P.wq, P.wk, P.wv, P.wo, P.wg, P.wu, P.wd};
  return off[static_cast<int>(p)];
}

AdapterLayout adapter_layout(const Config& c, const LoraOptions& o) {
  MT_CHECK(o.rank > 0, "lora: rank must be positive, got " + std::to_string(o.rank));
  MT_CHECK(o.alpha > 0 && std::isfinite(o.alpha), "lora: alpha must be positive and finite");
  AdapterLayout AL;
  AL.layer.resize(c.layers);
  const int64_t r = o.rank;
  for (int64_t l = 0; l < c.layers; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      if (!adapted(o.targets, static_cast<Proj>(p))) continue;
      const auto [n_out, n_in] = proj_shape(c, static_cast<Proj>(p));
      MT_CHECK(r <= std::min(n_out, n_in), "lora: rank " + std::to_string(r) + " exceeds " + proj_name(static_cast<Proj>(p)) +
                                               "'s smaller side " + std::to_string(std::min(n_out, n_in)));
      auto& site = AL.layer[l][p];
      const std::string path = module_path(l, static_cast<Proj>(p));
      site.a = AL.total;
      AL.tensors.push_back({path + ".lora_A.weight", {r, n_in}, AL.total, r * n_in, true});
      AL.total += r * n_in;
      site.b = AL.total;
      AL.tensors.push_back({path + ".lora_B.weight", {n_out, r}, AL.total, n_out * r, true});
      AL.total += n_out * r;
    }
  return AL;
}

std::vector<float> lora_init(const Config& c, const LoraOptions& o, uint64_t seed) {
  const AdapterLayout AL = adapter_layout(c, o);
  std::vector<float> v(AL.total, 0.f);
  for (const ParamTensor& t : AL.tensors) {
    if (!t.name.ends_with("lora_A.weight")) continue;
    const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
    for (int64_t i = 0; i < t.size; ++i)
      v[t.offset + i] = static_cast<float>(bound * (2.0 * datasets::uniform01(seed, static_cast<uint64_t>(t.offset + i)) - 1.0));
  }
  return v;
}

std::vector<float> merge_adapters(const Config& c, const LoraOptions& o, std::span<const float> base,
                                  std::span<const float> adapters) {
  return apply_adapters(c, o, base, adapters, 1.0);
}

std::vector<float> unmerge_adapters(const Config& c, const LoraOptions& o, std::span<const float> merged,
                                    std::span<const float> adapters) {
  return apply_adapters(c, o, merged, adapters, -1.0);
}

void save_adapters(const std::filesystem::path& dir, const Config& c, const LoraOptions& o,
                   std::span<const float> adapters, const std::string& base_model) {
  const AdapterLayout AL = adapter_layout(c, o);
  check_values("the adapters", adapters, AL.total);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "save_adapters: cannot create " + dir.string() + ": " + ec.message());
  std::vector<st::TensorData> tensors;
  for (const ParamTensor& t : AL.tensors) {
    st::TensorData d{t.name, DType::f32, t.shape, std::vector<uint8_t>(t.size * 4)};
    std::memcpy(d.bytes.data(), adapters.data() + t.offset, t.size * 4);
    tensors.push_back(std::move(d));
  }
  st::save(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  Json targets = Json::array();
  for (int p = 0; p < kProjCount; ++p)
    if (adapted(o.targets, static_cast<Proj>(p))) targets.push_back(proj_name(static_cast<Proj>(p)));
  const Json cfg = {{"peft_type", "LORA"},
                    {"task_type", "CAUSAL_LM"},
                    {"base_model_name_or_path", base_model},
                    {"r", o.rank},
                    {"lora_alpha", o.alpha},
                    {"lora_dropout", 0.0},
                    {"bias", "none"},
                    {"fan_in_fan_out", false},
                    {"use_rslora", false},
                    {"use_dora", false},
                    {"inference_mode", true},
                    {"init_lora_weights", true},
                    {"target_modules", targets}};
  std::ofstream f(dir / "adapter_config.json");
  f << cfg.dump(2) << "\n";
  MT_CHECK(f.good(), "save_adapters: cannot write " + (dir / "adapter_config.json").string());
}

std::vector<float> load_adapters(const std::filesystem::path& where, const Config& c, LoraOptions& o) {
  const std::filesystem::path dir = std::filesystem::is_directory(where) ? where : where.parent_path();
  const std::filesystem::path cfg_path = dir / "adapter_config.json";
  const std::filesystem::path st_path =
      std::filesystem::is_directory(where) ? dir / "adapter_model.safetensors" : where;
  std::ifstream f(cfg_path);
  MT_CHECK(f.good(), "load_adapters: cannot read " + cfg_path.string());
  Json j;
  try {
    j = Json::parse(f);
  } catch (const std::exception& e) {
    throw Error(cfg_path.string() + ": malformed JSON: " + e.what());
  }
  auto fail = [&](const std::string& what) { return Error(cfg_path.string() + ": " + what); };
  if (!j.is_object() || !j.contains("r") || !j["r"].is_number_integer() || !j.contains("lora_alpha") ||
      !j["lora_alpha"].is_number() || !j.contains("target_modules"))
    throw fail("expected an object with integer \"r\", numeric \"lora_alpha\" and \"target_modules\"");
  if (j.value("peft_type", "LORA") != "LORA") throw fail("peft_type is not LORA");
  if (j.value("bias", "none") != "none") throw fail("adapter biases (bias != \"none\") are not supported");
  if (j.value("use_dora", false)) throw fail("DoRA adapters are not supported");
  if (j.value("use_rslora", false)) throw fail("rsLoRA scaling is not supported");
  if (j.contains("rank_pattern") && !j["rank_pattern"].empty()) throw fail("per-module ranks (rank_pattern) are not supported");
  if (j.contains("alpha_pattern") && !j["alpha_pattern"].empty()) throw fail("per-module alphas (alpha_pattern) are not supported");
  std::array<bool, kProjCount> on{};
  const Json& tm = j["target_modules"];
  if (tm.is_string()) {
    if (tm.get<std::string>() != "all-linear") throw fail("target_modules as a string must be \"all-linear\"");
    on.fill(true);
  } else if (tm.is_array()) {
    for (const auto& m : tm) {
      if (!m.is_string()) throw fail("target_modules holds a non-string");
      try {
        on[static_cast<int>(proj_from_name(m.get<std::string>()))] = true;
      } catch (const Error& e) {
        throw fail(e.what());
      }
    }
  } else {
    throw fail("target_modules must be a list or \"all-linear\"");
  }
  LoraOptions got;
  got.rank = j["r"].get<int64_t>();
  got.alpha = j["lora_alpha"].get<float>();
  bool matched = false;
  for (LoraTargets t : {LoraTargets::qv, LoraTargets::attention, LoraTargets::all_linear}) {
    bool same = true;
    for (int p = 0; p < kProjCount; ++p) same = same && on[p] == adapted(t, static_cast<Proj>(p));
    if (same) {
      got.targets = t;
      matched = true;
    }
  }
  if (!matched) throw fail("target_modules must be {q_proj, v_proj}, the four attention projections, or every linear layer");
  const AdapterLayout AL = adapter_layout(c, got);
  std::map<std::string, const ParamTensor*> want;
  for (const auto& t : AL.tensors) want[t.name] = &t;
  std::vector<float> out(AL.total);
  std::vector<bool> seen(AL.tensors.size());
  for (const st::TensorData& d : st::load(st_path)) {
    // PEFT's files name tensors without the adapter name ("default"); some writers keep it.
    std::string name = d.name;
    if (const auto pos = name.find(".default.weight"); pos != std::string::npos) name.replace(pos, 15, ".weight");
    const auto it = want.find(name);
    MT_CHECK(it != want.end(), st_path.string() + ": unexpected tensor \"" + d.name + "\" for this model and config");
    const ParamTensor& t = *it->second;
    MT_CHECK(d.shape == t.shape, st_path.string() + ": tensor \"" + d.name + "\" has the wrong shape");
    float* dst = out.data() + t.offset;
    for (int64_t i = 0; i < t.size; ++i) {
      if (d.dtype == DType::f32) std::memcpy(&dst[i], &d.bytes[i * 4], 4);
      else if (d.dtype == DType::bf16 || d.dtype == DType::f16) {
        uint16_t bits;
        std::memcpy(&bits, &d.bytes[i * 2], 2);
        dst[i] = d.dtype == DType::bf16 ? to_f32(bf16_t{bits}) : to_f32(f16_t{bits});
      } else {
        throw Error(st_path.string() + ": tensor \"" + d.name + "\" has dtype " + dtype_name(d.dtype) +
                    " (expected F32, BF16 or F16)");
      }
      MT_CHECK(std::isfinite(dst[i]), st_path.string() + ": tensor \"" + d.name + "\" holds a non-finite value");
    }
    seen[&t - AL.tensors.data()] = true;
  }
  for (std::size_t i = 0; i < seen.size(); ++i)
    MT_CHECK(seen[i], st_path.string() + ": missing tensor \"" + AL.tensors[i].name + "\"");
  o = got;
  return out;
}

}  // namespace memtrade::model
