// The CUDA caching allocator: device memory from cudaMalloc, cached and reused per stream, with
// PyTorch's record_stream rule for blocks used on more than one stream. Invariant: a block is
// handed out only on its segment's stream, and only once every other stream that used it has
// passed an event recorded at its free.
//
// Note [Caching allocator]
// - Sizes. A request is rounded up to 512 bytes. Small requests (<= 1 MiB) are carved from 2 MiB
//   segments; large ones from 20 MiB segments when under 10 MiB, else from a segment of their own
//   rounded up to 2 MiB. This is PyTorch's scheme: small tensors (norm statistics, router
//   indices) share segments instead of costing a cudaMalloc each, and large ones waste at most
//   2 MiB. The statistics never see the rounding: they count the requested bytes, per category,
//   exactly as the CPU allocator does (Note [Memory categories]); reserved_bytes() is the
//   driver's side.
// - Reuse. Free blocks sit in two pools (small, large) ordered by (stream, size, address); an
//   allocation takes the smallest free block of its stream that fits (best fit) and splits off
//   the rest when it is worth keeping (>= 512 bytes small, > 1 MiB large). A freed block merges
//   with free neighbours of its segment, so a segment whose tensors are all gone is whole again.
// - Streams. A segment belongs to the stream it was first allocated on, and so do all blocks
//   carved from it; an allocation on another stream never gets them. On that stream, a block
//   freed by its own stream is reusable at once: whatever the next owner enqueues runs after
//   the work the last owner enqueued (stream order). Every other stream that touched the block
//   is in its `uses`: record_stream adds one, and deallocate adds the stream it runs on (the
//   calling thread's current stream, Note [Current stream] in context.h). This is how
//   release_storage (core/tensor.h) records the current stream: StorageImpl::release calls
//   deallocate on the releasing thread. At the free, an event is recorded on each stream in
//   `uses` and the block waits, out of the pools, until all of them have completed; allocate
//   polls the pending events (cudaEventQuery) before it looks for a block. Events are pooled.
//   A stream recorded on a block must outlive the block's free (its event is recorded then).
// - Out of memory. When cudaMalloc fails: wait for every pending event (their blocks return to
//   the pools), look again, then wait for the GPU and return every wholly free cached segment of
//   every stream to the driver, and try once more; after that, throw tandem::Error naming the
//   bytes, the tag and what is held. Nothing is counted for a failed allocation.
// - Threads. One mutex guards the pools; the statistics are updated under it, so their order is
//   the order in which blocks change hands.
#include "core/cuda/cuda_allocator.h"

#include <algorithm>
#include <functional>
#include <list>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/wait.h"
#include "core/tensor.h"

namespace tandem::cuda {

namespace {

constexpr size_t kRound = 512;                     // every block is a multiple of this
constexpr size_t kSmallSize = size_t{1} << 20;     // requests up to this are small
constexpr size_t kSmallSegment = size_t{2} << 20;  // small requests share segments this big
constexpr size_t kMidSize = size_t{10} << 20;      // large requests below this share...
constexpr size_t kMidSegment = size_t{20} << 20;   // ... segments this big
constexpr size_t kLargeRound = size_t{2} << 20;    // larger ones get their own, rounded so

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMidSize) return kMidSegment;
  return round_up(size, kLargeRound);
}

struct Block {
  cudaStream_t stream = nullptr;  // its segment's stream: the only one it is handed out on
  size_t size = 0;                // bytes, a multiple of kRound
  char* ptr = nullptr;
  bool small = false;  // from a small segment (lives in the small pool)
  bool allocated = false;
  int pending = 0;        // events recorded at its free that have not completed yet
  Block* prev = nullptr;  // neighbours in the same segment, by address
  Block* next = nullptr;
  std::vector<cudaStream_t> uses;  // streams other than `stream` that used it

  bool in_pool() const { return !allocated && pending == 0; }
  bool whole_segment() const { return prev == nullptr && next == nullptr; }
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return std::less<cudaStream_t>()(a->stream, b->stream);
    if (a->size != b->size) return a->size < b->size;
    return std::less<char*>()(a->ptr, b->ptr);
  }
};
using Pool = std::set<Block*, BlockLess>;

// While the process exits, CUDA may unload before the last static tensor is freed: nothing will
// be reused then, so such a free leaves its block to the driver instead of throwing.
bool shutting_down(cudaError_t status) {
  return status == cudaErrorCudartUnloading || status == cudaErrorContextIsDestroyed;
}

}  // namespace

struct CudaAllocator::State {
  std::mutex mutex;
  Pool small_pool, large_pool;
  std::unordered_map<void*, Block*> live;  // allocated blocks by address
  struct PendingFree {
    cudaEvent_t event;
    Block* block;
    cudaStream_t stream;  // the event's
  };
  std::list<PendingFree> pending;  // events recorded at frees, in the order recorded
  std::vector<cudaEvent_t> spare_events;
  int64_t reserved = 0;
  int64_t peak_reserved = 0;
  size_t total_memory = 0;  // of the GPU; 0 until first needed

  Pool& pool_of(const Block* b) { return b->small ? small_pool : large_pool; }

  Block* take_free(cudaStream_t stream, size_t size, bool small);
  Block* new_segment(cudaStream_t stream, size_t size, bool small);
  Block* find_or_make(cudaStream_t stream, size_t size);
  void split(Block* b, size_t size);
  void free_block(Block* b);
  void add_use(Block* b, cudaStream_t stream);
  void defer_or_free(Block* b);
  void event_completed(cudaEvent_t event, Block* b);
  void process_events();
  void synchronize_events();
  void release_cached_segments();
};

// The smallest free block of `stream` that holds `size` bytes, out of its pool; null if none.
Block* CudaAllocator::State::take_free(cudaStream_t stream, size_t size, bool small) {
  Pool& pool = small ? small_pool : large_pool;
  Block key;
  key.stream = stream;
  key.size = size;
  const auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

// A fresh segment for a `size`-byte block on `stream`, as one block; null when the GPU is full.
Block* CudaAllocator::State::new_segment(cudaStream_t stream, size_t size, bool small) {
  const size_t bytes = segment_size(size);
  if (total_memory == 0) {
    size_t free_bytes = 0;
    TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_memory));
  }
  if (bytes > total_memory) return nullptr;  // no driver call for what can never fit
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so later launch checks do not see it
    return nullptr;
  }
  TANDEM_CUDA_CHECK(status);
  reserved += static_cast<int64_t>(bytes);
  peak_reserved = std::max(peak_reserved, reserved);
  Block* b = new Block;
  b->stream = stream;
  b->size = bytes;
  b->ptr = static_cast<char*>(ptr);
  b->small = small;
  return b;
}

// A block of at least `size` bytes for `stream`, out of every pool (Note [Caching allocator],
// "Out of memory"); null when even an emptied cache leaves too little.
Block* CudaAllocator::State::find_or_make(cudaStream_t stream, size_t size) {
  const bool small = size <= kSmallSize;
  process_events();
  if (Block* b = take_free(stream, size, small)) return b;
  if (Block* b = new_segment(stream, size, small)) return b;
  synchronize_events();
  if (Block* b = take_free(stream, size, small)) return b;
  release_cached_segments();
  return new_segment(stream, size, small);
}

// Keeps the first `size` bytes of free block `b` and returns the rest to the pool as a block of
// its own when it is big enough to be worth it.
void CudaAllocator::State::split(Block* b, size_t size) {
  const size_t rest = b->size - size;
  if (b->small ? rest < kRound : rest <= kSmallSize) return;
  Block* r = new Block;
  r->stream = b->stream;
  r->size = rest;
  r->ptr = b->ptr + size;
  r->small = b->small;
  r->prev = b;
  r->next = b->next;
  if (b->next != nullptr) b->next->prev = r;
  b->next = r;
  b->size = size;
  // r's right neighbour is not in the pool: had it been, it would have merged with b.
  pool_of(r).insert(r);
}

// Returns a block with no pending uses to its pool, merged with its free neighbours.
void CudaAllocator::State::free_block(Block* b) {
  TANDEM_ASSERT(b->in_pool());
  Pool& pool = pool_of(b);
  if (Block* p = b->prev; p != nullptr && p->in_pool()) {
    pool.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (Block* n = b->next; n != nullptr && n->in_pool()) {
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  pool.insert(b);
}

void CudaAllocator::State::add_use(Block* b, cudaStream_t stream) {
  if (stream == b->stream) return;
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) {
    b->uses.push_back(stream);
  }
}

// At a free: pools `b` now when only its own stream used it, else records an event on each
// other stream that did and keeps it pending. While CUDA shuts down, `b` is simply forgotten.
void CudaAllocator::State::defer_or_free(Block* b) {
  std::vector<cudaStream_t> uses = std::move(b->uses);
  b->uses.clear();
  if (uses.empty()) {
    free_block(b);
    return;
  }
  for (cudaStream_t stream : uses) {
    cudaEvent_t event = nullptr;
    if (spare_events.empty()) {
      const cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (shutting_down(status)) return;
      TANDEM_CUDA_CHECK(status);
    } else {
      event = spare_events.back();
      spare_events.pop_back();
    }
    const cudaError_t status = cudaEventRecord(event, stream);
    if (shutting_down(status)) return;
    if (status != cudaSuccess) spare_events.push_back(event);
    TANDEM_CUDA_CHECK(status);
    ++b->pending;
    pending.push_back({event, b, stream});
  }
}

void CudaAllocator::State::event_completed(cudaEvent_t event, Block* b) {
  spare_events.push_back(event);
  if (--b->pending == 0) free_block(b);
}

// Pools every pending block whose events have all completed; never waits. Runs at every
// allocation, so it asks as little as it can: a stream completes its events in the order they
// were recorded, so past the first of a stream's events that has not completed, none of its
// later ones has either and they are not asked about. (With expert parallelism each layer's
// tensors carry an event for the communication stream: asking about every pending event would
// cost the host more than issuing the work itself.)
void CudaAllocator::State::process_events() {
  std::vector<cudaStream_t> behind;  // streams with an event not yet completed
  for (auto it = pending.begin(); it != pending.end();) {
    if (std::find(behind.begin(), behind.end(), it->stream) != behind.end()) {
      ++it;
      continue;
    }
    const cudaError_t status = cudaEventQuery(it->event);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error: leave none behind
      behind.push_back(it->stream);
      ++it;
      continue;
    }
    TANDEM_CUDA_CHECK(status);
    event_completed(it->event, it->block);
    it = pending.erase(it);
  }
}

// Waits for every pending event and pools its block.
void CudaAllocator::State::synchronize_events() {
  while (!pending.empty()) {
    const PendingFree p = pending.front();
    wait_event(p.event, "the work that last used memory being freed");
    pending.pop_front();
    event_completed(p.event, p.block);
  }
}

// Returns every wholly free segment (of every stream) to the driver.
void CudaAllocator::State::release_cached_segments() {
  std::vector<Block*> whole;
  for (Pool* pool : {&small_pool, &large_pool}) {
    for (Block* b : *pool) {
      if (b->whole_segment()) whole.push_back(b);
    }
  }
  if (whole.empty()) return;
  // A block freed on its own stream may still be in use by work enqueued there before the free.
  wait_device("the work that last used cached memory");
  for (Block* b : whole) {
    pool_of(b).erase(b);
    TANDEM_CUDA_CHECK(cudaFree(b->ptr));
    reserved -= static_cast<int64_t>(b->size);
    delete b;
  }
}

CudaAllocator::CudaAllocator() : state_(std::make_unique<State>()) {}
CudaAllocator::~CudaAllocator() = default;

void* CudaAllocator::allocate(int64_t bytes, MemCategory category, std::string_view tag) {
  TANDEM_ASSERT(bytes >= 0, "negative allocation of ", bytes, " bytes for ", tag);
  if (bytes == 0) {  // no memory, but counted like any allocation (as the CPU allocator does)
    note_alloc(0, category, tag);
    return nullptr;
  }
  const cudaStream_t stream = current_stream();
  const size_t size = round_up(static_cast<size_t>(bytes), kRound);
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  Block* b = s.find_or_make(stream, size);
  if (b == nullptr) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    throw Error(detail::concat("CUDA out of memory: cannot allocate ", bytes, " bytes for '", tag,
                               "' (a segment of ", segment_size(size), " bytes); tandem holds ",
                               s.reserved, " bytes from the driver for ", stats().total_in_use,
                               " bytes of live tensors; the GPU has ", free_bytes, " of ",
                               total_bytes, " bytes free"));
  }
  s.split(b, size);
  b->allocated = true;
  s.live.emplace(b->ptr, b);
  note_alloc(bytes, category, tag);
  return b->ptr;
}

void CudaAllocator::deallocate(void* ptr, int64_t bytes, MemCategory category,
                               std::string_view tag) {
  if (ptr == nullptr) {
    note_free(bytes, category, tag);
    return;
  }
  const cudaStream_t stream = current_stream();  // the free's use (Note [Caching allocator])
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const auto it = s.live.find(ptr);
  TANDEM_ASSERT(it != s.live.end(), "freeing ", ptr, " ('", tag,
                "'), which the CUDA allocator has not handed out");
  Block* b = it->second;
  s.live.erase(it);
  b->allocated = false;
  s.add_use(b, stream);
  s.defer_or_free(b);
  note_free(bytes, category, tag);
}

void CudaAllocator::record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;  // a zero-byte allocation has no block
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const auto it = s.live.find(ptr);
  TANDEM_CHECK(it != s.live.end(), "record_stream: ", ptr,
               " is not the start of a live CUDA allocation");
  s.add_use(it->second, stream);
}

int64_t CudaAllocator::reserved_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->reserved;
}

int64_t CudaAllocator::peak_reserved_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->peak_reserved;
}

void CudaAllocator::empty_cache() {
  std::lock_guard lock(state_->mutex);
  state_->process_events();
  state_->release_cached_segments();
}

CudaAllocator& cuda_allocator() {
  static CudaAllocator* instance = new CudaAllocator();  // outlives every static tensor
  return *instance;
}

void record_stream(const Tensor& t, cudaStream_t stream) {
  if (!t.defined() || t.device() != Device::kCUDA) return;
  TANDEM_CHECK(!t.released(), "record_stream on tensor '", t.storage()->tag(),
               "', whose storage was already released");
  cuda_allocator().record_stream(t.storage()->data(), stream);
}

}  // namespace tandem::cuda
