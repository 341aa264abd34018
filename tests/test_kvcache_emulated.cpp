// The CUDA decode kernels (impls/kvcache/decode_kernels.cuh) run on the CPU under the tests' CUDA
// emulation: every storage type, partial lanes and whole-slice loads of 2, 4 and 8 elements, MHA and a
// group of 12 (two thread blocks per KV head), one-token requests and requests of several splits, against
// the float64 reference; paged (scattered block tables) and contiguous give the same bits. On a GPU,
// test_cuda's KvCacheCuda test runs the same cases on the device.
#include "cuda_emulation.hpp"  // first: it defines the CUDA keywords for the kernels' header

#include <gtest/gtest.h>

#include <cstring>

#include "harness/metrics.hpp"
#include "impls/kvcache/decode_kernels.cuh"
#include "kv_fixtures.hpp"

using namespace memtrade;
using namespace memtrade::kvcache;
using namespace memtrade::test::kv;

namespace {

// One decode step of a plan through the emulated kernels; the arrays are the plan's own vectors.
std::vector<float> run_emulated(const DecodePlan& p, const std::vector<float>& q) {
  namespace dk = decode_kernels;
  std::vector<float> out(q.size()), ws(static_cast<std::size_t>(std::max<int64_t>(1, p.first_slot.back() * p.heads * (p.head_dim + 2))));
  dk::Args a{};
  const dk::Shape s = dk::make_args(p, [](const auto& v) { return v.data(); }, ws.data(), a);
  a.q = q.data();
  a.out = out.data();
  const dk::SplitKernel kernel = dk::split_kernel(p, s);
  test::cuda_emulation::launch(s.grid_x, s.grid_y, dk::kThreads, [&] { kernel(a); });
  if (p.first_slot.back() > 0)
    test::cuda_emulation::launch(static_cast<unsigned>(p.length.size()), static_cast<unsigned>(p.heads), dk::kThreads,
                                 [&] { dk::merge_splits_kernel(a); });
  return out;
}

}  // namespace

TEST(KvCacheCudaEmulated, DecodeWithinTheFp32RuleOfTheFloat64ReferenceAndPagedEqualsContiguous) {
  auto dev = make_cpu_device();
  int whole_slices = 0, cases = 0;  // cases whose lanes load their slices whole, of all
  // (head_dim, query heads per KV head): partial lanes (40; 32, where q8_0 / q4_0's 16 lanes of one block
  // leave 16 idle), whole-slice loads of 2, 4 and 8 elements.
  for (const auto& [hd, group] : {std::pair<int64_t, int64_t>{40, 12}, {32, 3}, {64, 1}, {128, 4}, {256, 1}})
    for (KvType t : kTypes) {
      if (!takes(t, hd)) continue;
      ++cases;
      KvShape s{1, 2, hd, t};
      random_static_scales(s, 4);
      const int64_t heads = 2 * group, B = 3, max_len = 40, split = 16;  // 40 tokens: three splits of 16
      const TwoLayouts x = two_layouts(*dev, s, B, max_len, 11 + static_cast<uint64_t>(hd));
      const auto q = normals(B * heads * hd, 78);
      const DecodePlan pc = plan_decode(*x.c, x.rc, 0, heads, split), pp = plan_decode(*x.p, x.rp, 0, heads, split);
      const std::string what = std::string(kv_type_name(t)) + " head_dim " + std::to_string(hd) + " group " + std::to_string(group);
      whole_slices += pp.vector_loads;
      const auto oc = run_emulated(pc, q), op = run_emulated(pp, q);
      ASSERT_EQ(std::memcmp(oc.data(), op.data(), oc.size() * 4), 0) << what << ": paged != contiguous";
      for (int64_t b = 0; b < B; ++b) {
        std::vector<double> ref(heads * hd);
        decode_attention_ref(*x.c, x.rc[b], 0, &q[b * heads * hd], heads, ref.data());
        const auto e = error_stats(std::vector<double>(op.begin() + b * heads * hd, op.begin() + (b + 1) * heads * hd), ref);
        ASSERT_TRUE(e.finite()) << what;
        ASSERT_LE(e.rel_l2, 2.0 * (hd + x.len[b] + 8) * std::ldexp(1.0, -24))
            << what << " request " << b << " (" << x.len[b] << " tokens)";
      }
    }
  // Both load paths ran: whole slices (head_dim 64, 128, 256 but int8 / fp8 at 256, whose 260-byte
  // records are not 8-byte aligned) and element by element.
  EXPECT_GT(whole_slices, 0);
  EXPECT_LT(whole_slices, cases);
}
