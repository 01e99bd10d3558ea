// The MPI communicator and the parallel layout. Oracles: sums and permutations computed on every
// rank from the rank numbers; Megatron's rank order written out by hand.
#include <gtest/gtest.h>

#include "comm/layout.h"
#include "comm/self_communicator.h"
#include "dist_env.h"

namespace tandem::comm {
namespace {

using testing::g_world;

TEST(Layout, MegatronOrderForPp2Ep2OnFourRanks) {
  const ParallelLayout L = ParallelLayout::make(4, 2, 2);
  EXPECT_EQ(L.dp(), 2);
  EXPECT_EQ(L.edp(), 1);
  EXPECT_EQ(L.pp_group(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(L.dp_group(2), (std::vector<int>{2, 3}));
  EXPECT_EQ(L.ep_group(3), (std::vector<int>{2, 3}));
  EXPECT_EQ(L.edp_group(3), (std::vector<int>{3}));
  const ParallelLayout M = ParallelLayout::make(8, 2, 2);  // dp 4 = ep 2 x expert-dp 2
  EXPECT_EQ(M.ep_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(M.edp_group(5), (std::vector<int>{5, 7}));
  EXPECT_THROW(ParallelLayout::make(6, 4, 1), Error);
  EXPECT_THROW(ParallelLayout::make(4, 2, 4), Error);
}

TEST(Comm, AllReduceSendRecvAllToAll) {
  const int r = g_world->rank(), n = g_world->size();
  Tensor t = Tensor::empty({3}, DType::kF64, MemCategory::kCommunication);
  for (int i = 0; i < 3; ++i) t.data<double>()[i] = r + i;
  g_world->all_reduce_sum(t);
  EXPECT_EQ(t.data<double>()[2], n * (n - 1) / 2.0 + 2.0 * n);

  // Ring: send my rank to the next, receive from the previous.
  if (n > 1) {
    Tensor out = Tensor::empty({1}, DType::kI32, MemCategory::kCommunication);
    Tensor in = Tensor::empty({1}, DType::kI32, MemCategory::kCommunication);
    out.data<int32_t>()[0] = r;
    auto pending = g_world->isend(out, (r + 1) % n, 7);
    g_world->recv(in, (r + n - 1) % n, 7);
    pending->wait();
    EXPECT_EQ(in.data<int32_t>()[0], (r + n - 1) % n);
  }
  // all_to_all_v: rank r sends p+1 rows of value 100r+p to each peer p.
  std::vector<int64_t> send(n), recv(n);
  int64_t total_send = 0, total_recv = 0;
  for (int p = 0; p < n; ++p) total_send += send[p] = p + 1;
  for (int p = 0; p < n; ++p) total_recv += recv[p] = r + 1;
  Tensor in = Tensor::empty({total_send, 2}, DType::kF32, MemCategory::kCommunication);
  Tensor out = Tensor::empty({total_recv, 2}, DType::kF32, MemCategory::kCommunication);
  int64_t row = 0;
  for (int p = 0; p < n; ++p) {
    for (int i = 0; i <= p; ++i, ++row) {
      in.data<float>()[2 * row] = in.data<float>()[2 * row + 1] = 100.0f * r + p;
    }
  }
  g_world->all_to_all_v(out, recv, in, send);
  for (int64_t i = 0; i < total_recv; ++i) {
    EXPECT_EQ(out.data<float>()[2 * i], 100.0f * (i / (r + 1)) + r);
  }
  const auto all = g_world->all_gather_bytes(std::string(static_cast<size_t>(r), 'x'));
  ASSERT_EQ(static_cast<int>(all.size()), n);
  for (int p = 0; p < n; ++p) EXPECT_EQ(all[p].size(), static_cast<size_t>(p));
}

// The distributed optimizer's two collectives (Note [Distributed optimizer] in
// runtime/distributed_optimizer.cc), over the world and over a world of one process.
TEST(Comm, ReduceScatterAndAllGather) {
  const std::unique_ptr<Communicator> self = self_world();
  for (Communicator* c : {g_world, self.get()}) {
    const int r = c->rank(), n = c->size();
    Tensor in = Tensor::empty({3 * n}, DType::kF32, MemCategory::kCommunication);
    for (int k = 0; k < 3 * n; ++k) in.data<float>()[k] = 1000.0f * r + k;
    Tensor out = Tensor::empty({3}, DType::kF32, MemCategory::kCommunication);
    c->reduce_scatter_sum(out, in);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(out.data<float>()[i], 1000.0f * n * (n - 1) / 2 + n * (3.0f * r + i))
          << c->name() << " element " << i;
    }
    Tensor mine = Tensor::empty({2}, DType::kF64, MemCategory::kCommunication);
    for (int i = 0; i < 2; ++i) mine.data<double>()[i] = 10.0 * r + i;
    Tensor all = Tensor::empty({2 * n}, DType::kF64, MemCategory::kCommunication);
    c->all_gather(all, mine);
    for (int k = 0; k < 2 * n; ++k) {
      EXPECT_EQ(all.data<double>()[k], 10.0 * (k / 2) + k % 2) << c->name() << " element " << k;
    }
  }
}

TEST(Comm, SubgroupsFollowTheLayout) {
  const int n = g_world->size();
  const ParallelLayout L = ParallelLayout::make(n, n >= 2 ? 2 : 1, 1);
  auto pp = g_world->subgroup(L.pp_group(g_world->rank()), "pp");
  EXPECT_EQ(pp->size(), L.pp);
  EXPECT_EQ(pp->rank(), L.pp_rank(g_world->rank()));
  Tensor t = Tensor::empty({1}, DType::kI64, MemCategory::kCommunication);
  t.data<int64_t>()[0] = g_world->rank();
  pp->all_reduce_sum(t);
  int64_t want = 0;
  for (int x : L.pp_group(g_world->rank())) want += x;
  EXPECT_EQ(t.data<int64_t>()[0], want);
}

}  // namespace
}  // namespace tandem::comm
