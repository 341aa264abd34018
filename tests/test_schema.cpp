// Declared axes and metrics: type, choice and range checks with messages that name the key, the nearest
// known key as a hint, required keys, and metric lookup by exact name before prefix.
#include <gtest/gtest.h>

#include "common/common.hpp"
#include "harness/schema.hpp"

using namespace memtrade;

namespace {

Schema schema() {
  Schema s;
  s.params = {int_param("n", "size"), bool_param("causal", "mask", false),
              text_param("dtype", "dtype", "fp32", {"fp32", "bf16"}), num_param("lr", "rate", 1e-3, 0, 1)};
  s.metrics = {{"val_loss", "nats", Better::lower, Gate::ratio, 1.02, 0, ""},
               {"val_*", "1", Better::lower, Gate::report, 0, 0, ""},
               {"peak_bytes_*", "bytes", Better::lower, Gate::exact, 0, 0, ""}};
  return s;
}

std::string error_of(const Json& params) {
  try {
    schema().check(params, "suite file s.json, profile 'quick'");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Schema, AcceptsDeclaredKeysOfTheRightTypeAndRange) {
  EXPECT_EQ(error_of(Json{{"n", 4}}), "");
  EXPECT_EQ(error_of(Json{{"n", 4}, {"causal", true}, {"dtype", "bf16"}, {"lr", 1}}), "");
}

TEST(Schema, UnknownKeyNamesTheSourceAndTheNearestKey) {
  const std::string m = error_of(Json{{"n", 4}, {"causl", true}});
  EXPECT_NE(m.find("suite file s.json, profile 'quick': unknown key 'causl' (did you mean 'causal'?)"),
            std::string::npos)
      << m;
  EXPECT_NE(error_of(Json{{"n", 4}, {"zzzzzz", 1}}).find("unknown key 'zzzzzz'; known keys: n, causal, dtype, lr"),
            std::string::npos);
}

TEST(Schema, WrongTypeChoiceRangeAndMissingAreErrors) {
  EXPECT_NE(error_of(Json{{"n", 4.5}}).find("key 'n' must be an integer, got 4.5"), std::string::npos);
  EXPECT_NE(error_of(Json{{"n", 4}, {"causal", 1}}).find("key 'causal' must be a boolean"), std::string::npos);
  EXPECT_NE(error_of(Json{{"n", 4}, {"dtype", "fp16"}}).find("allowed: \"fp32\", \"bf16\""), std::string::npos);
  EXPECT_NE(error_of(Json{{"n", 0}}).find("key 'n' is 0, outside integer >= 1"), std::string::npos);
  EXPECT_NE(error_of(Json{{"n", 2}, {"lr", 2}}).find("outside number in [0, 1]"), std::string::npos);
  EXPECT_NE(error_of(Json{{"causal", true}}).find("required key 'n' is missing"), std::string::npos);
}

TEST(Schema, RequiredWhenAppliesOnlyUnderItsCondition) {
  Schema s;
  s.params = {text_param("model", "which model", "trained", {"trained", "pretrained"}),
              int_param("dim", "width", required_when("model", "trained"))};
  auto err = [&](const Json& j) {
    try {
      s.check(j, "f");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(err(Json{{"dim", 8}}), "");
  EXPECT_EQ(err(Json{{"model", "pretrained"}}), "");
  EXPECT_NE(err(Json::object()).find("key 'dim' is required when model = \"trained\" and is missing"), std::string::npos)
      << err(Json::object());  // the condition holds through model's default
  EXPECT_NE(err(Json{{"model", "trained"}}).find("required when"), std::string::npos);
  EXPECT_NE(s.params[1].describe().find("required when model = \"trained\""), std::string::npos) << s.params[1].describe();
}

TEST(Schema, MetricLookupPrefersExactNames) {
  const Schema s = schema();
  ASSERT_NE(s.metric("val_loss"), nullptr);
  EXPECT_EQ(s.metric("val_loss")->gate, Gate::ratio);
  EXPECT_EQ(s.metric("val_loss_delta")->gate, Gate::report);
  EXPECT_EQ(s.metric("peak_bytes_kv")->unit, "bytes");
  EXPECT_EQ(s.metric("tokens"), nullptr);
}

TEST(Schema, NearestNeedsAClosedWord) {
  EXPECT_EQ(nearest("causl", {"n", "causal", "dtype"}), "causal");
  EXPECT_EQ(nearest("quantiser", {"quantizer", "format"}), "quantizer");
  EXPECT_EQ(nearest("xyz", {"n", "causal"}), "");
}

TEST(Schema, HarnessMetricsCoverTheRunnersCounters) {
  Schema s;
  s.metrics = harness_metrics();
  for (const char* c : {"peak_bytes", "peak_extra_bytes", "peak_bytes_workspace", "max_abs_err", "rel_l2_err",
                        "nan_count", "tflops", "gbytes_per_s", "tokens_per_s", "frac_of_copy_ceiling",
                        "frac_of_read_ceiling", "flush_read_gbytes_per_s", "frac_of_flush_read"})
    EXPECT_NE(s.metric(c), nullptr) << c;
}
