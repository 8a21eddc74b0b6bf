#pragma once

#include <string>
#include <vector>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub {

// The JobSpec as users write it: YAML or JSON in the proto3 JSON mapping (camelCase names,
// enum value names; JSON is YAML, so one parser reads both). Unknown fields and enum values
// are errors, so a typo is never silently ignored. Enum names are matched case-insensitively
// (`backend: auto` works). Throws UserError naming the field or the parse position.
v1::JobSpec ParseJobSpec(const std::string& text);
v1::JobSpec LoadJobSpec(const std::string& path);

struct SpecIssue {
  std::string field;  // proto JSON path, e.g. "distributed.worldSize"
  std::string message;
};

struct SpecLimits {
  int max_world_size = 1024;
};

// Every problem with the spec, not only the first, so a user fixes them in one go.
std::vector<SpecIssue> ValidateJobSpec(const v1::JobSpec& spec, const SpecLimits& limits = {});

// Throws UserError listing every issue ValidateJobSpec finds.
void CheckJobSpec(const v1::JobSpec& spec, const SpecLimits& limits = {});

// The spec with the documented default written in wherever a field left it zero (world size
// 1, bucket cap 25 MiB, keep_last 3, ...). The one place where those defaults live.
v1::JobSpec WithDefaults(v1::JobSpec spec);

}  // namespace gradhub
