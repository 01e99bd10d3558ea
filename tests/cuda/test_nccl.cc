// The NCCL backend against the MPI backend, its oracle: every operation runs on both over the
// same host data, and the results must agree bit for bit where data only moves, and within one
// rounding of the dtype per addition where it is summed (MPI has no bf16 sum: its oracle sums
// the bf16 values in f32). Plus argument checks, and a bounded wait that fires.
// Needs one GPU per rank, so it is never registered with ctest. Run it by hand:
//   mpirun -np 2 build/tests/cuda/test_nccl
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace tandem::comm {
namespace {

struct Env {
  Communicator* mpi = nullptr;       // the world over MPI (host tensors): the oracle
  NcclCommunicator* nccl = nullptr;  // the world over NCCL (device tensors)
  cudaStream_t stream = nullptr;     // the communication stream every test enqueues on
};
Env g;

using detail::concat;
using Clock = std::chrono::steady_clock;

constexpr DType kAllDTypes[] = {DType::kBF16, DType::kF32, DType::kF64, DType::kI32, DType::kI64};
constexpr DType kMainDTypes[] = {DType::kBF16, DType::kF32, DType::kI32};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double element(const Tensor& t, int64_t i) {
  const void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF64:
      return static_cast<const double*>(p)[i];
    case DType::kBF16:
      return bf16_to_float(static_cast<const BF16*>(p)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void set_element(const Tensor& t, int64_t i, double v) {
  void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DType::kF64:
      static_cast<double*>(p)[i] = v;
      return;
    case DType::kBF16:
      static_cast<BF16*>(p)[i] = bf16_from_float(static_cast<float>(v));
      return;
    case DType::kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      return;
  }
}

// A host tensor whose values are a function of (what, world rank, index): floats uniform in
// [-1, 1) (rounded once for bf16), integers in [-1000, 1000].
Tensor pattern(const Shape& shape, DType dtype, const std::string& what) {
  Tensor t = Tensor::empty(shape, dtype, MemCategory::kOther, "pattern");
  const uint64_t seed = hash_name(what) ^ splitmix64(static_cast<uint64_t>(g.mpi->rank()) + 1);
  const bool integer = dtype == DType::kI32 || dtype == DType::kI64;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = uniform01(seed, static_cast<uint64_t>(i));
    set_element(t, i, integer ? std::floor(u * 2001) - 1000 : 2 * u - 1);
  }
  return t;
}

Tensor as_f32(const Tensor& host) {
  Tensor f = Tensor::empty(host.shape(), DType::kF32, MemCategory::kOther, "f32");
  for (int64_t i = 0; i < host.numel(); ++i) set_element(f, i, element(host, i));
  return f;
}

Tensor on_gpu(const Tensor& host) { return host.to(Device::kCUDA, MemCategory::kCommunication); }

Tensor gpu_zeros(const Shape& shape, DType dtype) {
  return Tensor::zeros(shape, dtype, MemCategory::kCommunication, "out", Device::kCUDA);
}

// A device tensor back on the host, after a bounded wait for the NCCL work queued before it.
Tensor on_host(const Tensor& dev, NcclCommunicator& nccl) {
  nccl.synchronize();
  return dev.to(Device::kCPU);
}

// Waits up to 30 s for an aborted communicator's kernels to leave `stream`; true once they have.
bool stream_drains(cudaStream_t stream) {
  const auto start = Clock::now();
  while (cudaStreamQuery(stream) == cudaErrorNotReady && seconds_since(start) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cudaStreamQuery(stream) == cudaSuccess;
}

NcclCommunicator& nccl_of(const std::unique_ptr<Communicator>& c) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(c.get());
  TANDEM_ASSERT(nccl != nullptr, "subgroup of an NCCL communicator is not an NCCL communicator");
  return *nccl;
}

// Data that only moved: every element equal, bit for bit.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  if (got.numel() == 0) return;
  const int64_t width = dtype_size(got.dtype());
  const auto* a = static_cast<const char*>(got.raw_data());
  const auto* b = static_cast<const char*>(want.raw_data());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(a + i * width, b + i * width, static_cast<size_t>(width)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.numel() << " is "
                    << element(got, i) << ", MPI gives " << element(want, i);
      return;
    }
  }
}

// Sums over `ranks` ranks of values in [-1, 1] (integers: exactly): NCCL may add in another
// order than MPI and rounds to the dtype after each addition, |error| <= (ranks - 1) u (|want| +
// ranks), u the dtype's unit roundoff; the bf16 oracle is the f32 sum of the bf16 values.
void expect_close_sums(const Tensor& got, const Tensor& want, DType dtype, int ranks,
                       const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double u = 0;
  if (dtype == DType::kBF16) u = 0x1p-8;
  if (dtype == DType::kF32) u = 0x1p-24;
  if (dtype == DType::kF64) u = 0x1p-53;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g_i = element(got, i), w_i = element(want, i);
    const double bound = (ranks - 1) * u * (std::fabs(w_i) + ranks);
    if (!(std::fabs(g_i - w_i) <= bound)) {
      ADD_FAILURE() << what << ": element " << i << " is " << g_i << ", MPI gives " << w_i
                    << " (bound " << bound << ")";
      return;
    }
  }
}

// --- One check per operation, on any pair of groups of the same ranks (MPI oracle, NCCL). ---

// Each rank sends to the next group rank and receives from the previous one. Even ranks send
// first and odd ranks receive first: an NCCL send waits for its receive (Note [NCCL matching]).
void check_ring(Communicator& mpi, NcclCommunicator& nccl, DType dt, int64_t numel, bool use_isend,
                const std::string& what) {
  const int r = mpi.rank(), n = mpi.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const Tensor mine = pattern({numel}, dt, what);
  Tensor want = Tensor::empty({numel}, dt, MemCategory::kOther, "want");
  auto sent = mpi.isend(mine, next, 5);
  mpi.recv(want, prev, 5);
  sent->wait();

  const Tensor d_mine = on_gpu(mine);
  const Tensor d_got = gpu_zeros({numel}, dt);
  std::unique_ptr<PendingSend> pending;
  auto send = [&] {
    if (use_isend)
      pending = nccl.isend(d_mine, next, 5);
    else
      nccl.send(d_mine, next, 5);
  };
  if (r % 2 == 0) send();
  nccl.recv(d_got, prev, 5);
  if (r % 2 == 1) send();
  if (pending) {
    pending->wait();
    pending->wait();  // a second wait returns at once
  }
  expect_same_bits(on_host(d_got, nccl), want, what);
}

// rows(src -> dst): uneven, and zero for some pairs (1 -> 0 with two ranks); or all zero.
int64_t rows_between(int src, int dst, bool all_zero) {
  return all_zero ? 0 : ((src + 1) * (dst + 2) + src) % 5;
}

void check_all_to_all(Communicator& mpi, NcclCommunicator& nccl, DType dt, bool all_zero,
                      const std::string& what) {
  const int r = mpi.rank(), n = mpi.size();
  constexpr int64_t kWidth = 7;
  std::vector<int64_t> send_rows(n), recv_rows(n);
  for (int p = 0; p < n; ++p) {
    send_rows[p] = rows_between(r, p, all_zero);
    recv_rows[p] = rows_between(p, r, all_zero);
  }
  const int64_t sent = std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0});
  const int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  const Tensor in = pattern({sent, kWidth}, dt, what);
  Tensor want = Tensor::zeros({received, kWidth}, dt, MemCategory::kOther, "want");
  mpi.all_to_all_v(want, recv_rows, in, send_rows);

  const Tensor d_in = on_gpu(in);
  const Tensor d_out = gpu_zeros({received, kWidth}, dt);
  nccl.all_to_all_v(d_out, recv_rows, d_in, send_rows);
  expect_same_bits(on_host(d_out, nccl), want, what);
}

void check_all_reduce(Communicator& mpi, NcclCommunicator& nccl, DType dt,
                      const std::string& what) {
  const Tensor mine = pattern({1003}, dt, what);
  Tensor want = dt == DType::kBF16 ? as_f32(mine) : mine.to(Device::kCPU);
  mpi.all_reduce_sum(want);
  const Tensor d = on_gpu(mine);
  nccl.all_reduce_sum(d);
  expect_close_sums(on_host(d, nccl), want, dt, mpi.size(), what);
}

void check_reduce_scatter(Communicator& mpi, NcclCommunicator& nccl, DType dt,
                          const std::string& what) {
  const int n = mpi.size();
  const Tensor in = pattern({n * 6, 2}, dt, what);
  const Tensor in_oracle = dt == DType::kBF16 ? as_f32(in) : in;
  Tensor want = Tensor::empty({6, 2}, in_oracle.dtype(), MemCategory::kOther, "want");
  mpi.reduce_scatter_sum(want, in_oracle);
  const Tensor d_in = on_gpu(in);
  const Tensor d_out = gpu_zeros({6, 2}, dt);
  nccl.reduce_scatter_sum(d_out, d_in);
  expect_close_sums(on_host(d_out, nccl), want, dt, n, what);
}

void check_all_gather(Communicator& mpi, NcclCommunicator& nccl, DType dt,
                      const std::string& what) {
  const int n = mpi.size();
  const Tensor in = pattern({5, 3}, dt, what);
  Tensor want = Tensor::empty({n * 5, 3}, dt, MemCategory::kOther, "want");
  mpi.all_gather(want, in);
  const Tensor d_in = on_gpu(in);
  const Tensor d_out = gpu_zeros({n * 5, 3}, dt);
  nccl.all_gather(d_out, d_in);
  expect_same_bits(on_host(d_out, nccl), want, what);
}

void check_broadcast(Communicator& mpi, NcclCommunicator& nccl, DType dt, int root,
                     const std::string& what) {
  const Tensor mine = pattern({257}, dt, what);  // differs per rank: only the root's survives
  Tensor want = mine.to(Device::kCPU);
  mpi.broadcast(want, root);
  const Tensor d = on_gpu(mine);
  nccl.broadcast(d, root);
  expect_same_bits(on_host(d, nccl), want, what);
}

// Every operation on one pair of groups, for the main dtypes.
void check_every_operation(Communicator& mpi, NcclCommunicator& nccl, const std::string& group) {
  for (DType dt : kMainDTypes) {
    const std::string at = concat(group, " ", dtype_name(dt));
    if (mpi.size() > 1) check_ring(mpi, nccl, dt, 333, /*use_isend=*/false, at + " ring");
    check_all_to_all(mpi, nccl, dt, /*all_zero=*/false, at + " all_to_all_v");
    check_all_reduce(mpi, nccl, dt, at + " all_reduce_sum");
    check_reduce_scatter(mpi, nccl, dt, at + " reduce_scatter_sum");
    check_all_gather(mpi, nccl, dt, at + " all_gather");
    for (int root = 0; root < mpi.size(); ++root) {
      check_broadcast(mpi, nccl, dt, root, concat(at, " broadcast from ", root));
    }
  }
  nccl.barrier();
}

// --- Tests. Each enqueues on the communication stream, as the executor will. ---

TEST(Nccl, MirrorsTheMpiGroup) {
  EXPECT_EQ(g.nccl->rank(), g.mpi->rank());
  EXPECT_EQ(g.nccl->size(), g.mpi->size());
  EXPECT_EQ(g.nccl->name(), g.mpi->name());
  EXPECT_EQ(&g.nccl->mpi_group(), g.mpi);
  EXPECT_FALSE(g.nccl->aborted());
}

TEST(Nccl, SendRecvRingMatchesMpi) {
  cuda::StreamScope on_comm(g.stream);
  for (DType dt : kAllDTypes) {
    check_ring(*g.mpi, *g.nccl, dt, 1000, /*use_isend=*/false, concat("ring ", dtype_name(dt)));
  }
  check_ring(*g.mpi, *g.nccl, DType::kF32, 0, false, "empty ring");  // nothing moves
}

TEST(Nccl, IsendWaitMatchesMpi) {
  cuda::StreamScope on_comm(g.stream);
  // 4 MiB of f32: more than NCCL's buffers, so the send really waits for its receive.
  for (DType dt : kMainDTypes) {
    check_ring(*g.mpi, *g.nccl, dt, int64_t{1} << 20, /*use_isend=*/true,
               concat("isend ", dtype_name(dt)));
  }
}

TEST(Nccl, AllToAllVUnevenAndZeroRowsMatchesMpi) {
  cuda::StreamScope on_comm(g.stream);
  for (DType dt : kAllDTypes) {
    check_all_to_all(*g.mpi, *g.nccl, dt, false, concat("all_to_all_v ", dtype_name(dt)));
    check_all_to_all(*g.mpi, *g.nccl, dt, true, concat("empty all_to_all_v ", dtype_name(dt)));
  }
}

TEST(Nccl, AllReduceSumMatchesMpi) {
  cuda::StreamScope on_comm(g.stream);
  for (DType dt : kAllDTypes) {
    check_all_reduce(*g.mpi, *g.nccl, dt, concat("all_reduce_sum ", dtype_name(dt)));
  }
}

TEST(Nccl, ReduceScatterSumMatchesMpi) {
  cuda::StreamScope on_comm(g.stream);
  for (DType dt : kAllDTypes) {
    check_reduce_scatter(*g.mpi, *g.nccl, dt, concat("reduce_scatter_sum ", dtype_name(dt)));
  }
}

TEST(Nccl, AllGatherMatchesMpi) {
  cuda::StreamScope on_comm(g.stream);
  for (DType dt : kAllDTypes) {
    check_all_gather(*g.mpi, *g.nccl, dt, concat("all_gather ", dtype_name(dt)));
  }
}

TEST(Nccl, BroadcastFromEachRootMatchesMpi) {
  cuda::StreamScope on_comm(g.stream);
  for (int root = 0; root < g.mpi->size(); ++root) {
    for (DType dt : kAllDTypes) {
      check_broadcast(*g.mpi, *g.nccl, dt, root,
                      concat("broadcast ", dtype_name(dt), " from ", root));
    }
  }
}

TEST(Nccl, TensorsFromAnotherStreamAreRecorded) {
  // Tensors of the default stream, moved on the communication stream and freed on the default
  // stream at once: the NCCL call recorded its stream's use, so the allocator hands the blocks
  // out again only after the all-gather (Note [NCCL completion]); what it gathered is intact.
  cuda::StreamScope on_comm(g.stream);
  const int n = g.mpi->size();
  const Tensor in = pattern({1 << 16}, DType::kF32, "other stream");
  Tensor want = Tensor::empty({n << 16}, DType::kF32, MemCategory::kOther, "want");
  g.mpi->all_gather(want, in);
  Tensor d_in, d_out;
  {
    cuda::StreamScope on_default(cuda::default_stream());
    d_in = on_gpu(in);  // the copy has finished when on_gpu returns
    d_out = gpu_zeros({n << 16}, DType::kF32);
    cuda::synchronize_current();
  }
  g.nccl->all_gather(d_out, d_in);
  {
    cuda::StreamScope on_default(cuda::default_stream());
    d_in = Tensor();
    const Tensor reuse = gpu_zeros({1 << 16}, DType::kF32);  // may not take d_in's block yet
    const Tensor clobber = on_gpu(pattern({1 << 16}, DType::kF32, "clobber"));
    cuda::synchronize_current();
  }
  expect_same_bits(on_host(d_out, *g.nccl), want, "all_gather of default-stream tensors");
}

TEST(Nccl, BarrierWaitsForEveryRankAndTheStream) {
  cuda::StreamScope on_comm(g.stream);
  const Tensor big = gpu_zeros({int64_t{16} << 20}, DType::kF32);  // 64 MiB to sum first
  g.mpi->barrier();
  const auto start = Clock::now();
  if (g.mpi->rank() == g.mpi->size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  g.nccl->all_reduce_sum(big);
  g.nccl->barrier();
  EXPECT_EQ(cudaStreamQuery(g.stream), cudaSuccess) << "work before the barrier is still running";
  if (g.mpi->rank() == 0) {
    EXPECT_GE(seconds_since(start), 0.25) << "the barrier did not wait for the last rank";
  }
}

TEST(Nccl, AllGatherBytesGoesThroughMpi) {
  const std::string mine(static_cast<size_t>(g.mpi->rank()) + 3,
                         static_cast<char>('a' + g.mpi->rank()));
  EXPECT_EQ(g.nccl->all_gather_bytes(mine), g.mpi->all_gather_bytes(mine));
}

TEST(Nccl, SubgroupOfOneRank) {
  cuda::StreamScope on_comm(g.stream);
  const int r = g.mpi->rank();
  auto mpi = g.mpi->subgroup({r}, "self");
  auto nccl = g.nccl->subgroup({r}, "self");
  EXPECT_EQ(nccl->size(), 1);
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->name(), "self");
  check_every_operation(*mpi, nccl_of(nccl), "self");
}

TEST(Nccl, SubgroupOfEveryRankInReverseOrder) {
  cuda::StreamScope on_comm(g.stream);
  const int r = g.mpi->rank(), n = g.mpi->size();
  std::vector<int> reversed(n);
  for (int i = 0; i < n; ++i) reversed[i] = n - 1 - i;
  auto mpi = g.mpi->subgroup(reversed, "reversed");
  auto nccl = g.nccl->subgroup(reversed, "reversed");
  EXPECT_EQ(nccl->size(), n);
  EXPECT_EQ(nccl->rank(), n - 1 - r);  // group rank 0 is world rank n - 1
  check_every_operation(*mpi, nccl_of(nccl), "reversed");
}

TEST(Nccl, BadArgumentsThrowBeforeAnythingIsEnqueued) {
  cuda::StreamScope on_comm(g.stream);
  NcclCommunicator& c = *g.nccl;
  const int r = c.rank(), n = c.size(), peer = (r + 1) % n;
  const Tensor host = Tensor::zeros({4}, DType::kF32, MemCategory::kOther, "host");
  const Tensor d4 = gpu_zeros({4}, DType::kF32), d8 = gpu_zeros({4 * n + 1}, DType::kF32);
  const Tensor rows = gpu_zeros({3, 4}, DType::kF32), rows5 = gpu_zeros({3, 5}, DType::kF32);
  const Tensor i4 = gpu_zeros({4}, DType::kI32);
  auto expect_error = [](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { c.send(host, peer, 0); }, "is on the CPU");
  expect_error([&] { c.recv(d4, r, 0); }, "itself");
  expect_error([&] { c.send(d4, n, 0); }, "is not a rank of this group");
  expect_error([&] { c.send(d4, peer, -1); }, "non-negative");
  expect_error([&] { c.all_reduce_sum(Tensor()); }, "undefined");
  expect_error([&] { c.all_gather(d8, d4); }, "must hold");
  expect_error([&] { c.all_gather(i4, d4); }, "one dtype");
  expect_error([&] { c.reduce_scatter_sum(d4, d8); }, "must hold");
  expect_error([&] { c.broadcast(d4, -1); }, "root -1");
  const std::vector<int64_t> ok(n, 0), short_list(n + 1, 0);
  std::vector<int64_t> negative(n, 0), too_many(n, 0);
  negative[0] = -1;
  too_many[0] = 4;
  expect_error([&] { c.all_to_all_v(rows, ok, rows, short_list); }, "counts for a group");
  expect_error([&] { c.all_to_all_v(rows, ok, rows, negative); }, "non-negative");
  expect_error([&] { c.all_to_all_v(rows, too_many, rows, ok); }, "adds up to 4 rows");
  expect_error([&] { c.all_to_all_v(rows5, ok, rows, ok); }, "hold");
  EXPECT_FALSE(c.aborted());
  check_all_reduce(*g.mpi, c, DType::kF32, "all_reduce_sum after bad arguments");
}

// Rank 1 never posts its receive: rank 0's bounded wait throws within the timeout and a little,
// naming the operation and the group, and aborts that group's communicator (a group of its own,
// so the world's stays usable). Both ranks then meet on MPI and finish.
TEST(Nccl, UnmatchedSendTimesOutNamingTheOperationAndGroup) {
  cuda::StreamScope on_comm(g.stream);
  constexpr double kTimeout = 5, kSlack = 15;
  const int r = g.mpi->rank(), n = g.mpi->size();
  std::vector<int> everyone(n);
  std::iota(everyone.begin(), everyone.end(), 0);
  auto group =
      std::make_unique<NcclCommunicator>(g.mpi->subgroup(everyone, "timeout-test"), kTimeout);
  // A first message connects ranks 0 and 1, so the wait below is on a running kernel.
  const Tensor small = gpu_zeros({16}, DType::kF32);
  if (r == 0) group->send(small, 1, 0);
  if (r == 1) group->recv(small, 0, 0);
  group->synchronize();
  g.mpi->barrier();
  if (r == 0) {
    const Tensor big = gpu_zeros({int64_t{64} << 20}, DType::kF32);  // 256 MiB: never buffered
    std::string message;
    const auto start = Clock::now();
    try {
      auto pending = group->isend(big, 1, 0);
      pending->wait();
    } catch (const Error& e) {
      message = e.what();
    }
    const double took = seconds_since(start);
    EXPECT_NE(message.find("send to rank 1"), std::string::npos) << message;
    EXPECT_NE(message.find("group 'timeout-test'"), std::string::npos) << message;
    EXPECT_NE(message.find("did not complete within 5 s"), std::string::npos) << message;
    EXPECT_GE(took, kTimeout) << message;
    EXPECT_LT(took, 2 * kTimeout + kSlack) << message;  // enqueueing and waiting, each bounded
    EXPECT_TRUE(group->aborted());
    EXPECT_THROW(group->barrier(), Error);  // at once: the group is gone
    EXPECT_TRUE(stream_drains(g.stream)) << "the aborted send still runs";
  }
  g.mpi->barrier();  // rank 1 waits here, its receive never posted
  group.reset();     // rank 1 finalizes an idle communicator (bounded too)
  g.mpi->barrier();
  EXPECT_FALSE(g.nccl->aborted());
  check_all_reduce(*g.mpi, *g.nccl, DType::kF32, "world all_reduce_sum after the timeout");
}

// Note [Who did not arrive]: the last world rank never enqueues the group's second all-reduce.
// The others' bounded wait throws within the timeout and a little, naming it by group rank (the
// group lists the world in reverse: it is rank 0) and world rank, and aborts the group's
// communicator. Then every rank meets on MPI.
TEST(Nccl, RankMissingFromACollectiveIsNamed) {
  cuda::StreamScope on_comm(g.stream);
  constexpr double kTimeout = 5, kSlack = 15;
  const int r = g.mpi->rank(), n = g.mpi->size();
  std::vector<int> reversed(n);
  for (int i = 0; i < n; ++i) reversed[i] = n - 1 - i;
  auto group =
      std::make_unique<NcclCommunicator>(g.mpi->subgroup(reversed, "arrivals-test"), kTimeout);
  // A first all-reduce on every rank connects them, so the wait below is on a running kernel.
  const Tensor sum = gpu_zeros({16}, DType::kF32);
  group->all_reduce_sum(sum);
  group->synchronize();
  g.mpi->barrier();
  if (r != n - 1) {
    std::string message;
    const auto start = Clock::now();
    try {
      group->all_reduce_sum(sum);
      group->synchronize();
    } catch (const Error& e) {
      message = e.what();
    }
    const double took = seconds_since(start);
    EXPECT_NE(message.find(concat("not arrived: rank 0 (world rank ", n - 1, ") (stopped")),
              std::string::npos)
        << message;
    const std::string me = concat("rank ", n - 1 - r, " (world rank ", r, ")");
    EXPECT_NE(message.find(me + " of NCCL group 'arrivals-test'"), std::string::npos) << message;
    EXPECT_GE(took, kTimeout) << message;
    EXPECT_LT(took, 2 * kTimeout + kSlack) << message;  // enqueueing and waiting, each bounded
    EXPECT_TRUE(group->aborted());
    EXPECT_TRUE(stream_drains(g.stream)) << "the aborted all-reduce still runs";
  }
  g.mpi->barrier();  // the last rank waits here
  group.reset();
  g.mpi->barrier();
  EXPECT_FALSE(g.nccl->aborted());
}

// Ranks other than 0 print only their failures, each line with its rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace tandem::comm

int main(int argc, char** argv) {
  using namespace tandem;
  ::testing::InitGoogleTest(&argc, argv);
  // NVLink multicast (NVLS) stays off unless the caller chose otherwise: on shared hosts it can
  // take the GPUs out of service.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  comm::mpi_initialize(&argc, &argv);
  int failed = 1;
  try {
    auto world = comm::mpi_world(120.0);
    const int rank = world->rank(), gpu = comm::local_rank();
    // Every rank needs its own GPU; all of them agree before any touches NCCL.
    Tensor missing = Tensor::empty({1}, DType::kI32, MemCategory::kOther, "missing");
    missing.data<int32_t>()[0] = cuda::device_count() > gpu ? 0 : 1;
    world->all_reduce_sum(missing);
    if (world->size() < 2 || missing.data<int32_t>()[0] > 0) {
      if (rank == 0) {
        std::fprintf(stderr,
                     "test_nccl needs two or more ranks with one GPU each: mpirun -np 2 "
                     "test_nccl (%d rank(s); %d without a GPU)\n",
                     world->size(), missing.data<int32_t>()[0]);
      }
      world.reset();
      comm::mpi_finalize();
      return 1;
    }
    cuda::initialize(gpu);
    std::printf("test_nccl: rank %d of %d on GPU %d: %s, %s\n", rank, world->size(), gpu,
                cuda::device_description().c_str(), comm::nccl_version().c_str());
    cudaStream_t stream = nullptr;  // never destroyed: blocks recorded on it may outlive us
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto nccl = comm::make_nccl_communicator(*world, 120.0);
    comm::g = {world.get(), nccl.get(), stream};
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new comm::FailurePrinter(rank));
    }
    failed = RUN_ALL_TESTS();
    comm::g = {};
    nccl.reset();
    world.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_nccl: error: %s\n", e.what());
    comm::mpi_finalize();
    return 1;
  }
  comm::mpi_finalize();
  return failed;
}
