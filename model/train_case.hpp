// The case parameters of every technique that trains the model (precision, quant_model, and the
// training techniques to come): the model config, the optimizer, the training length and the corpus.
// One reader and one schema, so the keys mean the same in every suite file.
#pragma once

#include <string>
#include <vector>

#include "harness/registry.hpp"
#include "harness/schema.hpp"
#include "model/train.hpp"

namespace memtrade::model {

struct TrainCase {
  Config cfg;
  TrainOptions opts;           // batch, seq, lr, warmup_steps, weight_decay, growth_interval, seed
  int64_t steps = 0;           // optimizer steps
  int64_t eval_batches = 0;    // validation batches
  uint64_t seed = 0;           // initialization and batch sampling
  std::string corpus_dir;      // "" : the default fortunes directory
  std::string corpus_sha256;   // "" : not pinned
};

// The schema of those keys (a technique appends its own).
std::vector<Param> train_case_params();

// Reads and validates them; throws Error naming the case and the problem.
TrainCase read_train_case(const Case& c);

// Loads the corpus the case names and checks its pinned checksum.
datasets::Corpus load_case_corpus(const TrainCase& t);

}  // namespace memtrade::model
