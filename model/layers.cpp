// Host-side checks for the layer math in layers.hpp (the math itself is inline, host and device).
#include "model/layers.hpp"

#include <string>

namespace memtrade::model {

namespace {

void check_ids_in_range(const char* what, const int32_t* ids, int64_t n, int64_t vocab) {
  MT_CHECK(vocab > 0, std::string(what) + ": vocabulary size must be positive, got " + std::to_string(vocab));
  MT_CHECK(n == 0 || ids != nullptr, std::string(what) + ": null id array");
  for (int64_t k = 0; k < n; ++k)
    MT_CHECK(ids[k] >= 0 && ids[k] < vocab, std::string(what) + " " + std::to_string(ids[k]) + " at position " +
                                                std::to_string(k) + " is outside [0, " + std::to_string(vocab) + ")");
}

}  // namespace

void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab) { check_ids_in_range("token id", ids, n, vocab); }

void check_targets(const int32_t* targets, int64_t n, int64_t vocab) {
  MT_CHECK(vocab > 0, "target: vocabulary size must be positive, got " + std::to_string(vocab));
  MT_CHECK(n == 0 || targets != nullptr, "target: null id array");
  for (int64_t k = 0; k < n; ++k)
    MT_CHECK(targets[k] == kIgnoreTarget || (targets[k] >= 0 && targets[k] < vocab),
             "target " + std::to_string(targets[k]) + " at position " + std::to_string(k) + " is outside [0, " +
                 std::to_string(vocab) + ") and is not the ignore value " + std::to_string(kIgnoreTarget));
}

void check_rope_shape(int64_t seq, int64_t heads, int64_t head_dim) {
  MT_CHECK(seq >= 0 && heads >= 0, "rope: negative seq or heads");
  MT_CHECK(head_dim > 0 && head_dim % 2 == 0,
           "rope: head_dim must be positive and even, got " + std::to_string(head_dim));
}

}  // namespace memtrade::model
