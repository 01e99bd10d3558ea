// safetensors reader and writer. Oracle: the format specification (huggingface/safetensors
// README): files built byte by byte here from the spec must load to the values put in, files
// the writer makes must parse by the spec's rules with an independent JSON read, and each
// corrupted file must fail with the expected message before any data is read.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/safetensors.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem_st_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

// A file as the spec lays it out: u64 LE header length, header text, data bytes.
std::string spec_file(const std::string& header, const std::string& data,
                      int64_t length_field = -1) {
  const uint64_t n = length_field >= 0 ? static_cast<uint64_t>(length_field) : header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  return out + header + data;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

template <typename T>
Tensor make(const Shape& shape, DType dtype, const std::vector<T>& values) {
  Tensor t = Tensor::empty(shape, dtype, MemCategory::kOther, "test");
  std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (t.numel() > 0) std::memcpy(v.data(), t.raw_data(), v.size() * sizeof(T));
  return v;
}

TEST_F(SafetensorsTest, HandBuiltSpecFileLoads) {
  // Two tensors: "a" F32 [2] = {1.5, -2}, "b" I32 [] = 7, in data order b then a.
  std::string data;
  const int32_t b = 7;
  const float a[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(&b), 4);
  data.append(reinterpret_cast<const char*>(a), 8);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
      R"("b":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}  )";
  write_raw(path("x.safetensors"), spec_file(header, data));
  const auto loaded = load_safetensors(path("x.safetensors"), MemCategory::kParameter);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded.at("a").shape(), (Shape{2}));
  EXPECT_EQ(values_of<float>(loaded.at("a")), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(loaded.at("b").dim(), 0);
  EXPECT_EQ(values_of<int32_t>(loaded.at("b")), (std::vector<int32_t>{7}));
  EXPECT_EQ(loaded.at("a").category(), MemCategory::kParameter);
  const SafetensorsHeader h = read_safetensors_header(path("x.safetensors"));
  EXPECT_EQ(h.metadata.at("format"), "pt");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "b");  // ordered by offset
  EXPECT_EQ(h.data_start, 8 + static_cast<int64_t>(header.size()));
}

TEST_F(SafetensorsTest, RoundTripOfEveryDtypeAndShape) {
  const uint16_t bf16_bits[3] = {0x3f80, 0xc020, 0x0000};  // 1, -2.5, 0
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w.f32", make<float>({2, 3}, DType::kF32, {1, 2, 3, 4, 5, -6.25f})},
      {"w.bf16", make<uint16_t>({3}, DType::kBF16, {bf16_bits[0], bf16_bits[1], bf16_bits[2]})},
      {"w.f64", make<double>({1}, DType::kF64, {3.141592653589793})},
      {"i.i32", make<int32_t>({2, 1}, DType::kI32, {-7, 2147483647})},
      {"i.i64", make<int64_t>({1}, DType::kI64, {int64_t{1} << 40})},
      {"scalar", make<float>({}, DType::kF32, {42.0f})},
      {"empty", Tensor::empty({0, 3}, DType::kF32, MemCategory::kOther, "empty")},
  };
  save_safetensors(path("m.safetensors"), tensors, {{"format", "pt"}, {"step", "12"}});
  const auto loaded = load_safetensors(path("m.safetensors"), MemCategory::kOther);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor& u = loaded.at(name);
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(values_of<unsigned char>(u), values_of<unsigned char>(t)) << name;
  }
  // Read back by the spec with an independent JSON parse.
  const std::string bytes = read_file(path("m.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  const nlohmann::json j = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(j["w.bf16"]["dtype"], "BF16");
  EXPECT_EQ(j["w.f64"]["dtype"], "F64");
  EXPECT_EQ(j["i.i32"]["dtype"], "I32");
  EXPECT_EQ(j["w.f32"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["__metadata__"]["step"], "12");
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") continue;
    const int64_t begin = e["data_offsets"][0];
    const int64_t width = e["dtype"] == "F64" || e["dtype"] == "I64" ? 8
                          : e["dtype"] == "BF16"                     ? 2
                                                                     : 4;
    EXPECT_EQ(begin % width, 0) << name << " is aligned to its element size";
  }
  // Saving again replaces the file and leaves no temporary behind.
  save_safetensors(path("m.safetensors"), {tensors[0]});
  EXPECT_EQ(load_safetensors(path("m.safetensors"), MemCategory::kOther).size(), 1u);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST_F(SafetensorsTest, EmptyHeaderIsAValidEmptyFile) {
  save_safetensors(path("e.safetensors"), {});
  EXPECT_TRUE(load_safetensors(path("e.safetensors"), MemCategory::kOther).empty());
  write_raw(path("e2.safetensors"), spec_file("{}      ", ""));
  EXPECT_TRUE(load_safetensors(path("e2.safetensors"), MemCategory::kOther).empty());
}

TEST_F(SafetensorsTest, SaveRejectsBadNames) {
  const Tensor t = make<float>({1}, DType::kF32, {1});
  EXPECT_THROW(save_safetensors(path("d"), {{"a", t}, {"a", t}}), Error);
  EXPECT_THROW(save_safetensors(path("d"), {{"__metadata__", t}}), Error);
  EXPECT_FALSE(fs::exists(path("d")));
}

TEST(SafetensorsConvert, Bf16ToFloatAndRoundToNearestEven) {
  const Tensor b = make<uint16_t>({4}, DType::kBF16, {0x3f80, 0xc020, 0x7f80, 0x0001});
  const Tensor f = to_float(b, DType::kF32);
  EXPECT_EQ(f.data<float>()[0], 1.0f);
  EXPECT_EQ(f.data<float>()[1], -2.5f);
  EXPECT_TRUE(std::isinf(f.data<float>()[2]));
  EXPECT_EQ(f.data<float>()[3], std::bit_cast<float>(0x00010000u));
  const Tensor d = to_float(b, DType::kF64);
  EXPECT_EQ(d.data<double>()[1], -2.5);

  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1);
  // 1 + 3 * 2^-8 is a tie between 1 + 2^-7 (odd) and 1 + 2^-6 -> even (0x3f82).
  const Tensor x = make<float>(
      {5}, DType::kF32,
      {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -0.0f, std::nanf("")});
  const Tensor y = to_bf16(x);
  const auto bits = values_of<uint16_t>(y);
  EXPECT_EQ(bits[0], 0x3f80);
  EXPECT_EQ(bits[1], 0x3f82);
  EXPECT_EQ(bits[2], 0x3f81);  // just above the tie rounds up
  EXPECT_EQ(bits[3], 0x8000);
  EXPECT_TRUE(std::isnan(to_float(y, DType::kF32).data<float>()[4]));
  EXPECT_THROW(to_float(make<int32_t>({1}, DType::kI32, {1}), DType::kF32), Error);
  EXPECT_THROW(to_float(x, DType::kI32), Error);
}

struct Corruption {
  const char* what;
  std::string bytes;
  const char* expected;
};

std::string entry(const char* name, const char* dtype, const char* shape, int64_t b, int64_t e) {
  return std::string("\"") + name + R"(":{"dtype":")" + dtype + R"(","shape":)" + shape +
         R"(,"data_offsets":[)" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

std::vector<Corruption> corruptions() {
  const std::string d16(16, '\x01'), d24(24, '\x02');
  const std::string a = entry("a", "F32", "[4]", 0, 16);
  return {
      {"shorter than the length field", "abcd", "too short for the 8-byte header length"},
      {"length larger than file", spec_file("{" + a + "}", d16, 1000), "runs past the end"},
      {"huge length", spec_file("{}", "", int64_t{1} << 62), "runs past the end"},
      {"zero length", spec_file("", d16), "does not start with '{'"},
      {"truncated header", spec_file("{" + a, d16), "not valid JSON"},
      {"invalid JSON", spec_file(R"({"a": {"dtype": F32}})", d16), "not valid JSON"},
      {"not an object", spec_file("{} []", ""), "not valid JSON"},
      {"array header", spec_file("[1,2]", ""), "does not start with '{'"},
      {"unknown dtype", spec_file("{" + entry("a", "F17", "[4]", 0, 16) + "}", d16),
       R"(tensor 'a' has dtype "F17")"},
      {"unsupported dtype", spec_file("{" + entry("a", "F16", "[8]", 0, 16) + "}", d16),
       R"(dtype "F16"; supported)"},
      {"shape/offset mismatch",
       spec_file("{" + entry("a", "F32", "[2,2]", 0, 12) + "}", std::string(12, 'x')),
       "spanning 12 bytes, but shape [2,2] of F32 takes 16"},
      {"negative shape", spec_file("{" + entry("a", "F32", "[-4]", 0, 16) + "}", d16),
       "non-negative integers"},
      {"fractional shape", spec_file("{" + entry("a", "F32", "[2.5]", 0, 16) + "}", d16),
       "non-negative integers"},
      {"shape overflow",
       spec_file("{" + entry("a", "F32", "[4611686018427387904,4]", 0, 16) + "}", d16),
       "too large to address"},
      {"overlapping tensors",
       spec_file(
           "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[4]", 8, 24) + "}",
           d24),
       "tensor 'b' at [8, 24) overlaps tensor 'a' at [0, 16)"},
      {"gap in coverage",
       spec_file(
           "{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 16, 24) + "}",
           d24),
       "bytes [8, 16) of the data section belong to no tensor (a gap before tensor 'b')"},
      {"trailing bytes", spec_file("{" + entry("a", "F32", "[2]", 0, 8) + "}", d16),
       "cover only the first 8"},
      {"duplicate key", spec_file("{" + a + "," + a + "}", d16), "the key 'a' twice"},
      {"duplicate inner key",
       spec_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d16),
       "the key 'dtype' twice"},
      {"offsets beyond the file", spec_file("{" + entry("a", "F32", "[400]", 0, 1600) + "}", d16),
       "has data_offsets [0, 1600) outside the data section of 16 bytes"},
      {"reversed offsets", spec_file("{" + entry("a", "F32", "[0]", 16, 0) + "}", d16),
       "outside the data section"},
      {"three offsets",
       spec_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16,16]}})", d16),
       "two non-negative integers"},
      {"missing offsets", spec_file(R"({"a":{"dtype":"F32","shape":[4]}})", d16),
       "lacks one of dtype, shape, data_offsets"},
      {"unknown entry key",
       spec_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1}})", d16),
       "unknown key 'x'"},
      {"entry not an object", spec_file(R"({"a":3})", ""), "not an object"},
      {"metadata not strings", spec_file(R"({"__metadata__":{"step":12}})", ""),
       "value of 'step' is not a string"},
      {"data truncated", spec_file("{" + a + "}", std::string(10, 'x')),
       "outside the data section of 10 bytes"},
  };
}

TEST_F(SafetensorsTest, CorruptedFilesFailWithClearMessages) {
  int i = 0;
  for (const Corruption& c : corruptions()) {
    const std::string p = path("bad" + std::to_string(i++) + ".safetensors");
    write_raw(p, c.bytes);
    for (int reader = 0; reader < 2; ++reader) {
      try {
        if (reader == 0) load_safetensors(p, MemCategory::kOther);
        if (reader == 1) read_safetensors_header(p);
        ADD_FAILURE() << c.what << ": accepted";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(c.expected), std::string::npos)
            << c.what << ": message '" << msg << "' lacks '" << c.expected << "'";
        EXPECT_NE(msg.find(p), std::string::npos) << c.what << ": names no file: " << msg;
      }
    }
  }
  EXPECT_THROW(load_safetensors(path("missing.safetensors"), MemCategory::kOther), Error);
}

// Random corruptions of a valid file (flipped header bytes, truncations, rewritten length
// fields) must each load or fail with tandem::Error; under ASan, never read out of bounds.
TEST_F(SafetensorsTest, RandomCorruptionsNeverCrash) {
  save_safetensors(path("good.safetensors"),
                   {{"a", make<float>({2, 2}, DType::kF32, {1, 2, 3, 4})},
                    {"b", make<int64_t>({1}, DType::kI64, {5})}},
                   {{"format", "pt"}});
  const std::string good = read_file(path("good.safetensors"));
  std::mt19937_64 rng(20240520);
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bytes = good;
    switch (trial % 3) {
      case 0:
        for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
        break;
      case 1:
        bytes.resize(rng() % bytes.size());
        break;
      default:
        for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(i == 0 ? rng() : rng() % 2);
    }
    write_raw(path("fuzz.safetensors"), bytes);
    try {
      load_safetensors(path("fuzz.safetensors"), MemCategory::kOther);
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 200);
}

}  // namespace
}  // namespace tandem::io
