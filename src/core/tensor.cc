// Tensor views and Storage ownership (Note [Early release] in tensor.h).
#include "core/tensor.h"

#include <cstring>
#include <sstream>

namespace tandem {

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

StorageImpl::StorageImpl(Allocator& allocator, int64_t bytes, MemCategory category,
                         std::string_view tag)
    : allocator_(&allocator),
      data_(allocator.allocate(bytes, category, tag)),
      bytes_(bytes),
      category_(category),
      tag_(tag) {}

StorageImpl::~StorageImpl() { release(); }

void StorageImpl::release() {
  if (released_) return;
  if (!evicted_) allocator_->deallocate(data_, bytes_, category_, tag_);
  data_ = nullptr;
  released_ = true;
  evicted_ = false;
}

void StorageImpl::evict() {
  TANDEM_ASSERT(!released_ && !evicted_, "evict of storage '", tag_, "': already ",
                released_ ? "released" : "evicted");
  allocator_->deallocate(data_, bytes_, category_, tag_);
  data_ = nullptr;
  evicted_ = true;
}

void StorageImpl::readmit() {
  TANDEM_ASSERT(evicted_, "readmit of storage '", tag_, "', which is not evicted");
  data_ = allocator_->allocate(bytes_, category_, tag_);
  evicted_ = false;
}

void StorageImpl::set_category(MemCategory category) {
  if (released_ || category == category_) return;
  TANDEM_ASSERT(!evicted_, "category change of evicted storage '", tag_, "'");
  allocator_->move_category(bytes_, category_, category);
  category_ = category;
}

void adopt_as_activation(const Tensor& t) {
  if (t.defined()) t.storage()->set_category(MemCategory::kActivation);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category, std::string_view tag,
                     Device device) {
  for (int64_t s : shape) TANDEM_ASSERT(s >= 0, "negative size in ", shape_str(shape));
  Allocator& allocator =
      device == Device::kCPU ? cpu_allocator() : *device_backend(device).allocator;
  Tensor t;
  t.storage_ = std::make_shared<StorageImpl>(allocator, shape_numel(shape) * dtype_size(dtype),
                                             category, tag);
  t.dtype_ = dtype;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category, std::string_view tag,
                     Device device) {
  Tensor t = empty(shape, dtype, category, tag, device);
  t.zero_();
  return t;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  TANDEM_ASSERT(d >= 0 && d < n, "dimension ", d, " of shape ", shape_str(shape_));
  return shape_[static_cast<size_t>(d)];
}

void Tensor::check_live(DType want) const {
  TANDEM_ASSERT(storage_ != nullptr, "access to an undefined tensor");
  TANDEM_CHECK(!storage_->released(), "tensor '", storage_->tag(),
               "' was read after its storage was released (shape ", shape_str(shape_), ")");
  TANDEM_CHECK(!storage_->evicted(), "tensor '", storage_->tag(),
               "' was read while offloaded to the host (shape ", shape_str(shape_),
               "; Note [Offloaded storage] in core/tensor.h)");
  TANDEM_ASSERT(want == dtype_, "tensor '", storage_->tag(), "' is ", dtype_name(dtype_),
                ", accessed as ", dtype_name(want));
}

void* Tensor::raw_data() const {
  check_live(dtype_);
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  TANDEM_ASSERT(shape_numel(shape) == numel(), "reshape ", shape_str(shape_), " to ",
                shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::narrow_rows(int64_t begin, int64_t length) const {
  TANDEM_ASSERT(dim() >= 1 && begin >= 0 && length >= 0 && begin + length <= shape_[0], "rows [",
                begin, ",", begin + length, ") of ", shape_str(shape_));
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Tensor t = *this;
  t.shape_[0] = length;
  t.offset_ += begin * row;
  return t;
}

Tensor Tensor::view_as(DType dtype) const {
  TANDEM_ASSERT(dtype_size(dtype) == dtype_size(dtype_), "view ", dtype_name(dtype_), " as ",
                dtype_name(dtype));
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

void Tensor::zero_() const {
  if (numel() == 0) return;
  if (device() == Device::kCPU) {
    std::memset(raw_data(), 0, static_cast<size_t>(nbytes()));
  } else {
    device_backend(device()).zero(raw_data(), static_cast<size_t>(nbytes()));
  }
}

void Tensor::copy_from(const Tensor& src) const {
  TANDEM_ASSERT(src.dtype_ == dtype_ && src.numel() == numel(), "copy ", shape_str(src.shape_),
                " into ", shape_str(shape_));
  if (numel() == 0) return;
  if (device() == Device::kCPU && src.device() == Device::kCPU) {
    std::memcpy(raw_data(), src.raw_data(), static_cast<size_t>(nbytes()));
  } else {
    const Device gpu = device() == Device::kCPU ? src.device() : device();
    device_backend(gpu).copy(raw_data(), device(), src.raw_data(), src.device(),
                             static_cast<size_t>(nbytes()));
  }
}

Tensor Tensor::to(Device device, MemCategory category) const {
  Tensor t = empty(shape_, dtype_, category, storage_ ? storage_->tag() : "", device);
  t.copy_from(*this);
  return t;
}

void release_storage(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined() || t->released()) continue;
    // CPU storage has no stream to record; a device storage records its current stream in
    // StorageImpl::release (the CUDA allocator's record_stream model).
    t->storage()->release();
  }
}

void release_storage(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) release_storage({&t});
}

}  // namespace tandem
