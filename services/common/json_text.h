#pragma once

#include <string>
#include <string_view>

namespace gradhub {

// `text` as a JSON string literal, quotes included: '"', '\\' and control characters escaped
// (\n, \r, \t, else \u00XX); every other byte as it is, so UTF-8 passes through.
std::string QuoteJson(std::string_view text);

}  // namespace gradhub
