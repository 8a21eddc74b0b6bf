#include "services/common/contract/script_spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <regex>
#include <set>

namespace gradhub {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

constexpr size_t kMaxArgs = 256;
constexpr size_t kMaxArgBytes = 4096;
constexpr size_t kMaxEnv = 64;

bool HasNul(const std::string& text) { return text.find('\0') != std::string::npos; }

// "" when `path` is a clean relative path, else what is wrong with it.
std::string RelativePathProblem(const std::string& path) {
  if (path.empty()) return "is required: the program to run, relative to the code's top";
  if (path.size() > kMaxArgBytes || HasNul(path)) return "is not a valid path";
  if (path.front() == '/') return "must be relative to the code's top, not absolute";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return "may not hold empty, \".\" or \"..\" components";
    }
    start = end + 1;
  }
  return "";
}

// Step 4: a set field of `message` that is not in `allowed` is refused, by its JSON path.
void RefuseSetFields(const Message& message, const std::string& prefix,
                     const std::set<std::string>& allowed, std::vector<SpecIssue>* issues) {
  std::vector<const FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string path = prefix + field->json_name();
    if (allowed.count(path) != 0) continue;
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated() &&
        allowed.count(path + ".") != 0) {
      RefuseSetFields(message.GetReflection()->GetMessage(message, field), path + ".", allowed,
                      issues);
      continue;
    }
    issues->push_back({path,
                       "is a setting of the built-in trainer; a script job runs its own "
                       "training loop, so leave it out (pass it to the script in "
                       "script.args or script.env)"});
  }
}

void CheckCommand(const v1::ScriptSpec& script, std::vector<SpecIssue>* issues) {
  static const std::regex kDigest("sha256:[0-9a-f]{64}");
  if (!std::regex_match(script.code(), kDigest)) {
    issues->push_back({"script.code",
                       "must be \"sha256:<64 hex>\" of code uploaded to the code store "
                       "(`gradhub submit -f job.yaml --code DIR` uploads a directory)"});
  }
  if (const std::string problem = RelativePathProblem(script.entrypoint()); !problem.empty()) {
    issues->push_back({"script.entrypoint", problem});
  }
  if (static_cast<size_t>(script.args_size()) > kMaxArgs) {
    issues->push_back({"script.args", "at most 256 arguments"});
  }
  for (int i = 0; i < script.args_size(); ++i) {
    if (script.args(i).size() > kMaxArgBytes || HasNul(script.args(i))) {
      issues->push_back(
          {"script.args[" + std::to_string(i) + "]", "at most 4096 bytes, without NUL characters"});
    }
  }
  const std::string& interpreter = script.interpreter();
  if (!interpreter.empty() &&
      (interpreter.front() != '/' || HasNul(interpreter) || interpreter.size() > kMaxArgBytes ||
       interpreter.find("/../") != std::string::npos)) {
    issues->push_back(
        {"script.interpreter", "must be an absolute path on the nodes (empty = /usr/bin/python3)"});
  }
}

void CheckEnv(const v1::ScriptSpec& script, std::vector<SpecIssue>* issues) {
  static const std::regex kName("[A-Z_][A-Z0-9_]{0,127}");
  if (static_cast<size_t>(script.env_size()) > kMaxEnv) {
    issues->push_back({"script.env", "at most 64 variables"});
  }
  for (const auto& [name, value] : script.env()) {
    const std::string field = "script.env." + name;
    if (!std::regex_match(name, kName)) {
      issues->push_back({field, "names are [A-Z_][A-Z0-9_]*, at most 128 characters"});
    } else if (IsReservedScriptVariable(name)) {
      issues->push_back({field, "is set by gradhub for every rank and may not be overridden"});
    } else if (value.size() > 32768 || HasNul(value)) {
      issues->push_back({field, "values are at most 32768 bytes, without NUL characters"});
    }
  }
}

}  // namespace

bool IsReservedScriptVariable(const std::string& name) {
  static const std::set<std::string> kReserved = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
      "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
      "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "HOME", "PYTHONUNBUFFERED", "USER", "LOGNAME",
      // the node's interfaces, set by its agent
      "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"};
  return kReserved.count(name) != 0 || name.rfind("GRADHUB_", 0) == 0 ||
         name.rfind("TORCHELASTIC_", 0) == 0;
}

std::vector<SpecIssue> ValidateScriptSpec(const v1::JobSpec& spec) {
  std::vector<SpecIssue> issues;
  CheckCommand(spec.script(), &issues);
  CheckEnv(spec.script(), &issues);
  // distributed.encryptTraffic is refused with its own reason (job_spec.cc CheckEncryptTraffic).
  static const std::set<std::string> kAllowed = {"displayName",
                                                 "labels",
                                                 "priority",
                                                 "seed",
                                                 "nodeSelector",
                                                 "maxRestarts",
                                                 "hangTimeoutSeconds",
                                                 "memoryPerRankMib",
                                                 "script",
                                                 "checkpoint.",
                                                 "checkpoint.keepLast",
                                                 "distributed.",
                                                 "distributed.worldSize",
                                                 "distributed.ranksPerNode",
                                                 "distributed.backend",
                                                 "distributed.collectiveTimeoutSeconds",
                                                 "distributed.encryptTraffic"};
  RefuseSetFields(spec, "", kAllowed, &issues);
  return issues;
}

}  // namespace gradhub
