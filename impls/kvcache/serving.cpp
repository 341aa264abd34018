#include "impls/kvcache/serving.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include "common/common.hpp"
#include "datasets/random.hpp"

namespace memtrade::kvcache {

TraceSpec trace_spec(const std::string& name) {
  TraceSpec t;
  if (name == "sharegpt") return t;
  if (name == "alpaca") {
    t.prompt_mean = 19;
    t.output_mean = 58;
    return t;
  }
  throw Error("unknown serving trace \"" + name + "\" (sharegpt, alpaca)");
}

ResidualModel residual_model(const KvShape& s) {
  if (!s.kivi()) return {};
  s.validate();
  const int64_t tb = s.token_bytes(), bytes = s.residual_bytes();
  return {s.residual, (bytes + tb - 1) / tb,
          static_cast<double>(bytes) / static_cast<double>(s.residual) / static_cast<double>(tb)};
}

int64_t budget_tokens_of(const KvShape& s, int64_t budget_bytes, int64_t block, int64_t max_len) {
  s.validate();
  const int64_t residual = residual_model(s).tokens;
  MT_CHECK(budget_bytes > 0 && block > 0, "serving: the KV budget and the block must be positive");
  const int64_t tokens = budget_bytes / s.token_bytes() / block * block;
  MT_CHECK(tokens >= max_len + residual + block,
           "serving: a KV budget of " + std::to_string(budget_bytes) + " bytes holds " + std::to_string(tokens) +
               " tokens of " + std::to_string(s.token_bytes()) + " bytes (" + kv_type_name(s.type) +
               "), fewer than max_len (" + std::to_string(max_len) + ")" +
               (residual ? ", a request's residual (" + std::to_string(residual) + " tokens)" : std::string()) +
               " and one block");
  return tokens;
}

namespace {

struct Request {
  int64_t prompt = 0, output = 0;  // tokens
  int64_t id = -1;                 // in the cache, while running
  int64_t generated = 0;
  int64_t pooled = 0;  // of its tokens, those in the pool (the rest are in its residual)
};

// Exponential with the given mean, rounded up, within [1, cap].
int64_t draw(double mean, uint64_t seed, uint64_t i, int64_t cap) {
  const double u = datasets::uniform01(seed, i);
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(-mean * std::log(1.0 - u))), 1, cap);
}

}  // namespace

ServingStats simulate(KvCache& cache, bool paged, const TraceSpec& trace, int64_t budget_tokens,
                      const ResidualModel& residual) {
  MT_CHECK(trace.requests > 0 && trace.max_len > 1 && budget_tokens >= trace.max_len + residual.tokens,
           "serving: needs requests > 0 and a budget of at least max_len tokens and a request's residual");
  MT_CHECK(residual.group >= 1 && residual.tokens >= 0 && residual.per_token >= 0, "serving: a bad residual model");
  std::deque<Request> waiting;
  for (int64_t i = 0; i < trace.requests; ++i) {
    Request r;
    r.prompt = draw(trace.prompt_mean, trace.seed, 2 * static_cast<uint64_t>(i), trace.max_len - 1);
    r.output = draw(trace.output_mean, trace.seed, 2 * static_cast<uint64_t>(i) + 1, trace.max_len - r.prompt);
    waiting.push_back(r);
  }
  const double token_bytes = static_cast<double>(cache.shape().token_bytes());
  const double budget = static_cast<double>(budget_tokens) * token_bytes;
  std::vector<Request> running;
  ServingStats s;
  auto tokens_of = [](const Request& r) { return r.prompt + r.generated; };
  // Appends r's tokens to the pool up to those of whole groups among its first n; false when a block
  // cannot be had (what was appended stays, counted in r.pooled).
  auto pool_up_to = [&](Request& r, int64_t n) {
    for (const int64_t want = n / residual.group * residual.group; r.pooled < want; ++r.pooled)
      if (!cache.append(r.id)) return false;
    return true;
  };
  auto preempt_last = [&] {
    Request r = running.back();
    running.pop_back();
    cache.release(r.id);
    r.id = -1;
    r.generated = 0;  // recomputed from the prompt when it runs again
    r.pooled = 0;
    waiting.push_front(r);
    ++s.preemptions;
  };
  while (!waiting.empty() || !running.empty()) {
    // Admission, first come first served.
    while (!waiting.empty()) {
      Request& r = waiting.front();
      const int64_t id = cache.add((paged ? r.prompt + r.output : trace.max_len) + residual.tokens);
      if (id < 0) break;
      bool ok = true;
      for (int64_t t = 0; t < residual.tokens && ok; ++t) ok = cache.append(id);  // the residual's bytes
      r.id = id;
      r.pooled = 0;
      if (!ok || !pool_up_to(r, r.prompt)) {  // the prompt does not fit now
        cache.release(id);
        r.id = -1;
        break;
      }
      running.push_back(r);
      waiting.pop_front();
    }
    MT_CHECK(!running.empty(), "serving: a request cannot be admitted into an empty cache (budget too small)");
    // One decode step: every running request appends its next token.
    for (std::size_t i = 0; i < running.size();) {
      if (pool_up_to(running[i], tokens_of(running[i]) + 1)) {
        ++running[i].generated;
        ++s.decode_tokens;
        ++i;
      } else if (running.size() > 1 && i + 1 < running.size()) {
        preempt_last();  // free the newest request's blocks and retry this one
      } else {
        MT_CHECK(running.size() > 1, "serving: one request alone does not fit the budget");
        preempt_last();  // this request is the newest: it waits for memory
      }
    }
    // Figures of the step, then the finished requests leave.
    double live = 0;
    for (const Request& r : running)
      live += (static_cast<double>(r.pooled) + static_cast<double>(tokens_of(r) - r.pooled) * residual.per_token) * token_bytes;
    const double reserved = static_cast<double>(cache.reserved_bytes());
    s.utilization += reserved > 0 ? live / reserved : 0;
    s.budget_utilization += live / budget;
    s.internal_frag += (reserved - live) / budget;
    if (!waiting.empty()) s.external_frag += (budget - reserved) / budget;
    s.concurrency += static_cast<double>(running.size());
    s.max_concurrency = std::max<int64_t>(s.max_concurrency, static_cast<int64_t>(running.size()));
    ++s.steps;
    for (std::size_t i = 0; i < running.size();) {
      if (running[i].generated >= running[i].output) {
        cache.release(running[i].id);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        ++s.finished;
      } else {
        ++i;
      }
    }
  }
  const double n = static_cast<double>(std::max<int64_t>(s.steps, 1));
  s.utilization /= n;
  s.budget_utilization /= n;
  s.internal_frag /= n;
  s.external_frag /= n;
  s.concurrency /= n;
  return s;
}

}  // namespace memtrade::kvcache
