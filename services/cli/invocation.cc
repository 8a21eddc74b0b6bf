#include "services/cli/invocation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/cli/client_config.h"
#include "services/common/api_targets.h"
#include "services/common/grpc_credentials.h"

namespace gradhub::cli {

void GlobalOptions::Register(Flags& flags) {
  flags
      .String("server", "GRADHUB_SERVER", &server,
              "gradhub-api gRPC address, HOST:PORT, or every replica's: HOST:PORT,HOST:PORT")
      .String("checkpoint-server", "GRADHUB_CHECKPOINT_SERVER", &checkpoint_server,
              "gradhub-checkpoint gRPC address, HOST:PORT (for `checkpoints`, `code` and "
              "submit --code)")
      .String("token", "GRADHUB_TOKEN", &token,
              "Bearer token: a tenant token for jobs, the admin token for nodes and admin")
      .String("tls-ca", "GRADHUB_TLS_CA", &tls_ca_file,
              "PEM certificates trusted for TLS to --server (its own certificate, or its CA); "
              "empty = plaintext")
      .String("output", "GRADHUB_OUTPUT", &output,
              "text (for people) or json (the proto3 JSON mapping, for scripts)")
      .Duration("timeout", "GRADHUB_TIMEOUT", &timeout,
                "Deadline of each call (not of watch, logs -f: they last as long as the job)");
}

bool IsGlobalFlagWithValue(const std::string& name) {
  return name == "server" || name == "checkpoint-server" || name == "token" || name == "tls-ca" ||
         name == "output" || name == "timeout";
}

Invocation::Invocation(std::string command, std::string synopsis, std::string summary,
                       std::vector<std::string> args, Io io)
    : command_(std::move(command)),
      synopsis_(synopsis),
      args_(std::move(args)),
      io_(io),
      flags_("gradhub " + command_,
             absl::StrCat("Usage: gradhub ", command_, synopsis.empty() ? "" : " ", synopsis,
                          "\n\n", summary)) {
  globals_.Register(flags_);
}

void Invocation::ShortFlag(const std::string& short_name, const std::string& long_name) {
  extra_flags_.short_names[short_name] = long_name;
}

void Invocation::RepeatedFlag(const std::string& name, std::vector<std::string>* values,
                              const std::string& help) {
  extra_flags_.repeated.emplace_back(name, values);
  // Registered only so that --help lists it; the values never reach Flags.
  extra_flags_.repeated_help_values.emplace_back();
  flags_.String(name, "", &extra_flags_.repeated_help_values.back(), help + " (repeatable)");
}

bool Invocation::Parse(size_t min_positional, size_t max_positional) {
  absl::StatusOr<std::vector<std::string>> args = TakeExtraFlags();
  if (!args.ok()) return Refuse(args.status());
  if (!ApplyClientConfig()) return false;
  std::vector<const char*> argv = {"gradhub"};
  for (const std::string& arg : *args) argv.push_back(arg.c_str());
  absl::StatusOr<Flags::Parsed> parsed = flags_.Parse(static_cast<int>(argv.size()), argv.data());
  if (!parsed.ok()) return Refuse(parsed.status());
  if (parsed->help) {
    out() << flags_.Usage();
    exit_code_ = kOk;
    return false;
  }
  positional_ = std::move(parsed->positional);
  absl::Status checked = CheckPositional(*args, min_positional, max_positional);
  if (checked.ok()) checked = ApplyGlobals();
  return checked.ok() || Refuse(checked);
}

absl::StatusOr<std::vector<std::string>> Invocation::TakeExtraFlags() {
  std::vector<std::string> args;
  for (size_t i = 0; i < args_.size(); ++i) {
    std::string arg = args_[i];
    if (auto alias = extra_flags_.short_names.find(arg); alias != extra_flags_.short_names.end()) {
      arg = alias->second;
    }
    bool taken = false;
    for (auto& [name, values] : extra_flags_.repeated) {
      const std::string flag = "--" + name;
      if (arg == flag) {
        if (i + 1 == args_.size())
          return absl::InvalidArgumentError("flag " + flag + " needs a value");
        values->push_back(args_[++i]);
        taken = true;
      } else if (arg.rfind(flag + "=", 0) == 0) {
        values->push_back(arg.substr(flag.size() + 1));
        taken = true;
      }
    }
    if (arg == "--") {
      // Everything after `--` is positional, even what looks like a flag.
      args.insert(args.end(), args_.begin() + i, args_.end());
      break;
    }
    if (!taken) args.push_back(std::move(arg));
  }
  return args;
}

absl::Status Invocation::CheckPositional(const std::vector<std::string>& args,
                                         size_t min_positional, size_t max_positional) const {
  for (const std::string& arg : args) {
    if (arg == "--") break;
    // Flags takes any other argument starting with "-" (such as "-x") for a positional one;
    // here that is a mistyped flag (not one that Flags consumed as a value, as in `--rank -1`).
    if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-' &&
        std::find(positional_.begin(), positional_.end(), arg) != positional_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
  }
  if (positional_.size() < min_positional) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing argument: gradhub ", command_, " ", synopsis_));
  }
  if (positional_.size() > max_positional) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional_[max_positional], "'"));
  }
  return absl::OkStatus();
}

absl::Status Invocation::ApplyGlobals() {
  if (globals_.output == "text") {
    format_ = Format::kText;
  } else if (globals_.output == "json") {
    format_ = Format::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--output: '", globals_.output, "' is not text or json"));
  }
  if (globals_.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeout: must be positive");
  }
  auto credentials = ClientCredentials(globals_.tls_ca_file);
  if (!credentials.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-ca: ", credentials.status().message()));
  }
  credentials_ = *std::move(credentials);
  // Refused here, naming the flag, rather than as an unreachable server at the first call.
  return ParseApiTarget("--server", globals_.server).status();
}

bool Invocation::Refuse(const absl::Status& usage) {
  UsageError(std::string(usage.message()));
  return false;
}

bool Invocation::ApplyClientConfig() {
  // Before Flags::Parse, which then overrides these with the variables and the flags given.
  // `gradhub cluster` calls no server, and must work (`down` above all) whatever the config.
  if (command_.rfind("cluster ", 0) == 0) return true;
  const std::string path = ClientConfigPath();
  absl::StatusOr<std::map<std::string, std::string>> config = ReadClientConfig(path);
  if (!config.ok()) {
    Fail(kUsage, "USAGE", std::string(config.status().message()));
    return false;
  }
  const std::pair<const char*, std::string*> keys[] = {
      {"server", &globals_.server},
      {"checkpoint-server", &globals_.checkpoint_server},
      {"token", &globals_.token},
      {"tls-ca", &globals_.tls_ca_file}};
  for (const auto& [key, value] : keys) {
    if (auto found = config->find(key); found != config->end()) *value = found->second;
  }
  return true;
}

Client& Invocation::client() {
  if (client_ == nullptr) {
    client_ =
        std::make_unique<Client>(ClientOptions{.server = globals_.server,
                                               .checkpoint_server = globals_.checkpoint_server,
                                               .credentials = credentials_,
                                               .token = globals_.token,
                                               .timeout = globals_.timeout});
  }
  return *client_;
}

int Invocation::Fail(ExitCode code, const std::string& code_name, const std::string& message) {
  err() << "gradhub: " << code_name << ": " << message << "\n";
  exit_code_ = code;
  return code;
}

int Invocation::Fail(const grpc::Status& status, const std::string& server) {
  const std::string& address = server.empty() ? globals_.server : server;
  std::string message = status.error_message();
  if (message.empty()) {
    // gRPC's own errors (a missing service on an older server, a refused connection) may come
    // without a message; say what the code means for this call.
    switch (status.error_code()) {
      case grpc::StatusCode::UNIMPLEMENTED:
        message = "the server at " + address + " does not implement this call";
        break;
      case grpc::StatusCode::UNAVAILABLE:
        message = "cannot reach the server at " + address;
        break;
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        message = "no answer from " + address + " within --timeout";
        break;
      default:
        message = "(no message)";
    }
  }
  return Fail(ExitCodeFor(status.error_code()), StatusCodeName(status.error_code()), message);
}

int Invocation::UsageError(const std::string& message) {
  // Flags' own messages already point at --help.
  const bool has_hint = message.find("--help)") != std::string::npos;
  return Fail(kUsage, "USAGE",
              has_hint ? message : absl::StrCat(message, " (see gradhub ", command_, " --help)"));
}

}  // namespace gradhub::cli
