// The CUDA decode kernels (impls/kvcache/decode_kernels.cuh) run on the CPU under the tests' CUDA
// emulation: every storage type (the KIVI types over several groups, their residual of 32 and of 64 tokens),
// partial lanes and whole-slice loads of 2, 4 and 8 elements, MHA and a group of 12 (two thread blocks per
// KV head), one-token requests and requests of several splits, against the float64 reference; paged
// (scattered block tables) and contiguous give the same bits. On a GPU,
// test_cuda's KvCacheCuda test runs the same cases on the device.
#include "cuda_emulation.hpp"  // first: it defines the CUDA keywords for the kernels' header

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "harness/metrics.hpp"
#include "impls/kvcache/decode_kernels.cuh"
#include "kv_fixtures.hpp"

using namespace memtrade;
using namespace memtrade::kvcache;
using namespace memtrade::test::kv;

namespace {

// One decode step of a plan through the emulated kernels; the arrays are the plan's own vectors. The split
// kernel runs over the splits of each step of `steps` in turn (default: all at once), `before(step)` first.
std::vector<float> run_emulated(const DecodePlan& p, const std::vector<float>& q, std::vector<StagedStep> steps = {},
                                const std::function<void(const StagedStep&)>& before = {}) {
  namespace dk = decode_kernels;
  std::vector<float> out(q.size()), ws(static_cast<std::size_t>(std::max<int64_t>(1, p.first_slot.back() * p.heads * (p.head_dim + 2))));
  dk::Args a{};
  const dk::Shape s = dk::make_args(p, [](const auto& v) { return v.data(); }, ws.data(), a);
  a.q = q.data();
  a.out = out.data();
  const dk::SplitKernel kernel = dk::split_kernel(p, s);
  if (steps.empty()) steps.push_back({0, 0, 0, static_cast<int64_t>(s.grid_y)});
  for (const StagedStep& st : steps) {
    if (before) before(st);
    if (st.split_to <= st.split_from) continue;
    a.split_base = static_cast<int>(st.split_from);
    test::cuda_emulation::launch(s.grid_x, static_cast<unsigned>(st.split_to - st.split_from), dk::kThreads, [&] { kernel(a); });
  }
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
  // leave 16 idle), whole-slice loads of 2, 4 and 8 elements; groups of 12 (two thread blocks per KV head, the
  // second with 4 of its 8 heads) at 40 and at 64 (the KIVI types too), MHA at 256.
  for (const auto& [hd, group] : {std::pair<int64_t, int64_t>{40, 12}, {32, 3}, {64, 12}, {128, 4}, {256, 1}})
    for (KvType t : kCacheTypes) {
      if (!takes(t, hd)) continue;
      ++cases;
      KvShape s{1, 2, hd, t};
      random_static_scales(s, 4);
      if (is_kivi(t) && hd == 64) s.residual = 64;
      // 40 tokens: three splits of 16; the KIVI types (splits of whole groups) 100: four of 32, the last tokens
      // in the residual (4 of them, or 36 with a residual of 64).
      const int64_t heads = 2 * group, B = 3, max_len = is_kivi(t) ? 100 : 40, split = is_kivi(t) ? 32 : 16;
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

TEST(KvCacheCudaEmulated, StagedScheduleLaunchesEverySplitOnceAfterTheCopiesItNeeds) {
  DecodePlan p;
  p.split_needs = {0, 0, 3, 5, 5, 9};
  const auto steps = staged_schedule(p, 10, 3);
  ASSERT_EQ(steps.size(), 4u);
  const int64_t want[4][4] = {{0, 0, 0, 2}, {0, 3, 2, 3}, {3, 6, 3, 5}, {6, 10, 5, 6}};
  for (std::size_t k = 0; k < steps.size(); ++k) {
    EXPECT_EQ(steps[k].copy_from, want[k][0]) << "step " << k;
    EXPECT_EQ(steps[k].copy_to, want[k][1]) << "step " << k;
    EXPECT_EQ(steps[k].split_from, want[k][2]) << "step " << k;
    EXPECT_EQ(steps[k].split_to, want[k][3]) << "step " << k;
  }
  EXPECT_EQ(staged_schedule(p, 10, 100).size(), 11u);  // at most one chunk per slot
  EXPECT_THROW(staged_schedule(p, 8, 2), Error);        // a split needs slot 8
  EXPECT_THROW(staged_schedule(p, 10, 0), Error);
  p.split_needs = {0, 2, 1};
  EXPECT_THROW(staged_schedule(p, 10, 2), Error);  // not in order
  p.split_needs = {0, 0};
  const auto none = staged_schedule(p, 0, 4);  // nothing offloaded: one launch, one empty copy step
  ASSERT_EQ(none.size(), 2u);
  EXPECT_EQ(none[0].split_to, 2);
  EXPECT_EQ(none[1].copy_to, 0);
}

TEST(KvCacheCudaEmulated, StagedDecodeOverlapsTheCopiesAndEqualsPaged) {
  // The offloading cache's staging area is poisoned before the step; each chunk of slots is copied just
  // before the splits the schedule launches after it, so a split launched before its blocks are in reads
  // the poison. One layer (consecutive slots in one copy) and the second of two (a copy per block).
  auto dev = make_cpu_device();
  for (const int64_t layers : {1, 2})
    for (KvType t : {KvType::f32, KvType::int8, KvType::q4_0}) {
      const KvShape s{layers, 2, 64, t};
      const int64_t heads = 8, block = 8, hot = 3, split = 16;
      const std::vector<int64_t> len = {5, 61, 150, 110};
      OffloadPair x = offload_pair(*dev, s, len, block, hot);
      const auto q = normals(static_cast<int64_t>(len.size()) * heads * s.head_dim, 78);
      const std::string what = std::string(kv_type_name(t)) + ", " + std::to_string(layers) + " layers";
      {
        const int64_t l = layers - 1;
        const DecodePlan pp = plan_decode(*x.p, x.rp, l, heads, split);
        x.o->select_staged(x.ro, l);
        const DecodePlan po = plan_decode(*x.o, x.ro, l, heads, split);
        ASSERT_TRUE(std::is_sorted(po.split_needs.begin(), po.split_needs.end())) << what;
        const auto hot_splits = std::count(po.split_needs.begin(), po.split_needs.end(), 0);
        ASSERT_GT(hot_splits, 0) << what;
        ASSERT_LT(hot_splits, static_cast<std::ptrdiff_t>(po.split_needs.size())) << what;
        auto poison = [&] {
          for (std::size_t b = 0; b < len.size(); ++b)
            x.o->runs(x.ro[b], l, [&](const uint8_t* e, int64_t pos, int64_t n) {
              if (x.o->staging_needed(x.ro[b], pos, pos + n) > 0)
                std::memset(const_cast<uint8_t*>(e), 0xFF, static_cast<std::size_t>(n * s.entry_bytes()));
            });
        };
        const auto want = run_emulated(pp, q);
        poison();
        const auto unstaged = run_emulated(po, q);
        ASSERT_NE(std::memcmp(unstaged.data(), want.data(), want.size() * 4), 0) << what << ": the poison is not read";
        poison();
        x.o->reset_traffic();
        const auto steps = staged_schedule(po, x.o->staging_slots(), 4);
        int64_t launched = 0, early = 0;  // splits launched; of them, before the last copy
        const auto got = run_emulated(po, q, steps, [&](const StagedStep& st) {
          EXPECT_EQ(st.split_from, launched);
          launched = st.split_to;
          if (st.copy_to < x.o->staging_slots()) early += st.split_to - st.split_from;
          x.o->copy_staged(st.copy_from, st.copy_to, true);
        });
        EXPECT_EQ(launched, static_cast<int64_t>(po.split_req.size())) << what;
        EXPECT_GT(early, hot_splits) << what << ": no split read a chunk while the next one was copied";
        EXPECT_EQ(x.o->traffic().to_device, x.cold * block * s.entry_bytes()) << what;
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << what << " layer " << l << ": staged != paged";
      }
    }
}
