// The process-wide CUDA context (context.h).
#include "core/cuda/context.h"

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/cuda_allocator.h"
#include "core/cuda/wait.h"
#include "core/device.h"
#include "core/host_read.h"

namespace tandem::cuda {

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper

struct Context {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  int sms = 0;
  std::mutex mutex;
  std::map<cudaStream_t, void*> workspaces;
};

Context& context() {
  static Context* c = new Context();  // never destroyed: tensors may outlive main's statics
  return *c;
}

thread_local cudaStream_t t_stream = nullptr;
thread_local bool t_stream_set = false;

void zero_hook(void* ptr, size_t bytes) {
  TANDEM_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, current_stream()));
}

void copy_hook(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (dst_device == Device::kCPU && src_device == Device::kCPU)
    kind = cudaMemcpyHostToHost;
  else if (dst_device == Device::kCPU)
    kind = cudaMemcpyDeviceToHost;
  else if (src_device == Device::kCPU)
    kind = cudaMemcpyHostToDevice;
  const cudaStream_t s = current_stream();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  // Note [Host copies]: the host side of a copy may go away (or be read) as soon as we return.
  // A copy to the host must have landed, so it waits for the stream. A copy from the host does
  // not: our host memory is pageable, and cudaMemcpyAsync from pageable memory has read (staged)
  // the source before it returns, so the host stays free to run ahead of the GPU (a wait here
  // for every batch of token ids would drain the GPU's queue once per micro-batch).
  if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost) {
    wait_stream(s, "a copy to the host");  // Note [Bounded waits on the GPU]
  }
}

// HostRead's device side (Note [Reads to the host ahead of use] in core/host_read.h): a pool
// of pinned buffers, each with an event recorded after its copy. A ticket is a slot's address.
struct ReadSlot {
  void* pinned = nullptr;
  cudaEvent_t done = nullptr;
};

std::mutex g_read_mutex;
std::vector<ReadSlot*> g_free_reads;     // never freed: slots outlive main's statics
std::vector<ReadSlot*> g_dropped_reads;  // dropped before their copy landed: pooled once it has

// Dropped slots whose copy has landed, back to the pool (the caller holds g_read_mutex).
void pool_landed_drops() {
  std::erase_if(g_dropped_reads, [](ReadSlot* slot) {
    if (cudaEventQuery(slot->done) != cudaSuccess) return false;
    g_free_reads.push_back(slot);
    return true;
  });
}

uint64_t start_read_hook(const void* src, size_t bytes) {
  ReadSlot* slot = nullptr;
  {
    std::lock_guard lock(g_read_mutex);
    pool_landed_drops();
    if (!g_free_reads.empty()) {
      slot = g_free_reads.back();
      g_free_reads.pop_back();
    }
  }
  if (slot == nullptr) {
    slot = new ReadSlot;
    TANDEM_CUDA_CHECK(cudaMallocHost(&slot->pinned, HostRead::kMaxBytes));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming));
  }
  const cudaStream_t s = current_stream();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(slot->pinned, src, bytes, cudaMemcpyDeviceToHost, s));
  TANDEM_CUDA_CHECK(cudaEventRecord(slot->done, s));
  return reinterpret_cast<uint64_t>(slot);
}

void release_read(ReadSlot* slot) {
  std::lock_guard lock(g_read_mutex);
  g_free_reads.push_back(slot);
}

void finish_read_hook(uint64_t ticket, void* dst, size_t bytes) {
  auto* slot = reinterpret_cast<ReadSlot*>(ticket);
  // Past the limit this throws and the slot stays out of the pool: its copy may land later.
  wait_event(slot->done, "a value read back to the host");  // Note [Bounded waits on the GPU]
  std::memcpy(dst, slot->pinned, bytes);
  release_read(slot);
}

void drop_read_hook(uint64_t ticket) {
  auto* slot = reinterpret_cast<ReadSlot*>(ticket);
  // The copy may still be writing the buffer: the slot is reused only after it lands. No wait
  // here (a drop runs while unwinding too, maybe from a wait that timed out).
  std::lock_guard lock(g_read_mutex);
  g_dropped_reads.push_back(slot);
  pool_landed_drops();
}

void* host_alloc_hook(size_t bytes) {
  void* p = nullptr;
  const cudaError_t status = cudaMallocHost(&p, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    TANDEM_CHECK(false, "cannot page-lock ", bytes,
                 " bytes of host memory for offloaded "
                 "activations (",
                 cudaGetErrorString(status),
                 "): offload fewer nodes "
                 "(--offload-activations) or free host memory");
  }
  return p;
}

void host_free_hook(void* ptr) { (void)cudaFreeHost(ptr); }

void copy_async_hook(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t bytes) {
  const cudaMemcpyKind kind = dst_device == Device::kCPU   ? cudaMemcpyDeviceToHost
                              : src_device == Device::kCPU ? cudaMemcpyHostToDevice
                                                           : cudaMemcpyDeviceToDevice;
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, current_stream()));
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void initialize(int device_index) {
  Context& c = context();
  std::lock_guard lock(c.mutex);
  if (c.device == device_index) return;
  TANDEM_CHECK(c.device < 0, "CUDA is already initialised on GPU ", c.device,
               "; one process uses one GPU");
  const int n = device_count();
  TANDEM_CHECK(device_index >= 0 && device_index < n, "GPU ", device_index,
               " does not exist: this machine has ", n, " visible GPU(s)");
  TANDEM_CUDA_CHECK(cudaSetDevice(device_index));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  TANDEM_CUBLAS_CHECK(cublasLtCreate(&c.lt));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, device_index));
  c.device = device_index;
  DeviceBackend backend;
  backend.allocator = &cuda_allocator();
  backend.zero = zero_hook;
  backend.copy = copy_hook;
  backend.synchronize = [] { wait_device("the work enqueued so far"); };
  backend.start_read = start_read_hook;
  backend.finish_read = finish_read_hook;
  backend.drop_read = drop_read_hook;
  backend.host_alloc = host_alloc_hook;
  backend.host_free = host_free_hook;
  backend.copy_async = copy_async_hook;
  register_device_backend(Device::kCUDA, backend);
}

bool initialized() { return context().device >= 0; }

std::string device_description() {
  const Context& c = context();
  if (c.device < 0) return "no GPU initialised";
  cudaDeviceProp prop{};
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, c.device));
  std::ostringstream out;
  out << prop.name << " (sm_" << prop.major << prop.minor << ", "
      << static_cast<double>(prop.totalGlobalMem) / double(1 << 30) << " GiB, "
      << prop.multiProcessorCount << " SMs)";
  return out.str();
}

int64_t free_device_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

cudaStream_t default_stream() {
  TANDEM_CHECK(initialized(), "CUDA is not initialised: call cuda::initialize() first");
  return context().stream;
}

thread_local bool t_device_set = false;

cudaStream_t current_stream() {
  // Every thread that enqueues work (the comm worker too) works on this process's GPU.
  if (!t_device_set) {
    TANDEM_CHECK(initialized(), "CUDA is not initialised: call cuda::initialize() first");
    TANDEM_CUDA_CHECK(cudaSetDevice(context().device));
    t_device_set = true;
  }
  return t_stream_set ? t_stream : default_stream();
}

StreamScope::StreamScope(cudaStream_t stream) : previous_(t_stream_set ? t_stream : nullptr) {
  t_stream = stream;
  t_stream_set = true;
}

StreamScope::~StreamScope() {
  t_stream = previous_;
  t_stream_set = previous_ != nullptr;
}

void synchronize_current() { wait_stream(current_stream(), "the current stream's work"); }

cublasLtHandle_t cublaslt_handle() {
  TANDEM_CHECK(initialized(), "CUDA is not initialised: call cuda::initialize() first");
  return context().lt;
}

void* cublaslt_workspace(cudaStream_t stream) {
  Context& c = context();
  std::lock_guard lock(c.mutex);
  auto it = c.workspaces.find(stream);
  if (it != c.workspaces.end()) return it->second;
  void* p = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&p, kWorkspaceBytes));
  c.workspaces.emplace(stream, p);
  return p;
}

size_t cublaslt_workspace_bytes() { return kWorkspaceBytes; }

int multiprocessor_count() { return context().sms; }

}  // namespace tandem::cuda
