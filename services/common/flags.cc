#include "services/common/flags.h"

#include <cstring>

#include <iostream>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/status_macros.h"

namespace gradhub {

Flags::Flags(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

Flags& Flags::Add(Flag flag) {
  flags_.push_back(std::move(flag));
  return *this;
}

Flags& Flags::String(std::string name, std::string env, std::string* value, std::string help) {
  return Add({std::move(name), std::move(env), std::move(help), "\"" + *value + "\"", Kind::kString,
              value});
}

Flags& Flags::Int(std::string name, std::string env, int64_t* value, std::string help) {
  return Add({std::move(name), std::move(env), std::move(help), std::to_string(*value), Kind::kInt,
              value});
}

Flags& Flags::Bool(std::string name, std::string env, bool* value, std::string help) {
  return Add({std::move(name), std::move(env), std::move(help), *value ? "true" : "false",
              Kind::kBool, value});
}

Flags& Flags::Duration(std::string name, std::string env, absl::Duration* value, std::string help) {
  return Add({std::move(name), std::move(env), std::move(help), absl::FormatDuration(*value),
              Kind::kDuration, value});
}

Flags& Flags::StringList(std::string name, std::string env, std::vector<std::string>* value,
                         std::string help) {
  std::string text;
  for (const std::string& item : *value) text += (text.empty() ? "" : ":") + item;
  return Add({std::move(name), std::move(env), std::move(help), "\"" + text + "\"",
              Kind::kStringList, value});
}

const Flags::Flag* Flags::Find(const std::string& name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

absl::Status Flags::Assign(const Flag& flag, const std::string& text, const std::string& source) {
  auto bad = [&](const char* expected) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": '", text, "' is not ", expected));
  };
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.value) = text;
      return absl::OkStatus();
    case Kind::kInt:
      if (!absl::SimpleAtoi(text, static_cast<int64_t*>(flag.value))) return bad("an integer");
      return absl::OkStatus();
    case Kind::kBool:
      if (!absl::SimpleAtob(text, static_cast<bool*>(flag.value))) return bad("true or false");
      return absl::OkStatus();
    case Kind::kDuration:
      if (!absl::ParseDuration(text, static_cast<absl::Duration*>(flag.value))) {
        return bad("a duration such as 30s or 500ms");
      }
      return absl::OkStatus();
    case Kind::kStringList: {
      auto* list = static_cast<std::vector<std::string>*>(flag.value);
      if (source.rfind("--", 0) == 0) {
        list->push_back(text);
        return absl::OkStatus();
      }
      list->clear();  // from the variable: a ':'-separated list
      for (size_t start = 0; start <= text.size();) {
        const size_t end = std::min(text.find(':', start), text.size());
        if (end > start) list->push_back(text.substr(start, end - start));
        start = end + 1;
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown flag kind");
}

absl::StatusOr<Flags::Parsed> Flags::Parse(int argc, const char* const* argv) const {
  Parsed parsed;
  std::set<std::string> from_command_line;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      continue;
    }
    if (arg == "--") {
      for (++i; i < argc; ++i) parsed.positional.push_back(argv[i]);
      break;
    }
    if (arg.rfind("--", 0) != 0) {
      parsed.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), text;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      text = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = Find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see ", program_, " --help)"));
    }
    if (!has_value) {
      if (flag->kind == Kind::kBool) {
        text = "true";
      } else if (i + 1 < argc) {
        text = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    // A list flag's first occurrence replaces its default; later ones append.
    if (flag->kind == Kind::kStringList && from_command_line.count(name) == 0) {
      static_cast<std::vector<std::string>*>(flag->value)->clear();
    }
    GRADHUB_RETURN_IF_ERROR(Assign(*flag, text, "--" + name));
    from_command_line.insert(name);
  }
  for (const Flag& flag : flags_) {
    if (from_command_line.count(flag.name) > 0 || flag.env.empty()) continue;
    if (const char* text = std::getenv(flag.env.c_str()); text != nullptr && *text != '\0') {
      GRADHUB_RETURN_IF_ERROR(Assign(flag, text, "$" + flag.env));
    }
  }
  return parsed;
}

std::optional<int> Flags::ParseOrExitCode(int argc, const char* const* argv,
                                          std::vector<std::string>* positional,
                                          int usage_exit) const {
  absl::StatusOr<Parsed> parsed = Parse(argc, argv);
  if (!parsed.ok()) {
    std::cerr << program_ << ": " << parsed.status().message() << "\n";
    return usage_exit;
  }
  if (parsed->help) {
    std::cout << Usage();
    return 0;
  }
  *positional = std::move(parsed->positional);
  return std::nullopt;
}

std::string Flags::Usage() const {
  std::string usage = absl::StrCat(summary_,
                                   "\n\nFlags (a flag beats its variable, which beats "
                                   "the default):\n");
  for (const Flag& flag : flags_) {
    absl::StrAppendFormat(&usage, "  --%s%s\n      %s (default %s)\n", flag.name,
                          flag.env.empty() ? "" : absl::StrCat("  [$", flag.env, "]"), flag.help,
                          flag.default_text);
  }
  absl::StrAppend(&usage, "  --help\n      Print this and exit.\n");
  return usage;
}

void HideSecretFlagValues(int argc, char** argv, std::initializer_list<std::string_view> names) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    for (const std::string_view name : names) {
      char* value = nullptr;
      if (arg == name && i + 1 < argc) value = argv[i + 1];
      if (arg.size() > name.size() && arg.substr(0, name.size()) == name &&
          arg[name.size()] == '=') {
        value = argv[i] + name.size() + 1;
      }
      if (value != nullptr) std::memset(value, 'x', std::strlen(value));
    }
  }
}

}  // namespace gradhub
