// A toy technique for the harness's own tests, so they link without any real technique: y = 2 x over
// n floats. `reference` allocates a float64 scratch of n values per call (tag workspace); `twice`
// computes in place. Parameters: n (integer >= 1), scale (number, default 1: multiplies the input),
// untracked (bytes, default 0: each call also fills a std::vector of that size, outside the tracked
// pools, for the heap probe's test).
#pragma once

#include <memory>
#include <vector>

#include "harness/registry.hpp"
#include "harness/tensor.hpp"

namespace memtrade::test {

struct ToyProblem final : Problem {
  std::vector<double> x, oracle;
  std::size_t untracked = 0;
};

class ToyWorkload final : public Workload {
 public:
  ToyWorkload(const ToyProblem& p, Device& dev, bool scratch)
      : p_(p), dev_(dev), scratch_(scratch), x_(dev.memory(), p.x.size() * sizeof(float), Tag::io),
        y_(dev.memory(), p.x.size() * sizeof(float), Tag::io) {
    std::vector<float> xf(p.x.begin(), p.x.end());
    dev.copy(x_.data(), xf.data(), x_.bytes(), CopyKind::host_to_device);
  }
  void run() override {
    const std::size_t n = p_.x.size();
    if (p_.untracked) {
      std::vector<char> escaped(p_.untracked, 1);
      sink_ = escaped[p_.untracked / 2];
    }
    if (scratch_) {
      Buffer tmp(dev_.memory(), n * sizeof(double), Tag::workspace);
      for (std::size_t i = 0; i < n; ++i) tmp.as<double>()[i] = 2.0 * x_.as<float>()[i];
      for (std::size_t i = 0; i < n; ++i) y_.as<float>()[i] = static_cast<float>(tmp.as<double>()[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) y_.as<float>()[i] = 2.0f * x_.as<float>()[i];
    }
  }
  ErrorStats error() override {
    std::vector<double> y(y_.as<float>(), y_.as<float>() + p_.x.size());
    return error_stats(y, p_.oracle);
  }
  Work work() const override {
    Work w;
    w.bytes = 8.0 * static_cast<double>(p_.x.size());
    return w;
  }

 private:
  const ToyProblem& p_;
  Device& dev_;
  bool scratch_;
  Buffer x_, y_;
  volatile char sink_ = 0;
};

inline Technique toy_technique() {
  Technique t;
  t.name = "toy";
  t.description = "y = 2 x";
  t.schema.params = {int_param("n", "elements"), num_param("scale", "input scale", 1.0, 0),
                     int_param("untracked", "bytes allocated per call outside the tracked pools", 0, 0)};
  t.prepare = [](const Case& c) -> std::unique_ptr<Problem> {
    auto p = std::make_unique<ToyProblem>();
    const double scale = c.params.value("scale", 1.0);
    p->untracked = static_cast<std::size_t>(c.params.value("untracked", 0));
    for (int64_t i = 0; i < c.integer("n"); ++i) {
      p->x.push_back(static_cast<float>(scale * (0.25 * static_cast<double>(i % 7) - 0.5)));
      p->oracle.push_back(2.0 * p->x.back());
    }
    return p;
  };
  for (bool scratch : {true, false})
    t.impls.push_back(typed_impl<ToyProblem>("toy", scratch ? "reference" : "twice",
                                             scratch ? Role::reference : Role::optimized, Backend::cpu,
                                             scratch ? "float64 scratch" : "in place",
                                             [scratch](const ToyProblem& p, Device& dev) {
                                               return std::make_unique<ToyWorkload>(p, dev, scratch);
                                             }));
  return t;
}

inline Case toy_case(int64_t n) {
  Case c;
  c.suite = "toy";
  c.params = Json{{"n", n}};
  c.id = case_id(c.params);
  c.x = static_cast<double>(n);
  return c;
}

}  // namespace memtrade::test
