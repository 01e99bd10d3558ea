// Argument checks shared by the CUDA ops (common.h).
#include "ops/cuda/common.h"

#include <map>
#include <sstream>

#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::ostringstream out;
  size_t i = 0;
  for (DType d : dtypes) out << (i++ ? " or " : "") << dtype_name(d);
  return out.str();
}

}  // namespace

void expect_cuda_rank(const char* op, const char* name, const Tensor& t,
                      std::initializer_list<DType> dtypes, int64_t rank) {
  TANDEM_CHECK(t.defined(), op, ": tensor '", name, "' is undefined");
  TANDEM_CHECK(t.device() == Device::kCUDA, op, ": tensor '", name,
               "' is on the CPU; every tensor of a CUDA op must be on the GPU");
  TANDEM_CHECK(!t.released(), op, ": tensor '", name, "' was released");
  bool ok = false;
  for (DType d : dtypes) ok = ok || d == t.dtype();
  TANDEM_CHECK(ok, op, ": tensor '", name, "' is ", dtype_name(t.dtype()), ", expected ",
               dtype_list(dtypes));
  TANDEM_CHECK(rank < 0 || t.dim() == rank, op, ": tensor '", name, "' has shape ",
               shape_str(t.shape()), ", expected rank ", rank);
}

void expect_cuda(const char* op, const char* name, const Tensor& t,
                 std::initializer_list<DType> dtypes, const Shape& shape) {
  expect_cuda_rank(op, name, t, dtypes, -1);
  TANDEM_CHECK(t.shape() == shape, op, ": tensor '", name, "' has shape ", shape_str(t.shape()),
               ", expected ", shape_str(shape));
}

// ---- Note [Lanes] ----

namespace {

// The side lanes' streams and events of one parent stream, made on the parent's first use (one
// GPU per process, one host thread issuing GPU work). mark: the fork point on the parent;
// done[l]: lane l's join point. Each parent has lanes of its own, so the work of two compute
// streams (Note [A stream pair per half] in runtime/combined.cc) never queues on one lane.
struct LaneState {
  cudaStream_t streams[Lanes::kMaxLanes] = {};
  cudaEvent_t done[Lanes::kMaxLanes] = {};
  cudaEvent_t mark = nullptr;
};

// The current stream's lanes: fork, run and join are all called with the parent current.
LaneState& lanes() {
  // Lives as long as the process, as the context's streams do.
  static auto* by_parent = new std::map<cudaStream_t, LaneState>;
  const cudaStream_t parent = tandem::cuda::current_stream();
  auto [it, fresh] = by_parent->try_emplace(parent);
  LaneState& s = it->second;
  if (fresh) {
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&s.mark, cudaEventDisableTiming));
    for (int l = 1; l < Lanes::kMaxLanes; ++l) {
      TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s.streams[l], cudaStreamNonBlocking));
      TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&s.done[l], cudaEventDisableTiming));
    }
  }
  return s;
}

void check_lane(int lane) {
  TANDEM_ASSERT(lane >= 1 && lane < Lanes::kMaxLanes, "lane ", lane, " is not a side lane");
}

}  // namespace

void lane_mark() {
  TANDEM_CUDA_CHECK(cudaEventRecord(lanes().mark, tandem::cuda::current_stream()));
}

void lane_fork(int lane) {
  check_lane(lane);
  LaneState& s = lanes();
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(s.streams[lane], s.mark, 0));
}

void lane_run(int lane, const std::function<void()>& fn) {
  check_lane(lane);
  tandem::cuda::StreamScope on(lanes().streams[lane]);
  fn();
}

void lane_join(int lane) {
  check_lane(lane);
  LaneState& s = lanes();
  TANDEM_CUDA_CHECK(cudaEventRecord(s.done[lane], s.streams[lane]));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(tandem::cuda::current_stream(), s.done[lane], 0));
}

}  // namespace tandem::ops::cuda
