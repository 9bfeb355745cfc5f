// IEEE binary16 <-> binary32 conversion, the one definition every layer uses (the attention kernel,
// the KV codecs, the tests). Header-only, no dependencies.
#pragma once
#include <cstdint>
#include <cstring>

namespace mz {

// Portable IEEE binary16 <-> binary32 conversion (round to nearest even, NaN stays NaN, overflow
// goes to inf, subnormals handled). Pure bit manipulation so the result does not depend on the
// compile flags of the including translation unit.
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: mant * 2^-24, exact in f32
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN (NaN keeps its top payload bits and is forced quiet)
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: half subnormal or zero; let the FPU round at ulp 2^-24
    float a;
    std::memcpy(&a, &ax, 4);
    float r = a + 0.5f;
    uint32_t rb;
    std::memcpy(&rb, &r, 4);
    return static_cast<uint16_t>(sign | (rb - 0x3f000000u));
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1u);  // rebias exponent by -112 and round to nearest even
  return static_cast<uint16_t>(sign | (ax >> 13));
}

}  // namespace mz
