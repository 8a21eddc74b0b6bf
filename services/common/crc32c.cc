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

}  // namespace gradhub
