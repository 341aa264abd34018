// SmolLM2-135M-Instruct from its GGUF file against independent implementations: the gguf package's
// dequantization, and the tokenizer and LlamaForCausalLM transformers builds from the same file (values
// stored in tests/reference/smollm2.json by tests/reference/smollm2_reference.py). The tokenizer's
// pre-tokenizer and BPE are also checked on their own, without the file. Tests that need the model skip,
// naming the command that fetches it, when it is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "common/common.hpp"
#include "datasets/corpus.hpp"
#include "harness/device.hpp"
#include "model/gguf_model.hpp"
#include "model/train.hpp"

namespace fs = std::filesystem;
using namespace memtrade;

namespace {

const Json& reference() {
  static const Json j = [] {
    std::ifstream in(fs::path(MEMTRADE_SOURCE_DIR) / "tests" / "reference" / "smollm2.json");
    return Json::parse(in);
  }();
  return j;
}

bool have_model() { return fs::exists(model::smollm2_path()); }
#define REQUIRE_MODEL()                                                                                    \
  if (!have_model()) GTEST_SKIP() << model::smollm2_path().string() << " is absent: run " << model::kFetchModelsCommand

const model::Pretrained& smollm2() {
  static const model::Pretrained m = model::load_gguf_model(model::smollm2_path());
  return m;
}

// The fortunes corpus as text, or nullptr (with the reason) when it is not the one the reference used.
const std::string* corpus_text(std::string& why) {
  static const datasets::Corpus c = datasets::load_fortunes();
  static const std::string text(c.bytes.begin(), c.bytes.end());
  if (c.sha256 != reference()["corpus_sha256"].get<std::string>()) {
    why = "the fortunes corpus here (" + c.sha256 + ") is not the reference's; rerun tests/reference/smollm2_reference.py";
    return nullptr;
  }
  return &text;
}

std::string sha256_of(std::span<const float> v) {
  return datasets::sha256_hex({reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
}

std::unique_ptr<model::Trainer> inference(const model::Pretrained& m, Device& dev, int64_t seq) {
  model::TrainOptions o;
  o.batch = 1;
  o.seq = seq;
  o.inference_only = true;
  return model::make_trainer_cpu(m.cfg, o, dev, m.params);
}

datasets::Batch window(std::span<const int32_t> ids) {
  datasets::Batch b;
  b.batch = 1;
  b.context = static_cast<int64_t>(ids.size()) - 1;
  b.inputs.assign(ids.begin(), ids.end() - 1);
  b.targets.assign(ids.begin() + 1, ids.end());
  return b;
}

// A toy vocabulary: the 256 byte symbols, then merges "a b" -> "ab", "ab c" -> "abc", "Ġ a" -> "Ġa".
model::Tokenizer toy_tokenizer() {
  std::vector<std::string> tokens;
  // The byte symbols in GPT-2's bytes_to_unicode order: printable Latin-1 as themselves, then 256 + n.
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    tokens.push_back(utf8(printable ? static_cast<uint32_t>(b) : next++));
  }
  tokens.push_back("ab");
  tokens.push_back("abc");
  tokens.push_back(utf8(256 + ' ') + "a");  // " a": the space byte maps to U+0120 'Ġ'
  tokens.push_back("<|end|>");
  const std::vector<std::string> merges = {"a b", "ab c", utf8(256 + ' ') + " a"};
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  return model::Tokenizer(tokens, merges, types);
}

}  // namespace

TEST(Tokenizer, SplitFollowsGpt2sPattern) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(model::Tokenizer::split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(model::Tokenizer::split("it's  fine.\n\nok"), (V{"it", "'s", " ", " fine", ".", "\n", "\n", "ok"}));
  EXPECT_EQ(model::Tokenizer::split("x = 1234;  "), (V{"x", " =", " 1234", ";", "  "}));
  EXPECT_EQ(model::Tokenizer::split("''s we'll 'X"), (V{"''", "s", " we", "'ll", " '", "X"}));
  EXPECT_EQ(model::Tokenizer::split(" \ta"), (V{" ", "\t", "a"}));
  EXPECT_EQ(model::Tokenizer::split("caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac\xd9\xa1\xd9\xa2"),
            (V{"caf\xc3\xa9", " \xe6\x9d\xb1\xe4\xba\xac", "\xd9\xa1\xd9\xa2"}));  // é, 東京 letters; ١٢ numbers
  EXPECT_EQ(model::Tokenizer::split("a\xff\xfe b"), (V{"a", "\xff\xfe", " b"}));  // invalid UTF-8: other
  EXPECT_EQ(model::Tokenizer::split(""), V{});
}

TEST(Tokenizer, MergesByRankAndSplitsSpecialTokens) {
  const model::Tokenizer t = toy_tokenizer();
  const int32_t a = 'a', ab = 256, abc = 257, sp_a = 258, end = 259;
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{abc}));
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{ab, ab}));
  EXPECT_EQ(t.encode("aa a"), (std::vector<int32_t>{a, a, sp_a}));
  EXPECT_EQ(t.encode("abc<|end|>abc"), (std::vector<int32_t>{abc, end, abc}));
  for (std::string s : {"", "abc<|end|>", "\xff\x00 x\n\n  y", "<|end|<|end|>>"}) EXPECT_EQ(t.decode(t.encode(s)), s);
  EXPECT_THROW(t.decode(std::vector<int32_t>{1000}), Error);
  const std::vector<std::string> merges = {"a b"}, bad = {"a zz"};
  const model::Tokenizer letters(std::vector<std::string>{"a", "b", "ab"}, merges);
  EXPECT_EQ(letters.encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_THROW(letters.encode("abc"), Error);  // no token for the byte 'c'
  EXPECT_THROW(model::Tokenizer(std::vector<std::string>{"a", "b", "ab"}, bad), Error);
}

TEST(Pretrained, DequantizationEqualsTheGgufPackageOnEveryTensor) {
  REQUIRE_MODEL();
  const gguf::File f(model::smollm2_path());
  const Json& want = reference()["dequantized_sha256"];
  ASSERT_EQ(f.tensors().size(), want.size());
  int q41 = 0, q80 = 0;
  for (const gguf::Tensor& t : f.tensors()) {
    EXPECT_EQ(sha256_of(f.dequantize(t)), want[t.name].get<std::string>()) << t.name;
    q41 += t.type == gguf::TensorType::q4_1;
    q80 += t.type == gguf::TensorType::q8_0;
  }
  EXPECT_EQ(q41, 210);
  EXPECT_EQ(q80, 1);
}

TEST(Pretrained, ConfigurationAndParametersFromTheMetadata) {
  REQUIRE_MODEL();
  const model::Pretrained& m = smollm2();
  EXPECT_EQ(m.cfg.dim, 576);
  EXPECT_EQ(m.cfg.layers, 30);
  EXPECT_EQ(m.cfg.heads, 9);
  EXPECT_EQ(m.cfg.kv_heads, 3);
  EXPECT_EQ(m.cfg.ffn, 1536);
  EXPECT_EQ(m.cfg.vocab, 49152);
  EXPECT_TRUE(m.cfg.tie_embeddings);
  EXPECT_FLOAT_EQ(m.cfg.rope_theta, 100000.f);
  EXPECT_FLOAT_EQ(m.cfg.norm_eps, 1e-5f);
  EXPECT_EQ(static_cast<int64_t>(m.params.size()), 134515008);  // Hugging Face's count for SmolLM2-135M
  EXPECT_EQ(m.stored_type.at("model.layers.0.self_attn.q_proj.weight"), "Q4_1");
  EXPECT_EQ(m.stored_type.at("model.embed_tokens.weight"), "Q8_0");
  EXPECT_EQ(m.tokenizer.pre, "smollm");
  EXPECT_EQ(m.tokenizer.bos, 1);
  EXPECT_EQ(m.tokenizer.eos, 2);
}

TEST(Pretrained, RopeRowUnpermutationInvertsLlamaCppsPermutation) {
  // llama.cpp: w.reshape(heads, 2, hd / 2, cols).swapaxes(1, 2): HF row h*hd + i*hd/2 + j -> row h*hd + 2j + i.
  const int64_t heads = 2, hd = 6, cols = 3;
  std::vector<float> hf(heads * hd * cols), permuted(hf.size());
  for (std::size_t i = 0; i < hf.size(); ++i) hf[i] = static_cast<float>(i);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < hd / 2; ++j)
        for (int64_t c = 0; c < cols; ++c)
          permuted[(h * hd + 2 * j + i) * cols + c] = hf[(h * hd + i * hd / 2 + j) * cols + c];
  EXPECT_EQ(model::unpermute_rope_rows(permuted, heads, hd, cols), hf);
}

TEST(Pretrained, TokenizerIdsEqualTransformersOnTheWholeCorpus) {
  REQUIRE_MODEL();
  std::string why;
  const std::string* text = corpus_text(why);
  if (!text) GTEST_SKIP() << why;
  const model::Tokenizer& t = smollm2().tokenizer;
  const std::vector<int32_t> ids = t.encode(*text);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), reference()["corpus_tokens"].get<int64_t>());
  const auto head = reference()["corpus_ids_head"].get<std::vector<int32_t>>();
  EXPECT_TRUE(std::equal(head.begin(), head.end(), ids.begin()));
  EXPECT_EQ(datasets::sha256_hex({reinterpret_cast<const uint8_t*>(ids.data()), ids.size() * 4}),
            reference()["corpus_ids_sha256"].get<std::string>());
  EXPECT_EQ(t.decode(ids), *text);
  EXPECT_EQ(t.encode(reference()["prompt"].get<std::string>()), reference()["prompt_ids"].get<std::vector<int32_t>>());
  const std::string chat = "<|im_start|>user\nHi \xe6\x9d\xb1\xe4\xba\xac!\x80\x01<|im_end|>\n";
  EXPECT_EQ(t.decode(t.encode(chat)), chat);
  EXPECT_EQ(t.encode("<|im_start|>").size(), 1u);
  try {
    t.encode("a\x04" "b");
    ADD_FAILURE() << "byte 0x04 has no token in SmolLM2's vocabulary: encoding must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 0x04"), std::string::npos) << e.what();
  }
}

TEST(Pretrained, LogitsMatchTransformersWithin1e3) {
  REQUIRE_MODEL();
  const model::Pretrained& m = smollm2();
  auto ids = reference()["prompt_ids"].get<std::vector<int32_t>>();
  ids.push_back(0);  // a target for the last position (its logits do not depend on it)
  auto dev = make_cpu_device();
  const int64_t T = static_cast<int64_t>(ids.size()) - 1, V = m.cfg.vocab;
  const std::vector<float> logits = inference(m, *dev, T)->logits(window(ids));
  const Json& want = reference()["prompt_logits"];
  const auto probes = reference()["logit_probe_ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(static_cast<int64_t>(want.size()), T);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = &logits[t * V];
    const Json& w = want[t];
    for (std::size_t k = 0; k < probes.size(); ++k)
      worst = std::max(worst, std::abs(row[probes[k]] - w["probes"][k].get<double>()));
    double mx = row[0], sum = 0;
    int64_t arg = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > mx) mx = row[v], arg = v;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    worst = std::max({worst, std::abs(mx - w["max"].get<double>()), std::abs(mx + std::log(sum) - w["logsumexp"].get<double>())});
    EXPECT_EQ(arg, w["argmax"].get<int64_t>()) << "position " << t;
  }
  EXPECT_LE(worst, 1e-3);
  RecordProperty("max_abs_logit_diff", std::to_string(worst));
}

TEST(Pretrained, PerplexityWithinATenthOfAPercentOfTransformers) {
  REQUIRE_MODEL();
  std::string why;
  const std::string* text = corpus_text(why);
  if (!text) GTEST_SKIP() << why;
  const model::Pretrained& m = smollm2();
  const Json& p = reference()["perplexity"];
  const std::vector<int32_t> ids = m.tokenizer.encode(*text);
  const auto start = p["start_token"].get<std::size_t>(), n = p["tokens"].get<std::size_t>();
  ASSERT_LE(start + n, ids.size());
  auto dev = make_cpu_device();
  const double nll = inference(m, *dev, static_cast<int64_t>(n) - 1)->eval_loss(window({ids.data() + start, n}));
  const double ppl = std::exp(nll), want = p["perplexity"].get<double>();
  EXPECT_LE(std::abs(ppl / want - 1), 1e-3) << "memtrade " << ppl << ", transformers " << want;
  RecordProperty("perplexity", std::to_string(ppl));
}
