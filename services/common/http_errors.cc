#include "services/common/http_errors.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradhub {

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string HttpErrorJson(const absl::Status& status) {
  return HttpErrorJson(status, HttpStatusFor(status.code()));
}

std::string HttpErrorJson(const absl::Status& status, int http_status) {
  const nlohmann::json body = {{"error",
                                {{"code", http_status},
                                 {"status", absl::StatusCodeToString(status.code())},
                                 {"message", std::string(status.message())}}}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::Status StatusForHttpError(int http_status) {
  switch (http_status) {
    case 404:
      return absl::NotFoundError("no such resource");
    case 413:
      return absl::ResourceExhaustedError("request body is over the size limit");
    case 400:
      return absl::InvalidArgumentError("malformed HTTP request");
    case 401:
      return absl::UnauthenticatedError("a valid bearer token is required");
    case 408:
      return absl::DeadlineExceededError("the request did not arrive in time");
    case 415:
    case 431:
      return absl::InvalidArgumentError(absl::StrCat("request refused (HTTP ", http_status, ")"));
    case 429:
      return absl::ResourceExhaustedError("too many requests; retry later");
    case 501:
      return absl::UnimplementedError("not implemented");
    default:
      return absl::UnknownError(absl::StrCat("HTTP ", http_status));
  }
}

absl::StatusOr<int64_t> OpenRangeOffset(const std::string& range) {
  const absl::Status refused = absl::OutOfRangeError("Range: only a single `bytes=N-` is served");
  absl::string_view rest = absl::StripAsciiWhitespace(range);
  if (!absl::ConsumePrefix(&rest, "bytes")) return refused;
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!absl::ConsumePrefix(&rest, "=") || !absl::ConsumeSuffix(&rest, "-")) return refused;
  rest = absl::StripAsciiWhitespace(rest);
  int64_t offset = 0;
  const bool digits = !rest.empty() && rest.size() <= 18 &&
                      std::all_of(rest.begin(), rest.end(), absl::ascii_isdigit);
  if (!digits || !absl::SimpleAtoi(rest, &offset)) return refused;
  return offset;
}

}  // namespace gradhub
