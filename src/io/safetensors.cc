// safetensors reader and writer. The reader trusts nothing: it checks sizes, the JSON, every
// entry and the exact tiling of the data section by the tensors before reading any data, and
// reads with pread at checked 64-bit offsets, so a corrupt file fails with a message and never
// reads outside the file or the tensors it allocates.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/atomic_file.h"

namespace tandem::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies bytes as they are");

using Json = nlohmann::json;
constexpr int64_t kMaxHeaderBytes = 100'000'000;  // the limit of the reference implementation
constexpr const char* kMetadataKey = "__metadata__";

// The spec's names of the dtypes this reader and writer take.
constexpr EnumName<DType> kSafetensorsDTypes[] = {{DType::kF32, "F32"},
                                                  {DType::kF64, "F64"},
                                                  {DType::kBF16, "BF16"},
                                                  {DType::kI32, "I32"},
                                                  {DType::kI64, "I64"}};

bool dtype_from_name(const std::string& name, DType* out) {
  const std::optional<DType> t = value_in(kSafetensorsDTypes, name);
  if (t) *out = *t;
  return t.has_value();
}

// A non-negative JSON integer that fits int64_t.
bool json_to_count(const Json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return *out >= 0;
  }
  return false;
}

// An open file descriptor, read with pread at absolute 64-bit offsets.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    TANDEM_CHECK(fd_ >= 0, "cannot open safetensors file '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      TANDEM_CHECK(false, "safetensors file '", path, "' is not a readable regular file");
    }
    size_ = static_cast<int64_t>(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int64_t size() const { return size_; }
  void read_at(int64_t offset, void* out, int64_t bytes) const {
    TANDEM_ASSERT(offset >= 0 && bytes >= 0 && bytes <= size_ - offset, "read beyond ", path_);
    char* p = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)),
                                static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      TANDEM_CHECK(n > 0, "cannot read safetensors file '", path_, "' at byte ", offset, ": ",
                   n == 0 ? std::string("unexpected end of file") : std::strerror(errno));
      p += n;
      offset += n;
      bytes -= n;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Parses the header text, rejecting invalid JSON and any key repeated within one object
// (nlohmann would silently keep the last one).
Json parse_json_unique_keys(const std::string& where, const std::string& text) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const auto on_event = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == Json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == Json::parse_event_t::key && !open_objects.empty() && duplicate.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json j = Json::parse(text, on_event, /*allow_exceptions=*/false);
  TANDEM_CHECK(!j.is_discarded(), where, "the header is not valid JSON");
  TANDEM_CHECK(duplicate.empty(), where, "the header has the key '", duplicate, "' twice");
  TANDEM_CHECK(j.is_object(), where, "the header is JSON but not an object");
  return j;
}

std::map<std::string, std::string> parse_metadata(const std::string& where, const Json& value) {
  TANDEM_CHECK(value.is_object(), where, "__metadata__ is not an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, v] : value.items()) {
    TANDEM_CHECK(v.is_string(), where, "__metadata__ value of '", key,
                 "' is not a string (metadata maps strings to strings)");
    metadata[key] = v.get<std::string>();
  }
  return metadata;
}

SafetensorsEntry parse_entry(const std::string& where, const std::string& name, const Json& v,
                             int64_t data_size) {
  const std::string what = where + "tensor '" + name + "' ";
  TANDEM_CHECK(v.is_object(), what, "is not an object with dtype, shape and data_offsets");
  for (const auto& [key, unused] : v.items()) {
    TANDEM_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", what,
                 "has the unknown key '", key, "' (valid: dtype, shape, data_offsets)");
  }
  TANDEM_CHECK(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), what,
               "lacks one of dtype, shape, data_offsets");
  SafetensorsEntry e;
  e.name = name;
  const Json& dtype = v["dtype"];
  TANDEM_CHECK(dtype.is_string() && dtype_from_name(dtype.get<std::string>(), &e.dtype), what,
               "has dtype ", dtype.dump(), "; supported: F32, F64, BF16, I32, I64");
  const Json& shape = v["shape"];
  TANDEM_CHECK(shape.is_array(), what, "has shape ", shape.dump(), ", not an array");
  int64_t bytes = dtype_size(e.dtype);
  for (const Json& d : shape) {
    int64_t size = 0;
    TANDEM_CHECK(json_to_count(d, &size), what, "has shape ", shape.dump(),
                 "; sizes must be non-negative integers");
    TANDEM_CHECK(!__builtin_mul_overflow(bytes, size, &bytes), what, "has shape ", shape.dump(),
                 ", too large to address");
    e.shape.push_back(size);
  }
  const Json& offsets = v["data_offsets"];
  TANDEM_CHECK(offsets.is_array() && offsets.size() == 2 && json_to_count(offsets[0], &e.begin) &&
                   json_to_count(offsets[1], &e.end),
               what, "has data_offsets ", offsets.dump(),
               "; they must be two non-negative integers [begin, end]");
  TANDEM_CHECK(e.begin <= e.end && e.end <= data_size, what, "has data_offsets [", e.begin, ", ",
               e.end, ") outside the data section of ", data_size, " bytes");
  TANDEM_CHECK(e.end - e.begin == bytes, what, "has data_offsets [", e.begin, ", ", e.end,
               ") spanning ", e.end - e.begin, " bytes, but shape ", shape_str(e.shape), " of ",
               safetensors_dtype_name(e.dtype), " takes ", bytes, " bytes");
  return e;
}

// The tensors, ordered by offset, must tile the data section exactly: no overlap, no gap, no
// trailing bytes (the format's rule; it also makes every byte accounted for).
void check_tiling(const std::string& where, std::vector<SafetensorsEntry>& entries,
                  int64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t covered = 0;
  const SafetensorsEntry* last = nullptr;
  for (const SafetensorsEntry& e : entries) {
    TANDEM_CHECK(e.begin >= covered, where, "tensor '", e.name, "' at [", e.begin, ", ", e.end,
                 ") overlaps tensor '", last ? last->name : "", "' at [", last ? last->begin : 0,
                 ", ", covered, ")");
    TANDEM_CHECK(e.begin == covered, where, "bytes [", covered, ", ", e.begin,
                 ") of the data section belong to no tensor (a gap before tensor '", e.name, "')");
    covered = e.end;
    last = &e;
  }
  TANDEM_CHECK(covered == data_size, where, "the data section has ", data_size,
               " bytes but the tensors cover only the first ", covered, ": bytes [", covered, ", ",
               data_size, ") belong to no tensor");
}

SafetensorsHeader read_header(const InputFile& file, const std::string& path) {
  const std::string where = "safetensors file '" + path + "': ";
  const int64_t size = file.size();
  TANDEM_CHECK(size >= 8, where, "it is ", size, " bytes, too short for the 8-byte header length");
  unsigned char len_bytes[8];
  file.read_at(0, len_bytes, 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  TANDEM_CHECK(header_len <= static_cast<uint64_t>(size - 8), where, "the header length ",
               header_len, " runs past the end of the file (", size, " bytes)");
  TANDEM_CHECK(header_len <= static_cast<uint64_t>(kMaxHeaderBytes), where, "the header length ",
               header_len, " is above the format's limit of ", kMaxHeaderBytes, " bytes");
  std::string text(header_len, '\0');
  file.read_at(8, text.data(), static_cast<int64_t>(header_len));
  TANDEM_CHECK(!text.empty() && text[0] == '{', where, "the header does not start with '{'");
  const Json j = parse_json_unique_keys(where, text);

  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_size = size - header.data_start;
  for (const auto& [name, value] : j.items()) {
    if (name == kMetadataKey) {
      header.metadata = parse_metadata(where, value);
    } else {
      header.tensors.push_back(parse_entry(where, name, value, data_size));
    }
  }
  check_tiling(where, header.tensors, data_size);
  return header;
}

uint16_t float_to_bf16_bits(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // keep it a NaN
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);                 // to nearest, ties to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  return std::string(name_in(kSafetensorsDTypes, dtype));
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const InputFile file(path);
  return read_header(file, path);
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, MemCategory category) {
  const InputFile file(path);
  const SafetensorsHeader header = read_header(file, path);
  std::map<std::string, Tensor> tensors;
  for (const SafetensorsEntry& e : header.tensors) {
    Tensor t = Tensor::empty(e.shape, e.dtype, category, e.name);
    if (t.nbytes() > 0) file.read_at(header.data_start + e.begin, t.raw_data(), t.nbytes());
    tensors.emplace(e.name, std::move(t));
  }
  return tensors;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Widest elements first (stable, so the caller's order holds within a width): with the data
  // section 8-aligned, every tensor is then aligned to its element size for mmap readers.
  std::vector<const std::pair<std::string, Tensor>*> order;
  std::set<std::string> names;
  for (const auto& item : tensors) {
    const std::string where = "saving '" + path + "': tensor '" + item.first + "' ";
    TANDEM_CHECK(!item.first.empty() && item.first != kMetadataKey, where,
                 "has a reserved or empty name");
    TANDEM_CHECK(names.insert(item.first).second, where, "appears twice");
    TANDEM_CHECK(item.second.defined() && !item.second.released(), where, "has no data");
    TANDEM_CHECK(item.second.device() == Device::kCPU, where, "is not on the CPU");
    order.push_back(&item);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_size(a->second.dtype()) > dtype_size(b->second.dtype());
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  int64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    header[item->first] = {{"dtype", safetensors_dtype_name(t.dtype())},
                           {"shape", t.shape()},
                           {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  AtomicFileWriter out(path);
  out.write(len_bytes, 8);
  out.write(text.data(), static_cast<int64_t>(text.size()));
  for (const auto* item : order) {
    if (item->second.nbytes() > 0) out.write(item->second.raw_data(), item->second.nbytes());
  }
  out.commit();
}

Tensor to_float(const Tensor& src, DType target) {
  TANDEM_CHECK(target == DType::kF32 || target == DType::kF64, "to_float target ",
               dtype_name(target), " is invalid: use f32 or f64");
  const DType from = src.dtype();
  TANDEM_CHECK(from == DType::kF32 || from == DType::kF64 || from == DType::kBF16,
               "to_float of tensor '", src.storage()->tag(), "': its dtype ", dtype_name(from),
               " is not a floating type (f32, f64, bf16)");
  Tensor out = Tensor::empty(src.shape(), target, src.category(), src.storage()->tag());
  const int64_t n = src.numel();
  const void* in = n > 0 ? src.raw_data() : nullptr;
  const auto value = [&](int64_t i) -> double {
    switch (from) {
      case DType::kF32:
        return static_cast<const float*>(in)[i];
      case DType::kF64:
        return static_cast<const double*>(in)[i];
      default:
        break;  // kBF16: the high half of an f32
    }
    const uint16_t b = static_cast<const uint16_t*>(in)[i];
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
  };
  if (target == DType::kF32) {
    float* dst = n > 0 ? out.data<float>() : nullptr;
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(value(i));
  } else {
    double* dst = n > 0 ? out.data<double>() : nullptr;
    for (int64_t i = 0; i < n; ++i) dst[i] = value(i);
  }
  return out;
}

Tensor to_bf16(const Tensor& src) {
  const DType from = src.dtype();
  TANDEM_CHECK(from == DType::kF32 || from == DType::kF64, "to_bf16 of tensor '",
               src.storage()->tag(), "': its dtype ", dtype_name(from), " is not f32 or f64");
  Tensor out = Tensor::empty(src.shape(), DType::kBF16, src.category(), src.storage()->tag());
  const int64_t n = src.numel();
  if (n == 0) return out;
  uint16_t* dst = static_cast<uint16_t*>(out.raw_data());
  // f64 goes through f32 first; the double rounding can differ from direct rounding only on
  // values within 2^-24 relative of a bf16 tie.
  if (from == DType::kF32) {
    const float* in = src.data<float>();
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16_bits(in[i]);
  } else {
    const double* in = src.data<double>();
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16_bits(static_cast<float>(in[i]));
  }
  return out;
}

}  // namespace tandem::io
