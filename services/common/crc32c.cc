#include "services/common/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace gradhub {

uint32_t Crc32cExtend(uint32_t crc, std::string_view data) {
  // ISA-L keeps the register uninverted between calls: CRC-32C's standard form inverts it
  // before the first byte and after the last.
  unsigned int state = ~crc;
  auto* bytes = reinterpret_cast<unsigned char*>(const_cast<char*>(data.data()));
  size_t left = data.size();
  while (left > 0) {  // ISA-L takes an int length
    const int n = static_cast<int>(std::min<size_t>(left, INT_MAX & ~size_t{4095}));
    state = crc32_iscsi(bytes, n, state);
    bytes += n;
    left -= static_cast<size_t>(n);
  }
  return ~state;
}

uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }

namespace {

// Polynomials over GF(2) modulo CRC-32C's, bit-reflected as the CRC is: bit 31 is x^0.
constexpr uint32_t kReflectedPolynomial = 0x82f63b78;

// a * b modulo the polynomial.
uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kReflectedPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial: what appending `bytes` zero bytes multiplies a CRC by.
uint32_t ShiftForBytes(uint64_t bytes) {
  uint32_t power = 1u << 31;         // x^0
  uint32_t square = 1u << (31 - 8);  // x^8: one byte
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) power = MultiplyModP(power, square);
    square = MultiplyModP(square, square);  // x^(8 * 2^k) for the next bit of `bytes`
  }
  return power;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  // The inversions before and after cancel out of a's register shifted past b's bytes: what
  // is left is a's CRC shifted by b's length, added to b's.
  return MultiplyModP(ShiftForBytes(length_b), crc_a) ^ crc_b;
}

}  // namespace gradhub
