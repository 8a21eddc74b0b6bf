#include "services/cli/client_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradhub::cli {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

}  // namespace

std::string StateDir() {
  if (std::string dir = Env("GRADHUB_STATE_DIR"); !dir.empty()) return dir;
  if (std::string dir = Env("XDG_STATE_HOME"); !dir.empty()) return dir + "/gradhub";
  if (geteuid() == 0) return "/var/lib/gradhub/local";
  const std::string home = Env("HOME");
  return (home.empty() ? std::string(".") : home) + "/.gradhub";
}

std::string ClientConfigPath() {
  if (std::string path = Env("GRADHUB_CONFIG"); !path.empty()) return path;
  return StateDir() + "/config";
}

absl::StatusOr<std::map<std::string, std::string>> ReadClientConfig(const std::string& path) {
  std::map<std::string, std::string> values;
  std::ifstream in(path);
  if (!in) {
    if (access(path.c_str(), F_OK) != 0) return values;
    return absl::PermissionDeniedError(absl::StrCat("cannot read the client config ", path));
  }
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    const size_t eq = text.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": not KEY=VALUE: '", text, "'"));
    }
    values[std::string(absl::StripAsciiWhitespace(text.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(text.substr(eq + 1)));
  }
  return values;
}

absl::Status WriteClientConfig(const std::string& path,
                               const std::map<std::string, std::string>& values) {
  const std::string temporary = path + ".tmp";
  {
    // Created 0600 before the token is written into it.
    const mode_t old_mask = umask(077);
    std::ofstream out(temporary, std::ios::trunc);
    umask(old_mask);
    out << "# The gradhub CLI's defaults, written by `gradhub cluster up`; flags and GRADHUB_*\n"
           "# variables override each key.\n";
    for (const auto& [key, value] : values) out << key << "=" << value << "\n";
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", temporary));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", temporary, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace gradhub::cli
