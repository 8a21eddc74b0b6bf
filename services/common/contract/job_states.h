#pragma once

#include "gradhub/v1/jobs.pb.h"

namespace gradhub {

// Whether a job has ended for good: SUCCEEDED, FAILED or CANCELLED (jobs.proto's lifecycle).
// CANCELLING is not: processes of the job may still run. The one definition the api, the CLI
// and the tests share.
inline bool IsTerminal(v1::Job::State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED;
}

}  // namespace gradhub
