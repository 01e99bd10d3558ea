// HostRead (Note [Reads to the host ahead of use] in core/host_read.h) on the CPU: the values
// are those of the tensor when the read started, taken once, as the tensor's own type.
#include <gtest/gtest.h>

#include <vector>

#include "core/host_read.h"

namespace tandem {
namespace {

Tensor ints(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32, MemCategory::kOther);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

TEST(HostRead, ValuesAsTheReadStarted) {
  const Tensor t = ints({3, -1, 7});
  HostRead read(t);
  t.data<int32_t>()[0] = 99;  // after the start: not seen
  ASSERT_TRUE(read.started());
  EXPECT_EQ(read.take(), (std::vector<int32_t>{3, -1, 7}));
  EXPECT_FALSE(read.started());
}

TEST(HostRead, TakesAnyDtypeAsItsOwn) {
  Tensor d = Tensor::empty({2}, DType::kF64, MemCategory::kOther);
  d.data<double>()[0] = 0.25;
  d.data<double>()[1] = -3.5;
  HostRead read(d);
  EXPECT_EQ(read.take_as<double>(), (std::vector<double>{0.25, -3.5}));
}

TEST(HostRead, MovesAndEmptyTensors) {
  HostRead a(ints({1, 2}));
  HostRead b = std::move(a);
  EXPECT_FALSE(a.started());
  EXPECT_EQ(b.take(), (std::vector<int32_t>{1, 2}));
  HostRead empty(ints({}));
  EXPECT_TRUE(empty.take().empty());
}

}  // namespace
}  // namespace tandem
