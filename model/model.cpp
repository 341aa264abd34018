#include "model/model.hpp"

#include <cmath>
#include <cstring>

#include "datasets/random.hpp"
#include "common/dtype.hpp"
#include "model/safetensors.hpp"

namespace memtrade::model {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

int64_t get_int(const Json& j, const char* key, int64_t fallback, bool required) {
  if (!j.contains(key)) {
    MT_CHECK(!required, std::string("model config: missing \"") + key + "\"");
    return fallback;
  }
  MT_CHECK(j.at(key).is_number_integer(), std::string("model config: \"") + key + "\" must be an integer");
  return j.at(key).get<int64_t>();
}

float get_float(const Json& j, const char* key, float fallback) {
  if (!j.contains(key)) return fallback;
  MT_CHECK(j.at(key).is_number(), std::string("model config: \"") + key + "\" must be a number");
  return j.at(key).get<float>();
}

}  // namespace

void validate(const Config& c) {
  auto positive = [](const char* what, int64_t v) {
    MT_CHECK(v > 0, std::string("model config: ") + what + " must be positive, got " + num(v));
  };
  positive("vocab", c.vocab);
  positive("dim", c.dim);
  positive("layers", c.layers);
  positive("heads", c.heads);
  positive("kv_heads", c.kv_heads);
  positive("ffn", c.ffn);
  positive("context", c.context);
  MT_CHECK(c.dim % c.heads == 0,
           "model config: heads (" + num(c.heads) + ") must divide dim (" + num(c.dim) + ")");
  MT_CHECK(c.heads % c.kv_heads == 0,
           "model config: kv_heads (" + num(c.kv_heads) + ") must divide heads (" + num(c.heads) + ")");
  MT_CHECK(c.head_dim() % 2 == 0, "model config: head_dim = dim / heads = " + num(c.head_dim()) +
                                      " must be even (RoPE rotates pairs)");
  MT_CHECK(c.head_dim() <= 256, "model config: head_dim " + num(c.head_dim()) + " exceeds 256");
  MT_CHECK(c.vocab <= (int64_t{1} << 31) - 1, "model config: vocab does not fit int32 token ids");
  MT_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0, "model config: norm_eps must be positive");
  MT_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 1, "model config: rope_theta must be > 1");
}

Config config_from_json(const Json& j) {
  MT_CHECK(j.is_object(), "model config: expected a JSON object");
  Config c;
  c.vocab = get_int(j, "vocab", 256, false);
  c.dim = get_int(j, "dim", 0, true);
  c.layers = get_int(j, "layers", 0, true);
  c.heads = get_int(j, "heads", 0, true);
  c.kv_heads = get_int(j, "kv_heads", c.heads, false);
  c.ffn = get_int(j, "ffn", 0, true);
  c.context = get_int(j, "context", 0, true);
  c.norm_eps = get_float(j, "norm_eps", c.norm_eps);
  c.rope_theta = get_float(j, "rope_theta", c.rope_theta);
  if (j.contains("tie_embeddings")) {
    MT_CHECK(j.at("tie_embeddings").is_boolean(), "model config: \"tie_embeddings\" must be true or false");
    c.tie_embeddings = j.at("tie_embeddings").get<bool>();
  }
  validate(c);
  return c;
}

Config config_from_case(const Case& c) {
  try {
    return config_from_json(c.params);
  } catch (const Error& e) {
    throw Error("case " + c.id + ": " + e.what());
  }
}

Json to_json(const Config& c) {
  Json j;
  j["vocab"] = c.vocab;
  j["dim"] = c.dim;
  j["layers"] = c.layers;
  j["heads"] = c.heads;
  j["kv_heads"] = c.kv_heads;
  j["ffn"] = c.ffn;
  j["context"] = c.context;
  j["norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.tie_embeddings) j["tie_embeddings"] = true;
  return j;
}

ParamLayout param_layout(const Config& c) {
  validate(c);
  ParamLayout p;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    p.tensors.push_back({std::move(name), std::move(shape), p.total, n, decay});
    p.total += n;
    return p.tensors.back().offset;
  };
  const int64_t d = c.dim, kv = c.kv_dim(), f = c.ffn;
  p.embed = add("model.embed_tokens.weight", {c.vocab, d}, true);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string pre = "model.layers." + num(l) + ".";
    ParamLayout::Layer L{};
    L.attn_norm = add(pre + "input_layernorm.weight", {d}, false);
    L.wq = add(pre + "self_attn.q_proj.weight", {d, d}, true);
    L.wk = add(pre + "self_attn.k_proj.weight", {kv, d}, true);
    L.wv = add(pre + "self_attn.v_proj.weight", {kv, d}, true);
    L.wo = add(pre + "self_attn.o_proj.weight", {d, d}, true);
    L.mlp_norm = add(pre + "post_attention_layernorm.weight", {d}, false);
    L.wg = add(pre + "mlp.gate_proj.weight", {f, d}, true);
    L.wu = add(pre + "mlp.up_proj.weight", {f, d}, true);
    L.wd = add(pre + "mlp.down_proj.weight", {d, f}, true);
    p.layer.push_back(L);
  }
  p.final_norm = add("model.norm.weight", {d}, false);
  p.head = c.tie_embeddings ? p.embed : add("lm_head.weight", {c.vocab, d}, true);
  return p;
}

std::vector<float> init_params(const Config& c, uint64_t seed) {
  const ParamLayout p = param_layout(c);
  std::vector<float> w(p.total);
  const double residual = 1.0 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (const ParamTensor& t : p.tensors) {
    const bool norm = t.shape.size() == 1;
    const bool out_proj = t.name.ends_with("o_proj.weight") || t.name.ends_with("down_proj.weight");
    const double std = 0.02 * (out_proj ? residual : 1.0);
    for (int64_t i = 0; i < t.size; ++i)
      w[t.offset + i] = norm ? 1.f : static_cast<float>(std * datasets::normal(seed, static_cast<uint64_t>(t.offset + i)));
  }
  return w;
}

double train_flops_per_token(const Config& c, int64_t seq) {
  const ParamLayout p = param_layout(c);
  double matrix = 0;
  for (const ParamTensor& t : p.tensors)
    if (t.shape.size() == 2 && t.offset != p.embed) matrix += static_cast<double>(t.size);
  if (c.tie_embeddings) matrix += static_cast<double>(c.vocab * c.dim);  // the head reads the embedding
  const double attention = 3.5 * 2.0 * static_cast<double>(seq) * static_cast<double>(c.dim) *
                           static_cast<double>(c.layers);
  return 6.0 * matrix + attention;
}

void save_checkpoint(const std::filesystem::path& path, const Config& c, std::span<const float> params, DType dtype,
                     const std::map<std::string, std::string>& extra) {
  const ParamLayout p = param_layout(c);
  MT_CHECK(static_cast<int64_t>(params.size()) == p.total,
           "save_checkpoint: " + num(static_cast<int64_t>(params.size())) + " values for a model of " +
               num(p.total) + " parameters");
  MT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
           std::string("save_checkpoint: unsupported dtype ") + dtype_name(dtype));
  std::vector<st::TensorData> tensors;
  for (const ParamTensor& t : p.tensors) {
    st::TensorData d{t.name, dtype, t.shape, std::vector<uint8_t>(t.size * dtype_size(dtype))};
    for (int64_t i = 0; i < t.size; ++i) {
      const float v = params[t.offset + i];
      if (dtype == DType::f32) std::memcpy(&d.bytes[i * 4], &v, 4);
      else {
        const uint16_t bits = dtype == DType::bf16 ? to_bf16(v).bits : to_f16(v).bits;
        std::memcpy(&d.bytes[i * 2], &bits, 2);
      }
    }
    tensors.push_back(std::move(d));
  }
  std::map<std::string, std::string> meta = extra;
  meta["memtrade.config"] = to_json(c).dump();
  meta["format"] = "pt";
  st::save(path, tensors, meta);
}

std::vector<float> load_checkpoint(const std::filesystem::path& path, Config& c) {
  const auto meta = st::load_metadata(path);
  const auto it = meta.find("memtrade.config");
  MT_CHECK(it != meta.end(), path.string() + ": no \"memtrade.config\" metadata (not a memtrade model checkpoint)");
  Json j;
  try {
    j = Json::parse(it->second);
  } catch (const std::exception& e) {
    throw Error(path.string() + ": malformed memtrade.config metadata: " + e.what());
  }
  c = config_from_json(j);
  const ParamLayout p = param_layout(c);
  std::map<std::string, st::TensorData> by_name;
  for (auto& t : st::load(path)) by_name.emplace(t.name, std::move(t));
  std::vector<float> w(p.total);
  for (const ParamTensor& t : p.tensors) {
    const auto f = by_name.find(t.name);
    MT_CHECK(f != by_name.end(), path.string() + ": missing tensor " + t.name);
    const st::TensorData& d = f->second;
    MT_CHECK(d.shape == t.shape, path.string() + ": tensor " + t.name + " has the wrong shape");
    for (int64_t i = 0; i < t.size; ++i) {
      float v;
      if (d.dtype == DType::f32) {
        std::memcpy(&v, &d.bytes[i * 4], 4);
      } else if (d.dtype == DType::bf16 || d.dtype == DType::f16) {
        uint16_t b;
        std::memcpy(&b, &d.bytes[i * 2], 2);
        v = d.dtype == DType::bf16 ? to_float(bf16_t{b}) : to_float(f16_t{b});
      } else {
        throw Error(path.string() + ": tensor " + t.name + " has unsupported dtype " + dtype_name(d.dtype));
      }
      MT_CHECK(std::isfinite(v), path.string() + ": tensor " + t.name + " holds a non-finite value at " + num(i));
      w[t.offset + i] = v;
    }
  }
  return w;
}

}  // namespace memtrade::model
