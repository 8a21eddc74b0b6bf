#include "services/api/rendezvous_backend.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradhub::api {

std::string QuoteKey(const std::string& key) {
  constexpr size_t kMaxShown = 160;
  std::string shown = absl::CHexEscape(key.substr(0, kMaxShown));
  if (key.size() > kMaxShown) absl::StrAppend(&shown, "...");
  return absl::StrCat("\"", shown, "\"");
}

absl::StatusOr<int64_t> AddToCounter(const std::string& key, const std::string* held,
                                     int64_t delta) {
  int64_t current = 0;
  if (held != nullptr && !absl::SimpleAtoi(*held, &current)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key ", QuoteKey(key), " holds ", QuoteKey(*held), ", not a decimal int64 counter"));
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    return absl::OutOfRangeError(
        absl::StrCat("key ", QuoteKey(key), ": ", current, " + ", delta, " overflows int64"));
  }
  return result;
}

absl::Status InMemoryRendezvousBackend::Set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  data_.insert_or_assign(key, value);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> InMemoryRendezvousBackend::Add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  absl::StatusOr<int64_t> result =
      AddToCounter(key, it == data_.end() ? nullptr : &it->second, delta);
  if (result.ok()) data_.insert_or_assign(key, absl::StrCat(*result));
  return result;
}

absl::StatusOr<std::map<std::string, std::string>> InMemoryRendezvousBackend::Read(
    const std::vector<std::string>& keys, bool with_values) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::string> present;
  for (const std::string& key : keys) {
    auto it = data_.find(key);
    if (it != data_.end()) present.emplace(key, with_values ? it->second : std::string());
  }
  return present;
}

absl::StatusOr<int64_t> InMemoryRendezvousBackend::DeletePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t deleted = 0;
  auto it = data_.lower_bound(prefix);
  while (it != data_.end() && absl::StartsWith(it->first, prefix)) {
    it = data_.erase(it);
    ++deleted;
  }
  return deleted;
}

absl::StatusOr<int64_t> InMemoryRendezvousBackend::Size() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

}  // namespace gradhub::api
