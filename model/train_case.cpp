#include "model/train_case.hpp"

namespace memtrade::model {

std::vector<Param> train_case_params() {
  return {
      int_param("dim", "model width"),
      int_param("layers", "decoder layers"),
      int_param("heads", "query heads (divide dim)"),
      int_param("kv_heads", "key/value heads (divide heads)", derived("heads"), 1),
      int_param("ffn", "SwiGLU hidden width"),
      int_param("context", "longest trained sequence (RoPE positions)"),
      int_param("vocab", "vocabulary (bytes)", 256, 1, 256),
      num_param("norm_eps", "RMSNorm epsilon", 1e-5, 0),
      num_param("rope_theta", "RoPE base", 10000.0, 1),
      int_param("batch", "sequences per micro-batch"),
      int_param("seq", "tokens per sequence", derived("context"), 1),
      int_param("steps", "optimizer steps", nullptr, 0),
      num_param("lr", "peak learning rate", 1e-3, 0),
      int_param("warmup_steps", "linear learning-rate warm-up", 0, 0),
      num_param("weight_decay", "AdamW decoupled weight decay", 0.1, 0),
      int_param("growth_interval", "dynamic loss scaling: clean steps before the scale doubles", 2000, 1),
      int_param("eval_batches", "validation batches", 8, 1),
      int_param("seed", "initialization and batch sampling", 1, 0),
      text_param("corpus_dir", "fortunes directory; default: $MEMTRADE_FORTUNES_DIR or the Debian path", ""),
      text_param("corpus_sha256", "the corpus checksum the case expects (a mismatch is an error)", ""),
  };
}

namespace {
double number(const Case& c, const char* key, double fallback) {
  if (!c.params.contains(key)) return fallback;
  MT_CHECK(c.params.at(key).is_number(), "case " + c.id + ": \"" + key + "\" must be a number");
  return c.params.at(key).get<double>();
}
}  // namespace

TrainCase read_train_case(const Case& c) {
  TrainCase t;
  Json cfg = c.params;
  if (!cfg.contains("context") && cfg.contains("seq")) cfg["context"] = cfg["seq"];
  try {
    t.cfg = config_from_json(cfg);
  } catch (const Error& e) {
    throw Error("case " + c.id + ": " + e.what());
  }
  t.opts.batch = c.integer("batch");
  t.opts.seq = c.integer("seq", t.cfg.context);
  t.opts.lr = static_cast<float>(number(c, "lr", 1e-3));
  t.opts.warmup_steps = c.integer("warmup_steps", 0);
  t.opts.weight_decay = static_cast<float>(number(c, "weight_decay", 0.1));
  t.opts.growth_interval = c.integer("growth_interval", 2000);
  t.steps = c.integer("steps");
  t.eval_batches = c.integer("eval_batches", 8);
  t.seed = static_cast<uint64_t>(c.integer("seed", 1));
  t.opts.seed = t.seed;
  t.corpus_dir = c.text("corpus_dir", "");
  t.corpus_sha256 = c.text("corpus_sha256", "");
  MT_CHECK(t.steps >= 0 && t.eval_batches > 0, "case " + c.id + ": steps must be >= 0 and eval_batches > 0");
  validate(t.cfg, t.opts);
  return t;
}

datasets::Corpus load_case_corpus(const TrainCase& t) {
  datasets::Corpus corpus =
      datasets::load_fortunes(t.corpus_dir.empty() ? datasets::default_fortunes_dir().string() : t.corpus_dir);
  MT_CHECK(t.corpus_sha256.empty() || t.corpus_sha256 == corpus.sha256,
           "corpus " + corpus.source + " has SHA-256 " + corpus.sha256 + ", the case expects " + t.corpus_sha256 +
               " (a different fortunes package version: update corpus_sha256 in the suite, or install that version)");
  return corpus;
}

}  // namespace memtrade::model
