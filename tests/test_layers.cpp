// Layer math of model/layers.hpp: analytic float64 gradients against central finite
// differences of L = sum(c * outputs) with random weights c, fp32 forward against float64 forward,
// stability and error cases, AdamW against literals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "datasets/random.hpp"
#include "model/layers.hpp"
#include "test_util.hpp"

using namespace memtrade;
using namespace memtrade::model;
using memtrade::test::error_of;

namespace {

std::vector<double> normals(std::size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * datasets::normal(seed, i);
  return v;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }
std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss() with respect to every element of x (x is restored), against grad.
void expect_grad_matches_fd(std::vector<double>& x, const std::vector<double>& grad,
                            const std::function<double()>& loss, const char* what) {
  ASSERT_EQ(x.size(), grad.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2 * h);
    EXPECT_NEAR(grad[i], fd, 1e-6 * std::fabs(fd) + 1e-8) << what << " element " << i;
  }
}

// fp32 result against the float64 result computed from the same (float-rounded) inputs.
void expect_close_rel(const std::vector<float>& got, const std::vector<double>& want, double rel, double abs_floor,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i]) + abs_floor) << what << " element " << i;
}

constexpr float kEps = 1e-5f;

// ---------------- RMSNorm ----------------

TEST(Layers, RmsNormForwardKnownRow) {
  // x = (3, 4): mean(x^2) = 12.5, r = 1 / sqrt(12.5 + eps); w = (1, 2).
  const double x[2] = {3, 4}, w[2] = {1, 2};
  double y[2], r;
  rmsnorm_forward(x, w, y, &r, 1, 2, 0.f);
  EXPECT_NEAR(r, 1 / std::sqrt(12.5), 1e-15);
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-15);
  EXPECT_NEAR(y[1], 8 / std::sqrt(12.5), 1e-15);
}

TEST(Layers, RmsNormGradientMatchesFiniteDifferences) {
  const int64_t rows = 3, n = 8;
  auto x = normals(rows * n, 1), w = normals(n, 2), c = normals(rows * n, 3);
  for (auto& v : w) v += 1.0;
  std::vector<double> y(rows * n), r(rows), dx(rows * n);
  auto loss = [&] {
    rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), rows, n, kEps);
    return dot(c, y);
  };
  loss();
  // dw accumulates: start it from a known non-zero value and subtract afterwards.
  const auto dw0 = normals(n, 4);
  auto dw = dw0;
  rmsnorm_backward(x.data(), w.data(), r.data(), c.data(), dx.data(), dw.data(), rows, n);
  std::vector<double> dw_added(n);
  for (int64_t j = 0; j < n; ++j) dw_added[j] = dw[j] - dw0[j];
  expect_grad_matches_fd(x, dx, loss, "dx");
  expect_grad_matches_fd(w, dw_added, loss, "dw");
}

TEST(Layers, RmsNormBackwardRunsInPlaceAndTermMatches) {
  const int64_t n = 8;
  auto x = normals(n, 5), w = normals(n, 6), dy = normals(n, 7);
  std::vector<double> y(n), dx(n), dw(n, 0.0), dw_terms(n);
  const double r = rmsnorm_forward_row(x.data(), w.data(), y.data(), n, kEps);
  rmsnorm_backward_row(x.data(), w.data(), r, dy.data(), dx.data(), dw.data(), n);
  for (int64_t j = 0; j < n; ++j) dw_terms[j] = rmsnorm_dw_term(dy[j], x[j], r);
  auto g = dy;
  rmsnorm_backward_row(x.data(), w.data(), r, g.data(), g.data(), static_cast<double*>(nullptr), n);
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_DOUBLE_EQ(g[j], dx[j]) << j;
    EXPECT_DOUBLE_EQ(dw_terms[j], dw[j]) << j;
  }
}

TEST(Layers, RmsNormFloatMatchesDouble) {
  const int64_t rows = 3, n = 8;
  const auto xf = to_float(normals(rows * n, 8)), wf = to_float(normals(n, 9)), dyf = to_float(normals(rows * n, 10));
  const auto xd = to_double(xf), wd = to_double(wf), dyd = to_double(dyf);
  std::vector<float> yf(rows * n), rf(rows), dxf(rows * n), dwf(n, 0.f);
  std::vector<double> yd(rows * n), rd(rows), dxd(rows * n), dwd(n, 0.0);
  rmsnorm_forward(xf.data(), wf.data(), yf.data(), rf.data(), rows, n, kEps);
  rmsnorm_forward(xd.data(), wd.data(), yd.data(), rd.data(), rows, n, kEps);
  rmsnorm_backward(xf.data(), wf.data(), rf.data(), dyf.data(), dxf.data(), dwf.data(), rows, n);
  rmsnorm_backward(xd.data(), wd.data(), rd.data(), dyd.data(), dxd.data(), dwd.data(), rows, n);
  expect_close_rel(yf, yd, 1e-6, 1e-7, "y");
  expect_close_rel(rf, rd, 1e-6, 0, "inv_rms");
  expect_close_rel(dxf, dxd, 1e-6, 1e-6, "dx");
  expect_close_rel(dwf, dwd, 1e-6, 1e-6, "dw");
}

TEST(Layers, RmsNormZeroRowIsFinite) {
  const int64_t n = 8;
  std::vector<float> x(n, 0.f), w(n, 1.f), y(n), dy(n, 1.f), dx(n), dw(n, 0.f);
  float r = 0;
  rmsnorm_forward(x.data(), w.data(), y.data(), &r, 1, n, kEps);
  EXPECT_TRUE(std::isfinite(r));
  EXPECT_NEAR(r, 1 / std::sqrt(1e-5), 1e-2);
  rmsnorm_backward(x.data(), w.data(), &r, dy.data(), dx.data(), dw.data(), 1, n);
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(y[j], 0.f);
    EXPECT_TRUE(std::isfinite(dx[j]));
    EXPECT_NEAR(dx[j], r, 1e-3);  // dot = 0: dx = r w dy
    EXPECT_EQ(dw[j], 0.f);
  }
}

// ---------------- RoPE ----------------

TEST(Layers, RopeCosSinAndHalfSplitPairs) {
  // head_dim 4: pair 0 is (0, 2) with angle pos, pair 1 is (1, 3) with angle pos / 100.
  double c, s;
  rope_cos_sin(3, 1, 4, 10000.f, c, s);
  EXPECT_NEAR(c, std::cos(0.03), 1e-15);
  EXPECT_NEAR(s, std::sin(0.03), 1e-15);
  // seq 2, heads 1: token 1 at position 1.
  const double x[8] = {0, 0, 0, 0, 1, 2, 3, 4};
  double y[8];
  rope_forward(x, y, 2, 1, 4);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(y[k], 0.0);  // position 0 is the identity (on zeros too)
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
  EXPECT_NEAR(y[4], 1 * c0 - 3 * s0, 1e-14);
  EXPECT_NEAR(y[6], 3 * c0 + 1 * s0, 1e-14);
  EXPECT_NEAR(y[5], 2 * c1 - 4 * s1, 1e-14);
  EXPECT_NEAR(y[7], 4 * c1 + 2 * s1, 1e-14);
}

TEST(Layers, RopeGradientMatchesFiniteDifferencesAndInverts) {
  const int64_t seq = 5, heads = 2, hd = 8, n = seq * heads * hd;
  auto x = normals(n, 11), c = normals(n, 12);
  std::vector<double> y(n), dx(n);
  auto loss = [&] {
    rope_forward(x.data(), y.data(), seq, heads, hd);
    return dot(c, y);
  };
  rope_backward(c.data(), dx.data(), seq, heads, hd);
  expect_grad_matches_fd(x, dx, loss, "dx");
  loss();  // y = forward(x) at the unperturbed x
  // The backward is the inverse rotation: backward(forward(x)) = x; in place works both ways.
  auto z = x;
  rope_forward(z.data(), z.data(), seq, heads, hd);
  EXPECT_EQ(z, y);
  rope_backward(z.data(), z.data(), seq, heads, hd);
  for (int64_t k = 0; k < n; ++k) EXPECT_NEAR(z[k], x[k], 1e-14) << k;
}

TEST(Layers, RopeFloatMatchesDouble) {
  const int64_t seq = 5, heads = 2, hd = 8, n = seq * heads * hd;
  const auto xf = to_float(normals(n, 13));
  const auto xd = to_double(xf);
  std::vector<float> yf(n), bf(n);
  std::vector<double> yd(n), bd(n);
  rope_forward(xf.data(), yf.data(), seq, heads, hd);
  rope_forward(xd.data(), yd.data(), seq, heads, hd);
  rope_backward(xf.data(), bf.data(), seq, heads, hd);
  rope_backward(xd.data(), bd.data(), seq, heads, hd);
  expect_close_rel(yf, yd, 1e-6, 1e-6, "y");
  expect_close_rel(bf, bd, 1e-6, 1e-6, "dx");
}

TEST(Layers, RopeShapeCheck) {
  EXPECT_EQ(error_of([] { check_rope_shape(5, 2, 8); }), "(no error)");
  EXPECT_NE(error_of([] { check_rope_shape(5, 2, 7); }).find("even"), std::string::npos);
  EXPECT_NE(error_of([] { check_rope_shape(5, 2, 0); }), "(no error)");
  EXPECT_NE(error_of([] { check_rope_shape(-1, 2, 8); }), "(no error)");
}

// ---------------- SwiGLU ----------------

TEST(Layers, SwigluGradientMatchesFiniteDifferences) {
  const int64_t n = 3 * 8;
  auto g = normals(n, 14, 2.0), u = normals(n, 15), c = normals(n, 16);
  std::vector<double> h(n), dg(n), du(n);
  auto loss = [&] {
    swiglu_forward(g.data(), u.data(), h.data(), n);
    return dot(c, h);
  };
  swiglu_backward(g.data(), u.data(), c.data(), dg.data(), du.data(), n);
  expect_grad_matches_fd(g, dg, loss, "dg");
  expect_grad_matches_fd(u, du, loss, "du");
}

TEST(Layers, SwigluValuesAndFloatMatchesDouble) {
  EXPECT_NEAR(swiglu_forward_elem(1.0, 2.0), 2.0 / (1 + std::exp(-1.0)), 1e-15);
  EXPECT_EQ(swiglu_forward_elem(0.0, 5.0), 0.0);
  EXPECT_EQ(swiglu_forward_elem(-200.f, 1.f), -0.f);  // exp overflow gives sigmoid 0, not NaN
  float dg, du;
  swiglu_backward_elem(-200.f, 1.f, 1.f, dg, du);
  EXPECT_TRUE(std::isfinite(dg) && std::isfinite(du));
  const int64_t n = 3 * 8;
  const auto gf = to_float(normals(n, 17, 2.0)), uf = to_float(normals(n, 18)), dhf = to_float(normals(n, 19));
  const auto gd = to_double(gf), ud = to_double(uf), dhd = to_double(dhf);
  std::vector<float> hf(n), dgf(n), duf(n);
  std::vector<double> hd(n), dgd(n), dud(n);
  swiglu_forward(gf.data(), uf.data(), hf.data(), n);
  swiglu_forward(gd.data(), ud.data(), hd.data(), n);
  swiglu_backward(gf.data(), uf.data(), dhf.data(), dgf.data(), duf.data(), n);
  swiglu_backward(gd.data(), ud.data(), dhd.data(), dgd.data(), dud.data(), n);
  expect_close_rel(hf, hd, 1e-6, 1e-7, "h");
  expect_close_rel(dgf, dgd, 1e-6, 1e-7, "dg");
  expect_close_rel(duf, dud, 1e-6, 1e-7, "du");
}

// ---------------- embedding ----------------

TEST(Layers, EmbeddingGatherAndScatterAddMatchFiniteDifferences) {
  const int64_t vocab = 5, width = 8;
  const std::vector<int32_t> ids = {3, 0, 3, 4};  // 3 repeats: its gradient rows add up
  const int64_t n = static_cast<int64_t>(ids.size());
  auto table = normals(vocab * width, 20), c = normals(n * width, 21);
  std::vector<double> out(n * width);
  auto loss = [&] {
    embedding_forward(ids.data(), n, table.data(), width, out.data());
    return dot(c, out);
  };
  loss();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < width; ++j) EXPECT_EQ(out[r * width + j], table[ids[r] * width + j]);
  const auto d0 = normals(vocab * width, 22);
  auto dtable = d0;
  embedding_backward(ids.data(), n, c.data(), width, dtable.data());
  std::vector<double> added(vocab * width);
  for (std::size_t k = 0; k < added.size(); ++k) added[k] = dtable[k] - d0[k];
  expect_grad_matches_fd(table, added, loss, "dtable");
  for (int64_t j = 0; j < width; ++j) {
    EXPECT_EQ(added[1 * width + j], 0.0);  // ids 1 and 2 unused
    EXPECT_EQ(added[2 * width + j], 0.0);
  }
}

TEST(Layers, EmbeddingBadIdsAreErrors) {
  const std::vector<int32_t> ok = {0, 4, 2}, high = {0, 5}, negative = {-1};
  EXPECT_EQ(error_of([&] { check_token_ids(ok.data(), 3, 5); }), "(no error)");
  EXPECT_EQ(error_of([&] { check_token_ids(high.data(), 2, 5); }),
            "token id 5 at position 1 is outside [0, 5)");
  EXPECT_NE(error_of([&] { check_token_ids(negative.data(), 1, 5); }), "(no error)");
  EXPECT_NE(error_of([&] { check_token_ids(ok.data(), 3, 0); }), "(no error)");
}

// ---------------- cross-entropy ----------------

TEST(Layers, CrossEntropyKnownValue) {
  // Row (0, log 3): softmax (1/4, 3/4); target 1: loss log(4/3); target 0: log 4.
  const double z[4] = {0, std::log(3.0), 0, std::log(3.0)};
  const int32_t t[2] = {1, 0};
  double rl[2];
  const double mean = cross_entropy_forward(z, t, 2, 2, rl);
  EXPECT_NEAR(rl[0], std::log(4.0 / 3.0), 1e-15);
  EXPECT_NEAR(rl[1], std::log(4.0), 1e-15);
  EXPECT_NEAR(mean, 0.5 * (std::log(4.0 / 3.0) + std::log(4.0)), 1e-15);
  double dz[4];
  cross_entropy_backward(z, t, 2, 2, 0.5, dz);
  EXPECT_NEAR(dz[0], 0.5 * 0.25, 1e-15);
  EXPECT_NEAR(dz[1], 0.5 * (0.75 - 1), 1e-15);
  EXPECT_NEAR(dz[2], 0.5 * (0.25 - 1), 1e-15);
  EXPECT_NEAR(dz[3], 0.5 * 0.75, 1e-15);
}

TEST(Layers, CrossEntropyGradientMatchesFiniteDifferences) {
  const int64_t rows = 3, vocab = 8;
  auto z = normals(rows * vocab, 23, 3.0);
  const std::vector<int32_t> t = {2, 7, 0};
  const double upstream = 1.7;  // L = upstream * mean loss
  auto loss = [&] { return upstream * cross_entropy_forward(z.data(), t.data(), rows, vocab); };
  std::vector<double> dz(rows * vocab);
  cross_entropy_backward(z.data(), t.data(), rows, vocab, upstream / rows, dz.data());
  expect_grad_matches_fd(z, dz, loss, "dz");
}

TEST(Layers, CrossEntropyStableAtLargeLogitsAndInPlace) {
  const int64_t rows = 3, vocab = 8;
  auto zd0 = normals(rows * vocab, 24, 2.0);
  for (auto& v : zd0) v += 1e4;
  const auto zf = to_float(zd0);
  const auto zd = to_double(zf);
  const std::vector<int32_t> t = {1, 5, 6};
  std::vector<float> lf(rows), dzf(rows * vocab);
  std::vector<double> ld(rows), dzd(rows * vocab);
  const float mf = cross_entropy_forward(zf.data(), t.data(), rows, vocab, lf.data());
  const double md = cross_entropy_forward(zd.data(), t.data(), rows, vocab, ld.data());
  EXPECT_TRUE(std::isfinite(mf));
  EXPECT_NEAR(mf, md, 1e-6 * std::fabs(md));
  expect_close_rel(lf, ld, 1e-6, 0, "row loss");
  const float scale = 1.f / rows;
  cross_entropy_backward(zf.data(), t.data(), rows, vocab, scale, dzf.data());
  cross_entropy_backward(zd.data(), t.data(), rows, vocab, static_cast<double>(scale), dzd.data());
  expect_close_rel(dzf, dzd, 1e-6, 1e-8, "dz");
  for (int64_t r = 0; r < rows; ++r) {
    double sf = 0, sd = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      EXPECT_TRUE(std::isfinite(dzf[r * vocab + j]));
      sf += dzf[r * vocab + j];
      sd += dzd[r * vocab + j];
    }
    EXPECT_NEAR(sf, 0.0, 1e-6) << "row " << r;
    EXPECT_NEAR(sd, 0.0, 1e-15) << "row " << r;
  }
  // In place over the logits gives the same gradient.
  auto zi = zf;
  cross_entropy_backward(zi.data(), t.data(), rows, vocab, scale, zi.data());
  EXPECT_EQ(zi, dzf);
}

TEST(Layers, CrossEntropyBadTargetsAreErrors) {
  const std::vector<int32_t> ok = {0, 7, kIgnoreTarget}, bad = {8}, negative = {0, 1, -100};
  EXPECT_EQ(error_of([&] { check_targets(ok.data(), 3, 8); }), "(no error)");
  EXPECT_EQ(error_of([&] { check_targets(bad.data(), 1, 8); }),
            "target 8 at position 0 is outside [0, 8) and is not the ignore value -1");
  EXPECT_EQ(error_of([&] { check_targets(negative.data(), 3, 8); }),
            "target -100 at position 2 is outside [0, 8) and is not the ignore value -1");
}

// An ignored target counts no loss and gets no gradient; the mean is over the counted rows.
TEST(Layers, CrossEntropyIgnoredTargets) {
  const double z[6] = {0, std::log(3.0), 5, -2, 0, std::log(3.0)};
  const int32_t t[3] = {1, kIgnoreTarget, 0};
  double rl[3];
  const double mean = cross_entropy_forward(z, t, 3, 2, rl);
  EXPECT_EQ(rl[1], 0.0);
  EXPECT_NEAR(mean, 0.5 * (std::log(4.0 / 3.0) + std::log(4.0)), 1e-15);
  double dz[6];
  cross_entropy_backward(z, t, 3, 2, 0.5, dz);
  EXPECT_EQ(dz[2], 0.0);
  EXPECT_EQ(dz[3], 0.0);
  EXPECT_NEAR(dz[0], 0.5 * 0.25, 1e-15);
  const int32_t none[1] = {kIgnoreTarget};
  EXPECT_TRUE(std::isnan(cross_entropy_forward(z, none, 1, 2)));
}

// ---------------- AdamW ----------------

// Literals computed in Python with float64 arithmetic (numpy), the hyper-parameters and the bias
// corrections first rounded to float32 as adamw_step receives them:
//   f = lambda x: float(np.float32(x)); lr, b1, b2, eps, wd = f(1e-2), f(0.9), f(0.999), f(1e-3), f(0.1)
//   p, m, v = 0.5, 0, 0; for t, g in [(1, .1), (2, -.2), (3, .3)]:
//     bc1, bc2 = f(1 - b1**t), f(1 - b2**t); p -= lr*wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g
//     p -= lr*(m/bc1)/(np.sqrt(v/bc2) + eps)
// eps = 1e-3 and wd = 0.1 are large on purpose so that each term shows at the tested precision.
struct AdamLiteral {
  double p, m, v;
};
constexpr AdamLiteral kAdamSteps[3] = {
    {0.4895990101306759, 0.010000002384185792, 9.999871253967286e-06},
    {0.4927474409564312, -0.011000002861023006, 4.998935652732684e-05},
    {0.4888380939095022, 0.02010000483989717, 0.0001399382091000982},
};
constexpr double kAdamGrads[3] = {0.1, -0.2, 0.3};

template <class T>
void run_adam_literals(double rel) {
  T p = T(0.5), m = T(0), v = T(0);
  for (int t = 1; t <= 3; ++t) {
    float bc1, bc2;
    adam_bias_corrections(0.9f, 0.999f, t, bc1, bc2);
    adamw_step(p, T(kAdamGrads[t - 1]), m, v, 1e-2f, 0.9f, 0.999f, 1e-3f, 0.1f, bc1, bc2);
    const AdamLiteral& want = kAdamSteps[t - 1];
    EXPECT_NEAR(p, want.p, rel * std::fabs(want.p)) << "step " << t;
    EXPECT_NEAR(m, want.m, rel * std::fabs(want.m)) << "step " << t;
    EXPECT_NEAR(v, want.v, rel * std::fabs(want.v)) << "step " << t;
  }
}

TEST(Layers, AdamWMatchesLiteralsInDouble) { run_adam_literals<double>(1e-13); }
TEST(Layers, AdamWMatchesLiteralsInFloat) { run_adam_literals<float>(2e-6); }

TEST(Layers, AdamBiasCorrections) {
  float bc1, bc2;
  adam_bias_corrections(0.9f, 0.999f, 2, bc1, bc2);
  const double b1 = 0.9f;
  EXPECT_EQ(bc1, static_cast<float>(1.0 - b1 * b1));
  const double b2 = 0.999f;  // the float's value
  EXPECT_EQ(bc2, static_cast<float>(1.0 - b2 * b2));
}

}  // namespace
