// Element types qattn reads and writes. One enum for every file format; each format maps its own type codes
// onto it (tensor_io.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qattn {

// u16 and u32 hold bit patterns (16-bit floats of another kind, float32 patterns) as GPU vectors store them.
enum class DType : std::uint8_t { f64, f32, f16, bf16, i8, u8, i16, i32, i64, u16, u32 };

inline constexpr DType kAllDTypes[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i8,
                                       DType::u8,  DType::i16, DType::i32, DType::i64, DType::u16,
                                       DType::u32};

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: case DType::u16: return 2;
    case DType::i8: case DType::u8: return 1;
  }
  return 0;
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

// Short names as numpy spells them ("float32", "int8"; "bfloat16" as ml_dtypes spells it).
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i8: return "int8";
    case DType::u8: return "uint8";
    case DType::i16: return "int16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u16: return "uint16";
    case DType::u32: return "uint32";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace qattn
