// Element types and devices. CPU ops run in f32 (training) and f64 (gradient checks); bf16 is
// the GPU's storage type for matrix operands.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/enum_names.h"

namespace tandem {

enum class DType : uint8_t { kF32, kF64, kBF16, kI32, kI64 };
enum class Device : uint8_t { kCPU, kCUDA };
// --device's names (Note [One name table per enumeration] in core/enum_names.h).
inline constexpr EnumName<Device> kDeviceNames[] = {{Device::kCPU, "cpu"}, {Device::kCUDA, "cuda"}};
constexpr std::span<const EnumName<Device>> enum_names(Device) { return kDeviceNames; }

constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

inline constexpr EnumName<DType> kDTypeNames[] = {{DType::kF32, "f32"},
                                                  {DType::kF64, "f64"},
                                                  {DType::kBF16, "bf16"},
                                                  {DType::kI32, "i32"},
                                                  {DType::kI64, "i64"}};
constexpr std::span<const EnumName<DType>> enum_names(DType) { return kDTypeNames; }
constexpr std::string_view dtype_name(DType t) { return name_in(kDTypeNames, t); }

// A bf16 value on the host (storage only: convert to float to compute).
struct BF16 {
  uint16_t bits;
};
// Round to nearest even (NaN stays NaN).
inline BF16 bf16_from_float(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BF16{static_cast<uint16_t>(u >> 16)};
}
inline float bf16_to_float(BF16 b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<BF16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};

}  // namespace tandem
