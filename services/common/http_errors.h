// How every gradhub REST server answers an error: the HTTP status Google's API gateways map a
// google.rpc code to, and the body {"error": {"code": 404, "status": "NOT_FOUND", "message":
// "..."}} that Google APIs send. One place, so the api and the checkpoint store cannot drift.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub {

int HttpStatusFor(absl::StatusCode code);

// The JSON body, without a trailing newline. Invalid UTF-8 in the message (it may quote a
// client's bytes) is replaced, not thrown on.
std::string HttpErrorJson(const absl::Status& status);
// The same with the HTTP status actually sent as its code, for errors the HTTP layer answers
// by itself (413 for an oversized body has no google.rpc code of its own).
std::string HttpErrorJson(const absl::Status& status, int http_status);

// The errors an HTTP server answers by itself (no route, oversized body, malformed request), as
// the status the same error would have had from a handler. Send it with HttpErrorJson(status,
// http_status), so that a 413 says 413.
absl::Status StatusForHttpError(int http_status);

// The offset of a `Range` header value, the one form the downloads serve: "bytes=N-" (blanks
// around the parts allowed). OUT_OF_RANGE for any other form (several ranges, a closed range,
// a suffix); the caller answers 416. No header at all is offset 0: the caller checks that.
absl::StatusOr<int64_t> OpenRangeOffset(const std::string& range);

}  // namespace gradhub
