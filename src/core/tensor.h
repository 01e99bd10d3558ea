// Tensors: a view (dtype, shape, element offset) over a reference-counted Storage.
// Note [Early release]: release_storage() is the one way to free memory before the last view
// goes away; every later touch of a view over that storage throws tandem::Error.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// Owns one allocation; frees it on release() or destruction, whichever is first.
class StorageImpl {
 public:
  StorageImpl(Allocator& allocator, int64_t bytes, MemCategory category, std::string_view tag);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  Device device() const { return allocator_->device(); }
  bool released() const { return released_; }
  const std::string& tag() const { return tag_; }
  // Returns the bytes to the allocator now (Note [Early release]).
  void release();
  // Note [Offloaded storage]: evict() returns the bytes to the allocator while a copy elsewhere
  // (pinned host memory, runtime/activation_offload.h) holds the contents; readmit() takes as
  // many bytes again, on the calling thread's current stream, for that copy to come back into.
  // Views stay valid throughout; a touch in between throws tandem::Error.
  void evict();
  void readmit();
  bool evicted() const { return evicted_; }
  // Counts this storage under another category from now on (Note [Hand-over] in tensor.h).
  void set_category(MemCategory category);

 private:
  Allocator* allocator_;
  void* data_;
  int64_t bytes_;
  MemCategory category_;
  bool released_ = false;
  bool evicted_ = false;
  std::string tag_;
};
using Storage = std::shared_ptr<StorageImpl>;

class Tensor {
 public:
  Tensor() = default;

  // A new contiguous tensor with uninitialised contents, counted under `category`, on `device`
  // (the CPU unless named: code that follows the current device, Note [Current device], asks
  // for current_device() explicitly, as the model's nodes do).
  static Tensor empty(const Shape& shape, DType dtype, MemCategory category,
                      std::string_view tag = {}, Device device = Device::kCPU);
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory category,
                      std::string_view tag = {}, Device device = Device::kCPU);

  bool defined() const { return storage_ != nullptr; }
  bool released() const { return storage_ && storage_->released(); }
  bool evicted() const { return storage_ && storage_->evicted(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::kCPU; }
  MemCategory category() const { return storage_->category(); }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  const Storage& storage() const { return storage_; }

  // Typed access; throws when the storage was released or T is not the dtype.
  template <typename T>
  T* data() const {
    check_live(DTypeOf<T>::value);
    return static_cast<T*>(storage_->data()) + offset_;
  }
  void* raw_data() const;

  // A view with another shape over the same elements (numel must match).
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, begin + length) of dimension 0, as a view.
  Tensor narrow_rows(int64_t begin, int64_t length) const;
  // The same bytes as `dtype`, whose elements are as wide as this tensor's, as a view.
  Tensor view_as(DType dtype) const;
  // Fills every element with zero.
  void zero_() const;
  // Copies src's elements (same dtype and numel) into this tensor, across devices too (ordered
  // on the current stream; a copy to the host returns once the data is there).
  void copy_from(const Tensor& src) const;
  // A contiguous copy of this tensor on `device` (a new allocation counted under `category`).
  Tensor to(Device device, MemCategory category = MemCategory::kOther) const;

 private:
  void check_live(DType want) const;

  Storage storage_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t offset_ = 0;  // in elements
};

// Frees the storage of each defined tensor now (Note [Early release]). Tensors sharing a
// storage are all released; already released ones are skipped. On a device, the current
// stream's use is recorded first so the block is reused only after that work completes.
void release_storage(std::initializer_list<const Tensor*> tensors);
void release_storage(const std::vector<Tensor>& tensors);

// Note [Hand-over]: a tensor one node produces for the next (a layer's output, the routed rows,
// the expert outputs, a received activation) is counted as other or communication while it is in
// flight, and becomes an activation when the node that keeps it for its backward adopts it, at
// the start of that node's forward. The activation bytes in use are then, at every node
// boundary, the sum of the footprints (core/footprint.h) of the nodes that ran.
void adopt_as_activation(const Tensor& t);

}  // namespace tandem
