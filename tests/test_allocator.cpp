#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "harness/allocator.hpp"
#include "harness/device.hpp"
#include "harness/host_pages.hpp"
#include "harness/tensor.hpp"

using namespace memtrade;

TEST(Allocator, TracksLivePeakAndCountPerTag) {
  auto dev = make_cpu_device();
  auto& pool = dev->memory();
  {
    Buffer a(pool, 1000, Tag::weights);
    Buffer b(pool, 24, Tag::activations);
    EXPECT_EQ(pool.total().live, 1024u);
    EXPECT_EQ(pool.total().count, 2u);
    EXPECT_EQ(pool.by_tag(Tag::weights).live, 1000u);
    EXPECT_EQ(pool.by_tag(Tag::activations).peak, 24u);
    {
      Buffer c(pool, 4096, Tag::activations);
      EXPECT_EQ(pool.total().peak, 5120u);
    }
    EXPECT_EQ(pool.total().live, 1024u);
    EXPECT_EQ(pool.total().peak, 5120u);  // peak survives the free
    EXPECT_EQ(pool.by_tag(Tag::activations).peak, 4120u);
    pool.reset_peak();
    EXPECT_EQ(pool.total().peak, 1024u);
    EXPECT_EQ(pool.by_tag(Tag::activations).peak, 24u);
  }
  EXPECT_EQ(pool.total().live, 0u);
  EXPECT_EQ(pool.total().count, 0u);
  EXPECT_EQ(pool.allocations_made(), 3u);
  // The host pool is separate.
  EXPECT_EQ(dev->host().total().peak, 0u);
}

TEST(Allocator, CapacityRaisesOutOfMemoryWithTheNumbers) {
  auto dev = make_cpu_device();
  auto& pool = dev->memory();
  pool.set_capacity(10000);
  Buffer a(pool, 6000, Tag::io);
  try {
    Buffer b(pool, 5000, Tag::kv);
    FAIL() << "allocation past the capacity succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested, 5000u);
    EXPECT_EQ(e.live, 6000u);
    EXPECT_EQ(e.capacity, 10000u);
    EXPECT_EQ(e.tag, "kv");
    EXPECT_NE(std::string(e.what()).find("exceeds capacity 10000 B"), std::string::npos) << e.what();
  }
  // A failed request leaves the books untouched, and exactly the capacity still fits.
  EXPECT_EQ(pool.total().live, 6000u);
  Buffer c(pool, 4000, Tag::kv);
  EXPECT_EQ(pool.total().peak, 10000u);
  EXPECT_THROW(Buffer(pool, 1, Tag::kv), OutOfMemory);
  // A request larger than the capacity itself does not overflow the check.
  pool.set_capacity(100);
  EXPECT_THROW(Buffer(pool, SIZE_MAX - 10, Tag::io), OutOfMemory);
}

TEST(Allocator, UnderlyingFailureIsOutOfMemoryNotACrash) {
  TrackedAllocator pool("failing", [](std::size_t) -> void* { return nullptr; }, [](void*) {});
  try {
    Buffer b(pool, 64, Tag::io);
    FAIL();
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("underlying allocator failed"), std::string::npos);
  }
  EXPECT_EQ(pool.total().live, 0u);
}

TEST(Allocator, BufferMoveTransfersOwnership) {
  auto dev = make_cpu_device();
  auto& pool = dev->memory();
  Buffer a(pool, 128, Tag::grads);
  void* p = a.data();
  Buffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(pool.total().live, 128u);
  b = Buffer(pool, 64, Tag::grads);
  EXPECT_EQ(pool.total().live, 64u);
  b.reset();
  EXPECT_EQ(pool.total().live, 0u);
  EXPECT_EQ(Buffer(pool, 0, Tag::io).data(), nullptr);  // zero bytes: nothing allocated
  EXPECT_EQ(pool.total().count, 0u);
}

TEST(Tensor, RoundTripsThroughTheDeviceInEachDtype) {
  auto dev = make_cpu_device();
  const std::vector<double> v = {1.0, -2.5, 0.1, 65504.0, 1e-3, 3.0};
  for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    Tensor x = make_tensor(*dev, t, {2, 3}, Tag::io, v);
    EXPECT_EQ(dev->memory().total().live, 6 * dtype_size(t));
    const auto back = download(*dev, x.view());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double tol = t == DType::f64 ? 0 : t == DType::f32 ? 1e-7 : t == DType::f16 ? 1e-3 : 8e-3;
      EXPECT_NEAR(back[i], v[i], tol * std::abs(v[i])) << dtype_name(t) << " element " << i;
    }
  }
  EXPECT_EQ(dev->memory().total().live, 0u);
}

TEST(Tensor, ImpossibleShapesAreClearErrors) {
  auto dev = make_cpu_device();
  EXPECT_THROW(Tensor(*dev, DType::f32, {4, 0}, Tag::io), Error);
  EXPECT_THROW(Tensor(*dev, DType::f32, {-3}, Tag::io), Error);
  EXPECT_THROW(Tensor(*dev, DType::f32, {1, 2, 3, 4, 5}, Tag::io), Error);
  try {
    Shape s{2, -1};
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("impossible tensor shape"), std::string::npos);
  }
  Tensor x(*dev, DType::f32, {2, 2}, Tag::io);
  const std::vector<double> three = {1, 2, 3};
  EXPECT_THROW(upload(*dev, x.view(), three), Error);
}

TEST(Device, CudaWithoutADeviceIsASkipWithTheReason) {
  const auto s = cuda_status();
  if (s.available) GTEST_SKIP() << "a CUDA device is present: " << s.gpu_name;
  EXPECT_EQ(s.reason.rfind("no CUDA device", 0), 0u) << s.reason;
  try {
    make_cuda_device();
    FAIL();
  } catch (const Skip& e) {
    EXPECT_EQ(std::string(e.what()), s.reason);
  }
}

TEST(Allocator, GuardBytesCatchAWritePastTheEnd) {
  auto dev = make_cpu_device();
  TrackedAllocator& pool = dev->memory();
  pool.set_guard_bytes(64);
  {
    Buffer ok(pool, 100, Tag::activations);
    std::memset(ok.data(), 1, 100);  // in bounds
  }
  EXPECT_TRUE(pool.guard_violations().empty());
  {
    Buffer b(pool, 100, Tag::kv);
    EXPECT_EQ(pool.total().live, 100u);  // guards are not counted
    b.as<unsigned char>()[100] = 0;      // one byte past the end
  }
  const auto v = pool.guard_violations();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("buffer of 100 B (tag kv) changed guard byte 0"), std::string::npos) << v[0];
  pool.clear_guard_violations();
  pool.set_guard_bytes(0);
  {
    Buffer b(pool, 16, Tag::io);  // unguarded: nothing checked
  }
  EXPECT_TRUE(pool.guard_violations().empty());
}

// The VMA holding p, as /proc/self/smaps describes it: its "THPeligible:" value (-1 when not shown).
static int thp_eligible(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::atoi(line.c_str() + 12);
    }
  }
  return -1;
}

TEST(HostPages, LargeBuffersAreWholeAdvisedHugePagesAndTheCountsStayExact) {
  auto dev = make_cpu_device();
  auto& pool = dev->memory();
  const std::size_t big = 5 * kHugePageBytes + 3, small = kHugePageBytes - 64;
  Buffer a(pool, big, Tag::weights), b(pool, small, Tag::activations);
  EXPECT_EQ(pool.total().live, big + small);  // the rounding to whole pages is not counted
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  std::memset(a.data(), 1, big);  // the first touch, after the advice
  if (huge_pages_mode() != "madvise") GTEST_SKIP() << "huge pages: " << huge_pages_mode();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kHugePageBytes, 0u);
  const int eligible = thp_eligible(a.data());
  if (eligible < 0) GTEST_SKIP() << "this kernel's smaps has no THPeligible field";
  EXPECT_EQ(eligible, 1) << "the buffer's mapping is not advised for huge pages";
}

TEST(HostPages, TheModeFollowsTheVariableAndTheKernel) {
  EXPECT_EQ(huge_pages_mode_for(nullptr, "madvise"), "madvise");
  EXPECT_EQ(huge_pages_mode_for(nullptr, "always"), "madvise");
  EXPECT_EQ(huge_pages_mode_for("on", "madvise"), "madvise");
  EXPECT_EQ(huge_pages_mode_for(nullptr, "never"), "unavailable");
  EXPECT_EQ(huge_pages_mode_for(nullptr, ""), "unavailable");
  EXPECT_EQ(huge_pages_mode_for("off", "always"), "off");
  EXPECT_EQ(huge_pages_mode_for("0", "madvise"), "off");
  try {
    huge_pages_mode_for("sometimes", "madvise");
    ADD_FAILURE() << "no error for MEMTRADE_HUGE_PAGES=sometimes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MEMTRADE_HUGE_PAGES=sometimes"), std::string::npos) << e.what();
  }
}
