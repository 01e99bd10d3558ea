// A process alone (comm/self_communicator.h): the layout's groups over a world of one, and
// their collectives and messages. Oracle: what MPI gives a group of one rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "runtime/groups.h"

namespace tandem::runtime {
namespace {

Tensor filled(std::vector<float> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kF32, MemCategory::kOther,
                           "test");
  for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = values[i];
  return t;
}

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(Groups, OneProcessIsAWorldOfOneRank) {
  Groups g = Groups::make(comm::self_world(), 1, 1);
  EXPECT_EQ(g.rank, 0);
  EXPECT_EQ(g.layout.world, 1);
  EXPECT_EQ(g.layout.dp(), 1);
  for (comm::Communicator* c : {g.world.get(), g.pp.get(), g.dp.get(), g.ep.get(), g.edp.get()}) {
    EXPECT_EQ(c->rank(), 0) << c->name();
    EXPECT_EQ(c->size(), 1) << c->name();
  }
  EXPECT_EQ(&g.dp_data(), g.dp.get());                          // no device groups on the CPU
  EXPECT_THROW(Groups::make(comm::self_world(), 2, 1), Error);  // two stages need two ranks
}

TEST(Groups, OneProcessCollectivesLeaveTheDataAsItIs) {
  std::unique_ptr<comm::Communicator> world = comm::self_world();
  const Tensor t = filled({1, 2, 3, 4});
  world->all_reduce_sum(t);
  EXPECT_EQ(values(t), (std::vector<float>{1, 2, 3, 4}));
  const Tensor out = filled({0, 0, 0, 0});
  world->all_gather(out, t);
  EXPECT_EQ(values(out), values(t));
  const Tensor rows = filled({0, 0, 0, 0});
  world->all_to_all_v(rows, {2}, t.reshape({2, 2}), {2});
  EXPECT_EQ(values(rows), values(t));
  EXPECT_EQ(world->all_gather_bytes("mine"), (std::vector<std::string>{"mine"}));
}

// A message to itself is the sent values, received in order per tag, however the sender's
// tensor changes after the send; a receive with nothing sent fails instead of waiting.
TEST(Groups, OneProcessMessagesToItselfKeepTheirOrder) {
  std::unique_ptr<comm::Communicator> world = comm::self_world();
  Tensor a = filled({1, 2}), b = filled({3, 4});
  world->isend(a, 0, 0)->wait();
  world->send(b, 0, 0);
  a.data<float>()[0] = 9;
  const Tensor got = filled({0, 0});
  world->recv(got, 0, 0);
  EXPECT_EQ(values(got), (std::vector<float>{1, 2}));
  world->recv(got, 0, 0);
  EXPECT_EQ(values(got), (std::vector<float>{3, 4}));
  EXPECT_THROW(world->recv(got, 0, 1), Error);
}

}  // namespace
}  // namespace tandem::runtime
