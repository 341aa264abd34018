// CUDA numerics. Built with the CUDA backend; every test skips, printing why, when no device is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "app/techniques.hpp"
#include "attention_check.hpp"
#include "datasets/random.hpp"
#include "gemm_check.hpp"
#include "harness/runner.hpp"
#include "impls/attention/attention.hpp"
#include "impls/attention/tile_math.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "model/model.hpp"
#include "model/train.hpp"
#include "impls/quant/calibration.hpp"
#include "impls/quant/matvec.hpp"
#include "kv_fixtures.hpp"
#include "model_fixtures.hpp"
#include "quant_matvec_check.hpp"

using namespace memtrade;
using memtrade::test::gemm_case;

#define REQUIRE_CUDA()                                                  \
  do {                                                                  \
    const auto s = cuda_status();                                       \
    if (!s.available) GTEST_SKIP() << s.reason;                         \
  } while (0)

class GemmCuda : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GemmCuda, MatchesTheOracleWithinTheSamePrecisionRule) {
  REQUIRE_CUDA();
  const auto& [impl_name, dtype] = GetParam();
  auto dev = make_cuda_device();
  const auto& tech = registry().get("gemm");
  const Impl* impl = nullptr;
  for (const auto& i : tech.impls)
    if (i.name == impl_name) impl = &i;
  ASSERT_NE(impl, nullptr);
  for (auto [m, n, k] : {std::tuple{37, 53, 29}, std::tuple{128, 128, 128}, std::tuple{1, 300, 17}}) {
    const Case c = gemm_case(m, n, k, dtype.c_str());
    const auto problem = tech.prepare(c);
    auto w = impl->make(c, *problem, *dev);
    w->run();
    dev->synchronize();
    const auto err = w->error();
    const auto same = test::same_precision_reference_error(problem_as<gemm::GemmProblem>(*problem));
    const auto v = within_tolerance(err, same, {2.0, dtype == "fp32" ? 1e-6 : 1e-3});
    EXPECT_TRUE(v.pass) << impl_name << " " << c.id << ": " << v.why;
  }
}

INSTANTIATE_TEST_SUITE_P(ImplsAndDtypes, GemmCuda,
                         ::testing::Combine(::testing::Values("tiled", "cublas"),
                                            ::testing::Values("fp32", "bf16", "fp16")));

TEST(CudaDevice, TrackedPeakAndMemGetInfoAgreeOnALargeBuffer) {
  REQUIRE_CUDA();
  auto dev = make_cuda_device();
  const auto before = *dev->backend_used_bytes();
  {
    Buffer b(dev->memory(), 256u << 20, Tag::workspace);
    const auto during = *dev->backend_used_bytes();
    EXPECT_GE(during - before, 256u << 20);
    EXPECT_LT(during - before, (256u << 20) + (64u << 20));  // allocation granularity, not a leak
  }
  EXPECT_EQ(dev->memory().total().peak, 256u << 20);
  dev->memory().set_capacity(1u << 20);
  EXPECT_THROW(Buffer(dev->memory(), 2u << 20, Tag::io), OutOfMemory);
}

namespace {
const Impl& attention_impl(const std::string& name) {
  for (const auto& i : registry().get("attention").impls)
    if (i.name == name && i.backend == Backend::cuda) return i;
  throw Error("no CUDA attention impl " + name);
}

// How much the flash backward's use of the stored O moves dQ and dK. Like FlashAttention-2, it takes
// delta_i = dO_i . O_i from O as written in the dtype, where the naive reference keeps O in fp32. The
// rounding changes delta_i by e_i = dO_i . (round(O_i) - O_i), which enters dS_ij = P_ij (dP_ij - delta_i):
// dQ_i moves by scale e_i sum_j P_ij K_j and dK_j by scale sum_i P_ij e_i Q_i (i over the query heads of
// K's group). Computed here in float64 from the inputs and the exact O rounded to the dtype; returns the
// largest move of any element of dQ and of dK ({0, 0} for fp32, whose stored O is the fp32 O).
std::pair<double, double> stored_o_move(const attention::AttnProblem& p) {
  const attention::Dims& s = p.s;
  if (s.dtype == DType::f32) return {0, 0};
  const double scale = s.scale();
  double dq_max = 0, dk_max = 0;
  std::vector<double> dk_err(s.n_kv * s.d), prob(s.n_kv), o(s.d);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t hk = 0; hk < s.h_kv; ++hk) {
      std::fill(dk_err.begin(), dk_err.end(), 0.0);
      const double* K = &p.k[(b * s.h_kv + hk) * s.n_kv * s.d];
      const double* V = &p.v[(b * s.h_kv + hk) * s.n_kv * s.d];
      for (int64_t r = 0; r < s.group(); ++r) {
        const int64_t bh = b * s.h + hk * s.group() + r;
        for (int64_t i = 0; i < s.n; ++i) {
          const double* Q = &p.q[(bh * s.n + i) * s.d];
          const double* dO = &p.dout[(bh * s.n + i) * s.d];
          double mx = -INFINITY;
          for (int64_t j = 0; j < s.n_kv; ++j) {
            prob[j] = -INFINITY;
            if (s.causal && !attention::causal_allows(i, j, s.n, s.n_kv)) continue;
            double dot = 0;
            for (int64_t c = 0; c < s.d; ++c) dot += Q[c] * K[j * s.d + c];
            prob[j] = scale * dot;
            mx = std::max(mx, prob[j]);
          }
          if (mx == -INFINITY) continue;  // a fully masked row: no gradient
          double sum = 0;
          for (int64_t j = 0; j < s.n_kv; ++j) sum += prob[j] = prob[j] == -INFINITY ? 0.0 : std::exp(prob[j] - mx);
          std::fill(o.begin(), o.end(), 0.0);
          for (int64_t j = 0; j < s.n_kv; ++j) {
            prob[j] /= sum;
            for (int64_t c = 0; c < s.d; ++c) o[c] += prob[j] * V[j * s.d + c];
          }
          double e = 0;
          for (int64_t c = 0; c < s.d; ++c) {
            const float of = static_cast<float>(o[c]);
            const double stored = s.dtype == DType::bf16 ? to_float(to_bf16(of)) : to_float(to_f16(of));
            e += dO[c] * (stored - o[c]);
          }
          for (int64_t c = 0; c < s.d; ++c) {
            double dq = 0;
            for (int64_t j = 0; j < s.n_kv; ++j) dq += prob[j] * K[j * s.d + c];
            dq_max = std::max(dq_max, std::fabs(scale * e * dq));
          }
          for (int64_t j = 0; j < s.n_kv; ++j)
            for (int64_t c = 0; c < s.d; ++c) dk_err[j * s.d + c] += scale * prob[j] * e * Q[c];
        }
      }
      for (double x : dk_err) dk_max = std::max(dk_max, std::fabs(x));
    }
  return {dq_max, dk_max};
}
}  // namespace

class AttentionCuda : public ::testing::TestWithParam<std::tuple<std::string, bool, int, int>> {};

TEST_P(AttentionCuda, FlashWithinTwiceNaiveAndMemoryModelExact) {
  REQUIRE_CUDA();
  const auto [dtype, causal, h_kv, d] = GetParam();
  auto dev = make_cuda_device();
  const auto& tech = registry().get("attention");
  for (const auto& [n, nk] : {std::pair{37, 44}, {130, 130}, {96, 40}}) {  // 96 over 40, causal: empty rows
    const Case c = test::attn_case(Json{{"b", 2}, {"h", 4}, {"h_kv", h_kv}, {"n", n}, {"n_kv", nk}, {"d", d},
                                       {"causal", causal}, {"dtype", dtype}, {"pass", "fwd_bwd"}});
    const auto problem = tech.prepare(c);
    const attention::Dims s = attention::case_dims(c);
    std::map<std::string, std::map<std::string, double>> errs;
    for (const char* impl : {"naive", "flash"}) {
      const Record r = measure(tech, attention_impl(impl), c, *problem, *dev, 1, 1e-4, {});
      ASSERT_EQ(r.status, "ok") << impl << " " << c.id << ": " << r.detail;
      const auto m = std::string(impl) == "naive" ? attention::naive_memory(s, Backend::cuda) : attention::flash_memory(s, Backend::cuda);
      EXPECT_EQ(r.counter("peak_bytes"), m.live_before + m.extra) << impl << " " << c.id;
      EXPECT_EQ(r.counter("peak_extra_bytes"), m.extra) << impl << " " << c.id;
      EXPECT_EQ(r.counter("nan_count") + r.counter("inf_count"), 0) << impl << " " << c.id;
      errs[impl] = r.counters;
    }
    const double floor = dtype == "fp32" ? 1e-5 : 1e-3;
    const auto [dq_move, dk_move] = stored_o_move(dynamic_cast<const attention::AttnProblem&>(*problem));
    for (const char* t : {"o", "dq", "dk", "dv"}) {
      const std::string key = std::string("max_abs_err_") + t;
      const double move = t == std::string("dq") ? dq_move : t == std::string("dk") ? dk_move : 0.0;
      EXPECT_LE(errs["flash"].at(key), 2 * errs["naive"].at(key) + floor + move)
          << c.id << " " << key << " (stored-O move " << move << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Options, AttentionCuda,
                         ::testing::Combine(::testing::Values(std::string("fp32"), std::string("bf16"), std::string("fp16")), ::testing::Bool(),
                                            ::testing::Values(4, 1), ::testing::Values(64, 128, 40)));

// Every kernel of the fused path is deterministic (no atomics, a fixed reduction order): 20 runs of
// the forward and backward give the same bits in O, dQ, dK and dV, for every dtype (the tensor-core
// forward for bf16 / fp16), an odd sequence length and GQA with a causal mask.
TEST(AttentionCuda, FlashIsBitIdenticalOverTwentyRuns) {
  REQUIRE_CUDA();
  auto dev = make_cuda_device();
  const auto& tech = registry().get("attention");
  for (const char* dtype : {"bf16", "fp16", "fp32"})
    for (int d : {64, 128}) {
      const Case c = test::attn_case(Json{{"b", 2}, {"h", 4}, {"h_kv", 2}, {"n", 200}, {"n_kv", 230}, {"d", d},
                                         {"causal", true}, {"dtype", dtype}, {"pass", "fwd_bwd"}});
      const auto problem = tech.prepare(c);
      auto w = attention_impl("flash").make(c, *problem, *dev);
      auto* aw = dynamic_cast<attention::AttnWorkload*>(w.get());
      ASSERT_NE(aw, nullptr);
      w->run();
      dev->synchronize();
      const auto first = aw->outputs();
      ASSERT_EQ(first.size(), 4u);
      for (int rep = 1; rep < 20; ++rep) {
        w->run();
        dev->synchronize();
        const auto again = aw->outputs();
        for (std::size_t t = 0; t < first.size(); ++t)
          ASSERT_EQ(std::memcmp(first[t].data(), again[t].data(), first[t].size() * sizeof(double)), 0)
              << c.id << " tensor " << t << " differs in run " << rep;
      }
    }
}

// ---- the CUDA training step (model/train.cu) against the CPU trainer ----

namespace {

using precision::Policy;
using test::random_tokens;
using test::test_weights;
using test::tiny_model;
using test::train_options;

double relative_l2(const std::vector<double>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

// Needs no device: the float64 reference is CPU only, and a CPU device is refused, both with an Error.
TEST(TrainCuda, Float64AndNonCudaDevicesAreRejected) {
  auto cpu = make_cpu_device();
  const auto c = tiny_model();
  const auto w = model::init_params(c, 1);
  auto o = train_options(Policy::fp32);
  EXPECT_THROW(model::make_trainer_cuda(c, o, *cpu, w), Error);
  o.float64 = true;
  EXPECT_THROW(model::make_trainer_cuda(c, o, *cpu, w), Error);
}

class TrainCudaPolicy : public ::testing::TestWithParam<Policy> {};

// The whole model's gradient under each policy, both trainers against the CPU float64 trainer (the design
// rule): err_cuda <= 2 err_cpu(same policy) + floor, floor 1e-5 for fp32 and 1e-3 for the 16-bit
// policies. fp32 is also compared directly with the CPU fp32 trainer: the two differ only in summation
// order (relative L2 around 1e-6, as the CPU fp32 trainer against float64).
TEST_P(TrainCudaPolicy, GradientsWithinTwiceTheCpuTrainerOfTheSamePolicy) {
  REQUIRE_CUDA();
  const Policy p = GetParam();
  const auto c = tiny_model();
  const auto w = test_weights(c, 5);
  const auto batch = random_tokens(2, 16, 9);
  auto cpu = make_cpu_device();
  auto gpu = make_cuda_device();
  const auto o = train_options(p);
  auto o64 = o;
  o64.float64 = true;
  const auto g64 = model::make_trainer_cpu(c, o64, *cpu, w)->gradients(batch);
  const auto g_cpu = model::make_trainer_cpu(c, o, *cpu, w)->gradients(batch);
  const auto g_cuda = model::make_trainer_cuda(c, o, *gpu, w)->gradients(batch);
  ASSERT_EQ(g_cuda.size(), g64.size());
  for (std::size_t i = 0; i < g_cuda.size(); ++i)
    ASSERT_TRUE(std::isfinite(g_cuda[i])) << policy_name(p) << " gradient " << i;
  const double err_cpu = relative_l2(g_cpu, g64), err_cuda = relative_l2(g_cuda, g64);
  const double floor = p == Policy::fp32 ? 1e-5 : 1e-3;
  EXPECT_LE(err_cuda, 2 * err_cpu + floor) << policy_name(p) << ": cuda " << err_cuda << ", cpu " << err_cpu;
  if (p == Policy::fp32) {
    EXPECT_LT(relative_l2(g_cuda, g_cpu), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, TrainCudaPolicy, ::testing::ValuesIn(precision::all_policies),
                         [](const auto& info) {
                           std::string n = policy_name(info.param);
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Model state and io per tag equal the CPU trainer's to the byte. Activations: the same buffers except that
// each layer keeps P ([B*H*T*T] fp32) instead of the CPU's log-sum-exp ([B*H*T] fp32); all freed by the
// end of the backward, and a step's peak is repeatable.
TEST(TrainCuda, TrackedBytesPerTagMatchTheCpuTrainer) {
  REQUIRE_CUDA();
  const auto c = tiny_model();
  const auto w = model::init_params(c, 1);
  const auto batch = random_tokens(2, 16, 4);
  const datasets::Batch micro[] = {batch};
  for (Policy p : precision::all_policies) {
    auto cpu = make_cpu_device();
    auto gpu = make_cuda_device();
    const auto o = train_options(p);
    auto tc = model::make_trainer_cpu(c, o, *cpu, w);
    auto tg = model::make_trainer_cuda(c, o, *gpu, w);
    auto &pc = cpu->memory(), &pg = gpu->memory();
    for (Tag t : {Tag::weights, Tag::grads, Tag::master, Tag::optimizer, Tag::io})
      EXPECT_EQ(pg.by_tag(t).live, pc.by_tag(t).live) << policy_name(p) << " " << tag_name(t);
    pc.reset_peak();
    pg.reset_peak();
    tc->step(micro);
    tg->step(micro);
    const std::size_t bht = static_cast<std::size_t>(o.batch * c.heads * o.seq);
    EXPECT_EQ(pg.by_tag(Tag::activations).peak,
              pc.by_tag(Tag::activations).peak + c.layers * (bht * o.seq - bht) * sizeof(float))
        << policy_name(p);
    EXPECT_EQ(pg.by_tag(Tag::activations).live, 0u) << policy_name(p);
    const auto first = pg.total().peak;
    pg.reset_peak();
    tg->step(micro);
    EXPECT_EQ(pg.total().peak, first) << policy_name(p);
  }
}

// Two fp32 optimizer steps on the same batches: the losses (the second one after the first update) agree
// with the CPU fp32 trainer within 1e-4 relative, and so do the gradient counters.
TEST(TrainCuda, TwoFp32StepsMatchTheCpuTrainer) {
  REQUIRE_CUDA();
  const auto c = tiny_model();
  const auto w = test_weights(c, 5);
  auto cpu = make_cpu_device();
  auto gpu = make_cuda_device();
  const auto o = train_options(Policy::fp32);
  auto tc = model::make_trainer_cpu(c, o, *cpu, w);
  auto tg = model::make_trainer_cuda(c, o, *gpu, w);
  for (int step = 0; step < 2; ++step) {
    const datasets::Batch micro[] = {random_tokens(2, 16, 30 + step)};
    const model::StepStats sc = tc->step(micro), sg = tg->step(micro);
    EXPECT_NEAR(sg.loss, sc.loss, 1e-4 * sc.loss) << "step " << step;
    EXPECT_TRUE(sg.applied) << "step " << step;
    EXPECT_FALSE(sg.non_finite) << "step " << step;
    EXPECT_EQ(sg.loss_scale, 1.f);
    EXPECT_GT(sg.grad_nonzero, 0);
    EXPECT_NEAR(static_cast<double>(sg.grad_nonzero), static_cast<double>(sc.grad_nonzero), 1e-3 * sc.grad_nonzero);
    EXPECT_NEAR(static_cast<double>(sg.grad_underflow_fp16), static_cast<double>(sc.grad_underflow_fp16),
                1e-3 * sc.grad_nonzero);
  }
  EXPECT_EQ(tg->steps_taken(), 2);
  const datasets::Batch next = random_tokens(2, 16, 40);
  EXPECT_NEAR(tg->eval_loss(next), tc->eval_loss(next), 1e-4 * tc->eval_loss(next));
  // The calibration inputs of every linear layer, from the updated weights.
  const auto ic = tc->linear_inputs(next), ig = tg->linear_inputs(next);
  ASSERT_EQ(ig.size(), ic.size());
  for (std::size_t l = 0; l < ic.size(); ++l)
    for (std::size_t k = 0; k < ic[l].size(); ++k) {
      ASSERT_EQ(ig[l][k].size(), ic[l][k].size()) << "layer " << l << " input " << k;
      const std::vector<double> a(ig[l][k].begin(), ig[l][k].end()), b(ic[l][k].begin(), ic[l][k].end());
      EXPECT_LT(relative_l2(a, b), 1e-4) << "layer " << l << " input " << k;
    }
}

// ZeRO-Offload on the GPU: each gradient segment goes to the host and each updated tile back on the copy
// stream, overlapped with the backward and with the host's AdamW. Three steps agree with the CUDA device
// step's (the same gradient kernels; AdamW on the host instead of the device, a rounding apart), fp32 and
// bf16-mixed; a segment or a tile read before its copy had landed would move weights by about lr.
TEST(TrainCuda, OffloadedStepsWithOverlappedCopiesMatchTheDeviceSteps) {
  REQUIRE_CUDA();
  const auto c = tiny_model();
  const auto w = test_weights(c, 5);
  for (Policy p : {Policy::fp32, Policy::bf16_mixed}) {
    auto g1 = make_cuda_device(), g2 = make_cuda_device();
    auto o = train_options(p);
    auto td = model::make_trainer_cuda(c, o, *g1, w);
    o.offload = true;
    auto to = model::make_trainer_cuda(c, o, *g2, w);
    for (int step = 0; step < 3; ++step) {
      const datasets::Batch micro[] = {random_tokens(2, 16, 30 + step)};
      const model::StepStats sd = td->step(micro), so = to->step(micro);
      EXPECT_NEAR(so.loss, sd.loss, 1e-5 * sd.loss) << policy_name(p) << " step " << step;
      EXPECT_GT(so.bytes_to_host, 0) << policy_name(p);
    }
    const auto pd = td->params(), po = to->params();
    ASSERT_EQ(po.size(), pd.size());
    const float ulp = p == Policy::fp32 ? 1e-6f : std::ldexp(1.f, -7);  // one ulp of the working weights
    for (std::size_t i = 0; i < pd.size(); ++i)
      ASSERT_LE(std::fabs(po[i] - pd[i]), 1e-2f * o.lr + ulp * std::fabs(pd[i])) << policy_name(p) << " parameter " << i;
  }
}

// ---- the CUDA quantized matvec (impls/quant/matvec.cu) against the reference ----

TEST(QuantCuda, MatvecEqualsTheReferenceForEveryFormat) {
  REQUIRE_CUDA();
  auto dev = make_cuda_device();
  namespace qm = test::quant_matvec;
  for (const char* name : qm::kFormats)
    for (const auto& [N, K] : qm::kShapes) {
      const qm::Case c = qm::make_case(name, N, K);
      Buffer db(dev->memory(), c.blob.size(), Tag::weights), dx(dev->memory(), K * 4, Tag::io), dy(dev->memory(), N * 4, Tag::io);
      dev->copy(db.data(), c.blob.data(), c.blob.size(), CopyKind::host_to_device);
      dev->copy(dx.data(), c.x.data(), K * 4, CopyKind::host_to_device);
      quant::matvec_cuda(c.L, db.as<uint8_t>(), dx.as<float>(), dy.as<float>(), *dev);
      std::vector<float> y(N);
      dev->copy(y.data(), dy.data(), N * 4, CopyKind::device_to_host);
      qm::expect_within_bound(c, y.data(), std::string(name) + " " + std::to_string(N) + "x" + std::to_string(K));
    }
}

// The dense fp32 / bf16 baselines on the GPU against a float64 product, both kernels (16-byte chunks,
// and the generic path for a K that is not a multiple of the chunk), a partial block of rows included.
TEST(QuantCuda, DenseMatvecEqualsTheFloat64Product) {
  REQUIRE_CUDA();
  auto dev = make_cuda_device();
  namespace qm = test::quant_matvec;
  for (const auto& [N, K] : qm::kDenseShapes) {
    const qm::DenseCase c = qm::make_dense_case(N, K);
    Buffer dx(dev->memory(), K * 4, Tag::io), dy(dev->memory(), N * 4, Tag::io);
    dev->copy(dx.data(), c.x.data(), K * 4, CopyKind::host_to_device);
    for (const bool bf16 : {false, true}) {
      const std::size_t wbytes = N * K * (bf16 ? 2 : 4);
      Buffer dw(dev->memory(), wbytes, Tag::weights);
      dev->copy(dw.data(), bf16 ? static_cast<const void*>(c.wb.data()) : c.w.data(), wbytes, CopyKind::host_to_device);
      if (bf16) quant::matvec_dense_cuda(dw.as<bf16_t>(), dx.as<float>(), dy.as<float>(), N, K, *dev);
      else quant::matvec_dense_cuda(dw.as<float>(), dx.as<float>(), dy.as<float>(), N, K, *dev);
      std::vector<float> y(N);
      dev->copy(y.data(), dy.data(), N * 4, CopyKind::device_to_host);
      qm::expect_dense_within_bound(c, bf16, y.data());
    }
  }
}

// The CUDA decode kernel against the float64 reference over the same stored records (written on the device
// through KvCache::write_tokens' copies, a request at a time; on the host directly), for every storage type
// (the KIVI types with an fp16 residual of 32 tokens, and of 64 at head_dim 64), head sizes that fill the
// warp (128-bit slice loads) and ones that do not, MHA and grouped heads (a group of 12 takes two thread
// blocks per KV head), one-token requests and ones of several splits; paged (scattered block tables) and
// contiguous give the same bits; the same plan run twice too.
TEST(KvCacheCuda, DecodeWithinTheFp32RuleOfTheFloat64ReferenceAndPagedEqualsContiguous) {
  REQUIRE_CUDA();
  using namespace memtrade::kvcache;
  using namespace memtrade::test::kv;
  auto host = make_cpu_device();
  auto dev = make_cuda_device();
  // (head_dim, query heads per KV head): partial lanes (16, 40), whole-slice loads of 2, 4 and 8 elements.
  for (const auto& [hd, group] : {std::pair<int64_t, int64_t>{16, 1}, {40, 12}, {64, 4}, {128, 1}, {128, 4}, {128, 12}, {256, 4}})
    for (KvType t : kCacheTypes) {
      if (!takes(t, hd)) continue;
      KvShape s{2, 2, hd, t};
      random_static_scales(s, 4);
      if (is_kivi(t) && hd == 64) s.residual = 64;
      const int64_t heads = 2 * group, B = 4, max_len = 1300;  // 1300 tokens: three splits of 512
      const uint64_t seed = 11 + static_cast<uint64_t>(hd);
      const TwoLayouts h = two_layouts(*host, s, B, max_len, seed), d = two_layouts(*dev, s, B, max_len, seed);
      const auto q = normals(B * heads * hd, 78);
      const std::size_t bytes = q.size() * 4;
      Buffer dq(dev->memory(), bytes, Tag::io), dout(dev->memory(), bytes, Tag::io);
      dev->copy(dq.data(), q.data(), bytes, CopyKind::host_to_device);
      const std::string what = std::string(kv_type_name(t)) + " head_dim " + std::to_string(hd) + " group " + std::to_string(group);
      for (int64_t l = 0; l < s.layers; ++l) {
        std::vector<float> oc(q.size()), op(q.size()), again(q.size());
        CudaDecode kc(*dev, plan_decode(*d.c, d.rc, l, heads)), kp(*dev, plan_decode(*d.p, d.rp, l, heads));
        kc.run(dq.as<float>(), dout.as<float>());
        dev->copy(oc.data(), dout.data(), bytes, CopyKind::device_to_host);
        kp.run(dq.as<float>(), dout.as<float>());
        dev->copy(op.data(), dout.data(), bytes, CopyKind::device_to_host);
        kp.run(dq.as<float>(), dout.as<float>());
        dev->copy(again.data(), dout.data(), bytes, CopyKind::device_to_host);
        ASSERT_EQ(std::memcmp(oc.data(), op.data(), bytes), 0) << what << " layer " << l << ": paged != contiguous";
        ASSERT_EQ(std::memcmp(op.data(), again.data(), bytes), 0) << what << ": two runs differ";
        for (int64_t b = 0; b < B; ++b) {
          std::vector<double> ref(heads * hd);
          decode_attention_ref(*h.c, h.rc[b], l, &q[b * heads * hd], heads, ref.data());
          const auto e = error_stats(std::vector<double>(op.begin() + b * heads * hd, op.begin() + (b + 1) * heads * hd), ref);
          ASSERT_EQ(e.nan_count + e.inf_count, 0) << what;
          ASSERT_LE(e.rel_l2, 2.0 * (hd + h.len[b] + 8) * std::ldexp(1.0, -24))
              << what << " layer " << l << " request " << b << " (" << h.len[b] << " tokens)";
        }
      }
    }
}

TEST(KvCacheCuda, OffloadedDecodeOverlapsItsCopiesAndEqualsPaged) {
  // run_staged: the cold blocks copied from the pinned host pool on the second stream in chunks, each
  // chunk's splits launched once it is in. The staging area is poisoned before every step, so a split
  // that read its blocks before their copy had landed would differ from the paged decode.
  REQUIRE_CUDA();
  using namespace memtrade::kvcache;
  using namespace memtrade::test::kv;
  auto dev = make_cuda_device();
  for (const int64_t layers : {1, 2})
    for (KvType t : {KvType::f32, KvType::bf16, KvType::int8, KvType::q4_0}) {
      const KvShape s{layers, 8, 128, t};
      const int64_t heads = 32, l = layers - 1;
      const std::vector<int64_t> len = {700, 3000, 1300, 4096};
      OffloadPair x = offload_pair(*dev, s, len, 16, 16);
      const auto q = normals(static_cast<int64_t>(len.size()) * heads * s.head_dim, 78);
      const std::size_t bytes = q.size() * 4;
      Buffer dq(dev->memory(), bytes, Tag::io), dout(dev->memory(), bytes, Tag::io);
      dev->copy(dq.data(), q.data(), bytes, CopyKind::host_to_device);
      const std::string what = std::string(kv_type_name(t)) + ", " + std::to_string(layers) + " layers";
      std::vector<float> want(q.size()), got(q.size());
      CudaDecode kp(*dev, plan_decode(*x.p, x.rp, l, heads));
      kp.run(dq.as<float>(), dout.as<float>());
      dev->copy(want.data(), dout.data(), bytes, CopyKind::device_to_host);
      x.o->select_staged(x.ro, l);
      CudaDecode ko(*dev, plan_decode(*x.o, x.ro, l, heads));
      for (const int64_t chunks : {1, 8, 64})
        for (int rep = 0; rep < 2; ++rep) {
          for (std::size_t b = 0; b < len.size(); ++b)
            x.o->runs(x.ro[b], l, [&](const uint8_t* e, int64_t pos, int64_t n) {
              if (x.o->staging_needed(x.ro[b], pos, pos + n) == 0) return;
              const std::vector<uint8_t> ff(static_cast<std::size_t>(n * s.entry_bytes()), 0xFF);
              dev->copy(const_cast<uint8_t*>(e), ff.data(), ff.size(), CopyKind::host_to_device);
            });
          x.o->reset_traffic();
          ko.run_staged(dq.as<float>(), dout.as<float>(), x.o->staging_slots(), chunks,
                        [&](int64_t from, int64_t to) { x.o->copy_staged(from, to, true); });
          dev->synchronize();
          dev->copy(got.data(), dout.data(), bytes, CopyKind::device_to_host);
          ASSERT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << what << ", " << chunks << " chunks: staged != paged";
          EXPECT_EQ(x.o->traffic().to_device, x.cold * 16 * s.entry_bytes()) << what;
        }
    }
}
