// The MPI communicator and the parallel layout. Oracles: sums and permutations computed on every
// rank from the rank numbers; Megatron's rank order written out by hand, and Megatron-LM's rank
// generator (parallel_state.py) written out from its definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/layout.h"
#include "comm/self_communicator.h"
#include "dist_env.h"
#include "runtime/groups.h"

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

// Megatron-LM's generate_masked_orthogonal_rank_groups (megatron/core/parallel_state.py), written
// out from its definition: `sizes` innermost first, rank = sum of index_i x prefix product; a
// group varies the masked dimensions (the first masked one fastest) with the others fixed.
std::vector<std::vector<int>> megatron_groups(const std::vector<int>& sizes,
                                              const std::vector<bool>& mask) {
  int world = 1;
  std::vector<int> stride;
  for (int s : sizes) stride.push_back(world), world *= s;
  std::vector<int> in, out;  // the masked and the unmasked dimensions
  for (size_t i = 0; i < sizes.size(); ++i) (mask[i] ? in : out).push_back(static_cast<int>(i));
  const auto offset = [&](int index, const std::vector<int>& dims) {
    int r = 0;
    for (int d : dims) r += index % sizes[d] * stride[d], index /= sizes[d];
    return r;
  };
  int group_size = 1;
  for (int d : in) group_size *= sizes[d];
  std::vector<std::vector<int>> groups;
  for (int g = 0; g < world / group_size; ++g) {
    groups.emplace_back();
    for (int k = 0; k < group_size; ++k) groups.back().push_back(offset(k, in) + offset(g, out));
  }
  return groups;
}

// The group of `groups` holding `rank`.
std::vector<int> group_of(const std::vector<std::vector<int>>& groups, int rank) {
  for (const std::vector<int>& g : groups) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  }
  return {};
}

// Every layout of up to 24 ranks against Megatron-LM's two rank generators: the dense one (order
// tp-cp-ep-dp-pp with cp = ep = 1: sizes tp, dp, pp) and the expert one (expert tensor-parallel
// size 1: sizes ep, expert-dp, pp).
TEST(Layout, GroupsAreMegatronsRankGenerators) {
  int layouts = 0;
  for (int world = 1; world <= 24; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int pp = 1; tp * pp <= world; ++pp) {
        for (int ep = 1; ep <= world / pp; ++ep) {
          if (world % (tp * pp) != 0 || (world / pp) % ep != 0) continue;
          const ParallelLayout L = ParallelLayout::make(world, pp, ep, tp);
          const int dp = world / (tp * pp), edp = world / (ep * pp);
          ASSERT_EQ(L.dp(), dp);
          ASSERT_EQ(L.edp(), edp);
          const std::vector<int> dense = {tp, dp, pp}, expert = {ep, edp, pp};
          const auto tp_groups = megatron_groups(dense, {true, false, false});
          const auto dp_groups = megatron_groups(dense, {false, true, false});
          const auto pp_groups = megatron_groups(dense, {false, false, true});
          const auto ep_groups = megatron_groups(expert, {true, false, false});
          const auto edp_groups = megatron_groups(expert, {false, true, false});
          for (int r = 0; r < world; ++r) {
            const std::string at = L.describe(r);
            EXPECT_EQ(L.tp_group(r), group_of(tp_groups, r)) << at;
            EXPECT_EQ(L.dp_group(r), group_of(dp_groups, r)) << at;
            EXPECT_EQ(L.pp_group(r), group_of(pp_groups, r)) << at;
            EXPECT_EQ(L.ep_group(r), group_of(ep_groups, r)) << at;
            EXPECT_EQ(L.edp_group(r), group_of(edp_groups, r)) << at;
            // Each coordinate is the rank's place in its group, and the coordinates give it back.
            EXPECT_EQ(L.tp_group(r)[L.tp_rank(r)], r) << at;
            EXPECT_EQ(L.dp_group(r)[L.dp_rank(r)], r) << at;
            EXPECT_EQ(L.pp_group(r)[L.pp_rank(r)], r) << at;
            EXPECT_EQ(L.ep_group(r)[L.ep_rank(r)], r) << at;
            EXPECT_EQ(L.edp_group(r)[L.edp_rank(r)], r) << at;
            EXPECT_EQ(L.rank_of(L.pp_rank(r), L.dp_rank(r), L.tp_rank(r)), r) << at;
          }
          ++layouts;
        }
      }
    }
  }
  EXPECT_GT(layouts, 100);
}

// TP 2 x DP 2 x PP 2 on eight ranks, written out by hand (tp innermost): {0,1} share their
// matrices, {0,2} their gradients, {0,4} a pipeline; with EP 4 the experts go over a stage's ranks.
TEST(Layout, TensorParallelRanksAreInnermost) {
  const ParallelLayout L = ParallelLayout::make(8, 2, 4, 2);
  EXPECT_EQ(L.tp_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(L.dp_group(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(L.pp_group(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(L.ep_group(5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(L.edp_group(5), (std::vector<int>{5}));
  // The world must be TP x PP x N, and EP divide a stage's ranks.
  try {
    ParallelLayout::make(6, 2, 1, 2);
    ADD_FAILURE() << "6 ranks are not 2 x 2 x N";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the world size 6 is not a multiple of "
                                         "--tensor-model-parallel-size 2 x "
                                         "--pipeline-model-parallel-size 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ParallelLayout::make(8, 2, 3, 2), Error);
  EXPECT_THROW(ParallelLayout::make(4, 1, 1, 0), Error);
}

// The world ranks of `c`'s members in group-rank order, as the members themselves report them.
std::vector<int> members(Communicator& c, int world_rank) {
  std::vector<int> out;
  for (const std::string& r : c.all_gather_bytes(std::to_string(world_rank))) {
    out.push_back(std::stoi(r));
  }
  return out;
}

// runtime::Groups over the real world, every TP x PP x EP layout its ranks allow: each
// communicator holds, in its own rank order, the ranks Megatron-LM's generators give (the
// transcription above), and its size is that group's.
TEST(Layout, GroupsCommunicatorsHoldMegatronsRanks) {
  const int world = g_world->size(), me = g_world->rank();
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  int layouts = 0;
  for (int tp = 1; tp <= world; tp *= 2) {
    for (int pp = 1; tp * pp <= world; pp *= 2) {
      for (int ep = 1; ep <= world / pp; ep *= 2) {
        const int dp = world / (tp * pp), edp = world / (ep * pp);
        const runtime::Groups g =
            runtime::Groups::make(g_world->subgroup(all, "world"), pp, ep, tp);
        const std::vector<int> dense = {tp, dp, pp}, expert = {ep, edp, pp};
        const std::string at = g.layout.describe(me);
        EXPECT_EQ(members(*g.tp, me), group_of(megatron_groups(dense, {true, false, false}), me))
            << at;
        EXPECT_EQ(members(*g.dp, me), group_of(megatron_groups(dense, {false, true, false}), me))
            << at;
        EXPECT_EQ(members(*g.pp, me), group_of(megatron_groups(dense, {false, false, true}), me))
            << at;
        EXPECT_EQ(members(*g.ep, me), group_of(megatron_groups(expert, {true, false, false}), me))
            << at;
        EXPECT_EQ(members(*g.edp, me), group_of(megatron_groups(expert, {false, true, false}), me))
            << at;
        EXPECT_EQ(g.tp->size(), tp) << at;
        EXPECT_EQ(g.tp->rank(), g.layout.tp_rank(me)) << at;
        EXPECT_EQ(g.dp->size(), dp) << at;
        ++layouts;
      }
    }
  }
  EXPECT_GE(layouts, 1);
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
