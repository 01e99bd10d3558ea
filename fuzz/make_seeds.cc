// Writes the fuzzer's seed corpus with the real writer: small valid safetensors files with every
// dtype, a scalar, an empty tensor, metadata, and none at all. Usage: make_seeds DIR.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"

namespace {

using tandem::DType;
using tandem::MemCategory;
using tandem::Tensor;

Tensor filled(const tandem::Shape& shape, DType dtype, unsigned char byte) {
  Tensor t = Tensor::empty(shape, dtype, MemCategory::kOther);
  if (t.nbytes() > 0) std::memset(t.raw_data(), byte, static_cast<size_t>(t.nbytes()));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir);
  using Named = std::vector<std::pair<std::string, Tensor>>;
  const std::vector<std::pair<std::string, Named>> seeds = {
      {"empty", {}},
      {"one_f32", {{"w", filled({2, 3}, DType::kF32, 0x3f)}}},
      {"mixed",
       {{"model.embed_tokens.weight", filled({4, 2}, DType::kBF16, 0x40)},
        {"model.norm.weight", filled({2}, DType::kF64, 0x3f)},
        {"ids", filled({3}, DType::kI32, 1)},
        {"count", filled({}, DType::kI64, 7)},
        {"nothing", filled({0, 5}, DType::kF32, 0)}}},
  };
  for (const auto& [name, tensors] : seeds) {
    tandem::io::save_safetensors(dir + "/" + name + ".safetensors", tensors,
                                 name == "mixed"
                                     ? std::map<std::string, std::string>{{"format", "pt"}}
                                     : std::map<std::string, std::string>{});
  }
  return 0;
}
