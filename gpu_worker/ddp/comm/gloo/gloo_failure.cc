#include "gpu_worker/ddp/comm/gloo/gloo_failure.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include "gpu_worker/ddp/comm/checks.h"

namespace gradhub::ddp {

std::string GlooFailureReason(std::exception_ptr error, std::chrono::milliseconds timeout) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    if (what.find("Timed out") != std::string::npos ||
        what.find("timed out") != std::string::npos) {
      return detail::StrCat("timed out after ", timeout.count(), " ms (", what, ")");
    }
    if (what.find("closed") != std::string::npos || what.find("reset") != std::string::npos ||
        what.find("Broken pipe") != std::string::npos) {
      return "peer closed the connection (" + what + ")";
    }
    return "I/O error (" + what + ")";
  } catch (const gloo::EnforceNotMet& e) {
    return std::string("gloo check failed (") + e.what() + ")";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace gradhub::ddp
