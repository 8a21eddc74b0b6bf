// Fuzzes ParseJobSpec (services/common/contract/job_spec.h), the YAML/JSON reader of a user's
// spec, then what every reader does next with a spec it got: ValidateJobSpec, WithDefaults and
// the device rules. Inputs are capped at the api's request limit (4 MiB, api/config.h).
// Bad input must end in UserError; any other exception escapes and is a crash (a finding).
#include <cstdint>
#include <string>

#include "services/common/contract/job_spec.h"
#include "services/common/contract/user_error.h"

namespace {
constexpr size_t kMaxRequestBytes = 4 << 20;  // services/api/config.h max_request_bytes

void UseSpec(const gradhub::v1::JobSpec& spec) {
  gradhub::ValidateJobSpec(spec);
  const gradhub::v1::JobSpec defaulted = gradhub::WithDefaults(spec);
  gradhub::ValidateJobSpec(defaulted);
  gradhub::NeedsCuda(defaulted);
  try {
    gradhub::CheckRankDevice(defaulted, gradhub::RankDevice::kCpu);
  } catch (const gradhub::UserError&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxRequestBytes) return 0;
  gradhub::v1::JobSpec spec;
  try {
    spec = gradhub::ParseJobSpec(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const gradhub::UserError&) {
    return 0;
  }
  UseSpec(spec);
  return 0;
}
