// Tensor views, Storage ownership, early release and the allocator's exact statistics.
// Oracle: byte counts computed by hand from the shapes.
#include <gtest/gtest.h>

#include "core/tensor.h"

namespace tandem {
namespace {

TEST(Tensor, StatisticsCountExactBytesPerCategory) {
  Allocator& a = cpu_allocator();
  const MemoryStats before = a.stats();
  {
    Tensor x = Tensor::empty({3, 5}, DType::kF32, MemCategory::kActivation, "x");
    Tensor g = Tensor::zeros({7}, DType::kF64, MemCategory::kGradient, "g");
    const MemoryStats s = a.stats();
    EXPECT_EQ(s.in_use_of(MemCategory::kActivation) - before.in_use_of(MemCategory::kActivation),
              60);
    EXPECT_EQ(s.in_use_of(MemCategory::kGradient) - before.in_use_of(MemCategory::kGradient), 56);
    EXPECT_EQ(s.total_in_use - before.total_in_use, 116);
  }
  EXPECT_EQ(a.stats().total_in_use, before.total_in_use);
}

TEST(Tensor, PeakTracksHighWaterMarkAndResets) {
  Allocator& a = cpu_allocator();
  a.reset_peaks();
  const int64_t base = a.stats().total_in_use;
  {
    Tensor x = Tensor::empty({100}, DType::kF32, MemCategory::kOther, "x");
    { Tensor y = Tensor::empty({50}, DType::kF32, MemCategory::kOther, "y"); }
  }
  EXPECT_EQ(a.stats().total_peak - base, 600);
  a.reset_peaks();
  EXPECT_EQ(a.stats().total_peak, base);
}

TEST(Tensor, ReleaseStorageFreesAllViewsAndTouchingThrows) {
  Allocator& a = cpu_allocator();
  const int64_t base = a.stats().total_in_use;
  Tensor x = Tensor::zeros({4, 4}, DType::kF32, MemCategory::kActivation, "logits");
  Tensor view = x.narrow_rows(1, 2);
  EXPECT_EQ(view.data<float>(), x.data<float>() + 4);
  release_storage({&x});
  EXPECT_EQ(a.stats().total_in_use, base);
  EXPECT_TRUE(view.released());
  EXPECT_THROW(view.data<float>(), Error);
  try {
    x.data<float>();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logits"), std::string::npos);
  }
  release_storage({&x, &view});  // releasing twice is a no-op
  EXPECT_EQ(a.stats().total_in_use, base);
}

// Note [Offloaded storage]: evicted bytes go back to the allocator, every view throws with the
// tensor's name until readmit() takes as many bytes again under the same category; releasing
// an evicted storage frees nothing twice.
TEST(Tensor, EvictedStorageHoldsNoBytesAndThrowsUntilReadmitted) {
  Allocator& a = cpu_allocator();
  const int64_t base = a.stats().in_use_of(MemCategory::kActivation);
  Tensor x = Tensor::zeros({4, 4}, DType::kF32, MemCategory::kActivation, "attn.q");
  Tensor view = x.narrow_rows(2, 2);
  x.storage()->evict();
  EXPECT_TRUE(view.evicted());
  EXPECT_EQ(a.stats().in_use_of(MemCategory::kActivation), base);
  try {
    view.data<float>();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn.q"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offloaded"), std::string::npos) << e.what();
  }
  x.storage()->readmit();
  EXPECT_FALSE(view.evicted());
  EXPECT_EQ(a.stats().in_use_of(MemCategory::kActivation), base + 64);
  view.data<float>()[0] = 1;
  EXPECT_EQ(x.data<float>()[8], 1);
  x.storage()->evict();
  release_storage({&x});
  EXPECT_TRUE(view.released());
  EXPECT_EQ(a.stats().in_use_of(MemCategory::kActivation), base);
}

TEST(Tensor, ReleaseSkipsUndefinedTensors) {
  Tensor empty;
  release_storage({&empty});
  EXPECT_FALSE(empty.defined());
}

TEST(Tensor, TraceRecordsAllocationsAndFreesInOrder) {
  Allocator& a = cpu_allocator();
  a.set_trace(true);
  { Tensor x = Tensor::empty({2}, DType::kF32, MemCategory::kActivation, "traced"); }
  const auto trace = a.trace();
  a.set_trace(false);
  ASSERT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace[0].bytes, 8);
  EXPECT_EQ(trace[0].tag, "traced");
  EXPECT_EQ(trace[1].bytes, -8);
  EXPECT_EQ(trace[1].tag, "traced");  // frees name the storage too
  EXPECT_LT(trace[0].seq, trace[1].seq);
}

TEST(Tensor, ReshapeAndCopy) {
  Tensor x = Tensor::zeros({2, 3}, DType::kF32, MemCategory::kOther);
  for (int i = 0; i < 6; ++i) x.data<float>()[i] = static_cast<float>(i);
  Tensor y = Tensor::empty({6}, DType::kF32, MemCategory::kOther);
  y.copy_from(x.reshape({6}));
  EXPECT_EQ(y.data<float>()[5], 5.0f);
  EXPECT_EQ(x.reshape({3, 2}).size(-1), 2);
}

}  // namespace
}  // namespace tandem
