#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradhub {

// Command-line flags with environment-variable fallbacks, the configuration model of every
// gradhub binary: `--name=value` or `--name value` beats `$ENV_VAR`, which beats the default.
// --help prints every flag with its variable and default.
//
//   Flags flags("gradhub-api", "The gradhub job API.");
//   flags.String("database-url", "GRADHUB_DATABASE_URL", &config.database_url, "PostgreSQL URL");
//   absl::StatusOr<Flags::Parsed> parsed = flags.Parse(argc, argv);
// /proc/<pid>/cmdline is readable by every user of the machine, ranks included: once parsed, the
// values of the secret flags among `names` ("--token", "--admin-token", "--database-url") are
// overwritten in place with 'x' (both "--name value" and "--name=value"), as sshd and postgres
// rewrite theirs. argv[0] and the flags' names stay, so the process is still recognisable.
void HideSecretFlagValues(int argc, char** argv, std::initializer_list<std::string_view> names);

class Flags {
 public:
  struct Parsed {
    bool help = false;                    // --help was given; print Usage() and exit 0
    std::vector<std::string> positional;  // arguments that are not flags, in order
  };

  Flags(std::string program, std::string summary);

  Flags& String(std::string name, std::string env, std::string* value, std::string help);
  Flags& Int(std::string name, std::string env, int64_t* value, std::string help);
  Flags& Bool(std::string name, std::string env, bool* value, std::string help);
  // Durations are written as "30s", "500ms", "2m".
  Flags& Duration(std::string name, std::string env, absl::Duration* value, std::string help);
  // Repeatable: every `--name X` appends X (the first replaces the default); the variable is
  // a ':'-separated list, used only when the flag is not given.
  Flags& StringList(std::string name, std::string env, std::vector<std::string>* value,
                    std::string help);

  // INVALID_ARGUMENT naming the flag (or variable) for an unknown flag or a malformed value.
  absl::StatusOr<Parsed> Parse(int argc, const char* const* argv) const;
  std::string Usage() const;

  // What a program's main does with Parse, in one place: a bad flag prints "<program>: <why>"
  // and --help prints Usage(); both return the exit code to leave with (`usage_exit`, 0).
  // Otherwise nullopt, with the positional arguments in *positional.
  std::optional<int> ParseOrExitCode(int argc, const char* const* argv,
                                     std::vector<std::string>* positional,
                                     int usage_exit = 2) const;

 private:
  enum class Kind { kString, kInt, kBool, kDuration, kStringList };
  struct Flag {
    std::string name, env, help, default_text;
    Kind kind;
    void* value;
  };
  Flags& Add(Flag flag);
  static absl::Status Assign(const Flag& flag, const std::string& text, const std::string& source);
  const Flag* Find(const std::string& name) const;

  std::string program_, summary_;
  std::vector<Flag> flags_;
};

}  // namespace gradhub
