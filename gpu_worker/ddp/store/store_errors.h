// What every Store backend reports the same way.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gradhub::ddp {

// "timed out after 5000 ms waiting for store keys: a, b"
std::string DescribeTimeout(const std::vector<std::string>& missing,
                            std::chrono::milliseconds timeout);

// The integer value of counter `key`; StoreError when it holds something else.
int64_t ParseCounter(const std::string& key, const std::string& text);

}  // namespace gradhub::ddp
