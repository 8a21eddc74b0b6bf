// One run of one command: its arguments, the global settings, where it writes, and the error
// conventions every command shares (`gradhub: CODE_NAME: message` on stderr, and the exit
// code from exit_codes.h). Commands declare their own flags on it, next to the code that uses
// them, then call Parse().
#pragma once

#include <grpcpp/support/status.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/cli/client.h"
#include "services/cli/exit_codes.h"
#include "services/cli/output.h"
#include "services/common/flags.h"

namespace gradhub::cli {

// Flags that every command accepts, before or after the command words. Between these defaults
// and the variables come the keys of the client config (client_config.h).
struct GlobalOptions {
  std::string server = "localhost:7070";
  std::string checkpoint_server = "localhost:7071";
  std::string token;
  std::string tls_ca_file;
  std::string output = "text";
  absl::Duration timeout = absl::Seconds(30);

  void Register(Flags& flags);
};

// Whether `name` (without "--") is a global flag; every one of them takes a value. For the scan
// that finds the command words after the global flags.
bool IsGlobalFlagWithValue(const std::string& name);

// Where a command writes. Results go to out, notes and errors to err, so that
// `gradhub submit -f job.yaml` can be captured into a variable.
struct Io {
  std::ostream* out;
  std::ostream* err;
  // Whether out is a terminal (isatty): `watch` redraws one line there, and prints one line
  // per update everywhere else.
  bool out_is_terminal = false;
};

class Invocation {
 public:
  // `command` is the command words ("list", "nodes cordon"), `args` everything else.
  Invocation(std::string command, std::string synopsis, std::string summary,
             std::vector<std::string> args, Io io);

  // Register the command's flags here before Parse(); the global ones are already in it.
  Flags& flags() { return flags_; }
  // `-f` style aliases: Flags knows only `--name`.
  void ShortFlag(const std::string& short_name, const std::string& long_name);
  // A flag that may be given more than once (`--label a=1 --label b=2`); Flags keeps only
  // the last value of a flag, so these are taken out of the arguments before it sees them.
  void RepeatedFlag(const std::string& name, std::vector<std::string>* values,
                    const std::string& help);

  // Parses the arguments. False when the command must stop at once with exit_code(): after
  // --help (0) or a usage error (2, reported). On true, positional() holds between
  // `min_positional` and `max_positional` arguments.
  bool Parse(size_t min_positional, size_t max_positional);
  const std::vector<std::string>& positional() const { return positional_; }
  int exit_code() const { return exit_code_; }

  Format format() const { return format_; }
  // Created on first use, from the parsed global flags.
  Client& client();
  std::ostream& out() { return *io_.out; }
  std::ostream& err() { return *io_.err; }
  bool out_is_terminal() const { return io_.out_is_terminal; }
  const std::string& command() const { return command_; }

  // Report and return the exit code to end with. `server` is the address the failed call went
  // to, named when gRPC gave no message ("" = --server).
  int Fail(const grpc::Status& status, const std::string& server = "");
  const std::string& checkpoint_server() const { return globals_.checkpoint_server; }
  int Fail(ExitCode code, const std::string& code_name, const std::string& message);
  int UsageError(const std::string& message);

 private:
  // Parse's steps. Each returns INVALID_ARGUMENT with the usage message on a mistake.
  // 1. The arguments for Flags: short aliases spelled out, repeated flags taken out into
  //    their vectors, everything after `--` left as it is.
  absl::StatusOr<std::vector<std::string>> TakeExtraFlags();
  // 2. After Flags parsed `args`: no mistyped flag among the positional arguments, and
  //    between min and max of them.
  absl::Status CheckPositional(const std::vector<std::string>& args, size_t min_positional,
                               size_t max_positional) const;
  // 3. The global flags' values: the output format, the timeout, the TLS credentials.
  absl::Status ApplyGlobals();
  // Reports `usage` and returns false, for Parse.
  bool Refuse(const absl::Status& usage);
  // Takes the defaults of the global flags from the client config (client_config.h); false
  // after reporting a config that cannot be read.
  bool ApplyClientConfig();

  // What Flags itself cannot express: `-f` style aliases and repeatable flags.
  struct ExtraFlags {
    std::map<std::string, std::string> short_names;  // "-f" -> "--file"
    std::vector<std::pair<std::string, std::vector<std::string>*>> repeated;
    std::deque<std::string> repeated_help_values;  // Flags keeps a pointer to each (--help)
  };

  std::string command_;
  std::string synopsis_;
  std::vector<std::string> args_;
  Io io_;
  GlobalOptions globals_;
  Flags flags_;
  ExtraFlags extra_flags_;
  std::vector<std::string> positional_;
  Format format_ = Format::kText;
  int exit_code_ = kOk;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // from --tls-ca, set by Parse
  std::unique_ptr<Client> client_;
};

}  // namespace gradhub::cli
