#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "harness/suite.hpp"
#include "test_util.hpp"

using namespace memtrade;
namespace fs = std::filesystem;

namespace {
fs::path write_temp(const std::string& name, const std::string& text) {
  const auto p = test::scratch_dir() / (name + ".json");
  std::ofstream(p) << text;
  return p;
}
std::string error_of(const std::string& text) {
  try {
    load_suite(write_temp("bad", text));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Suite, GridIsACartesianProductInWrittenOrder) {
  const auto s = load_suite(write_temp("grid", R"({"suite": "s", "technique": "gemm", "x_param": "n",
    "profiles": {"quick": {"repetitions": 5, "grid": [{"n": [1, 2], "dtype": ["fp32", "bf16"]}, {"n": [7], "dtype": ["fp16"]}]}}})"));
  const auto& p = s.profile("quick");
  EXPECT_EQ(p.repetitions, 5);
  ASSERT_EQ(p.cases.size(), 5u);
  EXPECT_EQ(p.cases[0].id, "n=1,dtype=fp32");
  EXPECT_EQ(p.cases[1].id, "n=1,dtype=bf16");
  EXPECT_EQ(p.cases[3].id, "n=2,dtype=bf16");
  EXPECT_EQ(p.cases[4].id, "n=7,dtype=fp16");
  EXPECT_EQ(p.cases[4].x, 7);
  EXPECT_EQ(p.cases[4].integer("n"), 7);
  EXPECT_EQ(p.cases[4].text("dtype"), "fp16");
  EXPECT_THROW(p.cases[4].text("n"), Error);
  EXPECT_THROW(p.cases[4].integer("missing"), Error);
  EXPECT_THROW(s.profile("full"), Error);
}

TEST(Suite, MalformedFilesGetMessagesNamingTheProblem) {
  EXPECT_NE(error_of("{\"suite\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("top level"), std::string::npos);
  EXPECT_NE(error_of(R"({"technique": "t", "x_param": "n", "profiles": {}})").find("'suite'"), std::string::npos);
  EXPECT_NE(error_of(R"({"suite": "s", "technique": "t", "x_param": "n", "profiles": {"q": {"grid": []}}})")
                .find("non-empty 'grid'"), std::string::npos);
  EXPECT_NE(error_of(R"({"suite": "s", "technique": "t", "x_param": "n", "profiles": {"q": {"grid": [{"n": []}]}}})")
                .find("non-empty list"), std::string::npos);
  EXPECT_NE(error_of(R"({"suite": "s", "technique": "t", "x_param": "size", "profiles": {"q": {"grid": [{"n": [1]}]}}})")
                .find("x parameter 'size'"), std::string::npos);
  EXPECT_NE(error_of(R"({"suite": "s", "technique": "t", "x_param": "n", "profiles": {"q": {"repetitions": 0, "grid": [{"n": [1]}]}}})")
                .find("repetitions"), std::string::npos);
  EXPECT_NE(error_of(R"({"suite": "s", "technique": "t", "x_param": "n", "profiles": {"q": {"grid": [{"n": [1]}, {"n": [1]}]}}})")
                .find("twice"), std::string::npos);
  const auto msg = error_of("{");
  EXPECT_NE(msg.find((test::scratch_dir() / "bad.json").string()), std::string::npos) << msg;  // names the file
  EXPECT_THROW(load_suite("/nonexistent/suite.json"), Error);
}

TEST(Suite, ShippedSuitesLoadAndHaveQuickAndFullProfiles) {
  const auto suites = load_all_suites(fs::path(MEMTRADE_SOURCE_DIR) / "suites");
  ASSERT_FALSE(suites.empty());
  for (const auto& s : suites) {
    EXPECT_NO_THROW(s.profile("quick")) << s.name;
    EXPECT_NO_THROW(s.profile("full")) << s.name;
  }
}
