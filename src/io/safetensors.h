// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header (padded with spaces to 8-byte alignment), then the data
// section. The reader validates the whole header against the file before touching any tensor
// data, and every problem is a tandem::Error naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tandem::io {

// The spec's dtype names this runtime reads and writes: "F32", "F64", "BF16", "I32", "I64".
std::string safetensors_dtype_name(DType dtype);

// One tensor's header entry: its data lies at [begin, end) of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t begin = 0;
  int64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // ordered by data offset
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // byte offset of the data section in the file (8 + N)
};

// Writes `tensors` (CPU, contiguous, in this order in the data section) and `metadata` (the
// "__metadata__" map) to `path`, through a temporary file renamed into place. Names must be
// unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and fully validates the header only (names, dtypes, shapes, offsets, metadata).
SafetensorsHeader read_safetensors_header(const std::string& path);

// Validates, then reads every tensor into new CPU tensors counted under `category`, each
// with its stored dtype and tagged with its name.
std::map<std::string, Tensor> load_safetensors(const std::string& path, MemCategory category);

// A copy of `src` (F32, F64 or BF16) as `target` (F32 or F64), exact except f64 -> f32 rounding;
// HF checkpoints are often stored in BF16 while master weights are F32.
Tensor to_float(const Tensor& src, DType target);
// A copy of `src` (F32 or F64) as BF16, rounded to nearest even (NaN stays NaN).
Tensor to_bf16(const Tensor& src);

}  // namespace tandem::io
