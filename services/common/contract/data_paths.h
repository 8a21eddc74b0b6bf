// Which files a job may name, as the api, the agent and the trainer all decide it.
//
// A node serves the files under its data roots (gradhub-agent --data-root, repeatable; the
// node advertises them at RegisterNode). Every path a JobSpec names (SpecPaths) must lie under
// one of them. The decisions here are lexical and pure: the api cannot see a node's disk, so it
// checks the spelling (absolute, no "." or ".." components) and the prefix. The agent and the
// trainer add what only the node can check (data_file.h in gpu_worker/data): symlinks resolved,
// only regular files, the size cap, and the same rules again on the file actually opened.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub {

// One path a spec names, with its field in proto JSON spelling ("dataset.csv.path").
struct SpecPath {
  std::string field;
  std::string path;
};

// Every non-empty file path in `spec`: dataset.csv.path, dataset.idx.imagesPath,
// dataset.idx.labelsPath, dataset.text.path, model.torchscript.path. A new path field in
// jobs.proto must be added here, or it escapes every check below.
std::vector<SpecPath> SpecPaths(const v1::JobSpec& spec);

// Absolute, at most kMaxSpecPathBytes, no NUL, no empty, "." or ".." component, no trailing
// slash ("/" itself is clean). Clean paths can be compared as strings.
inline constexpr size_t kMaxSpecPathBytes = 4096;
bool IsCleanPath(const std::string& path);

// `path` equals `root` or lies below it, on a component boundary ("/data" covers "/data/x"
// but not "/database"). Both must be clean, else false.
bool IsUnderRoot(const std::string& path, const std::string& root);
bool IsUnderAnyRoot(const std::string& path, const std::vector<std::string>& roots);

// "/a, /b", or "none" when there are no roots: for messages.
std::string DescribeRoots(const std::vector<std::string>& roots);

// Why `path` (named by `field`) is not servable from `roots`, or "" when it is: not clean, or
// under none of them. The message names the field and the allowed roots, never more of the
// path's file than its name.
std::string PathProblem(const SpecPath& path, const std::vector<std::string>& roots);

// True when every path of `spec` is under `roots`.
bool RootsServeSpec(const std::vector<std::string>& roots, const v1::JobSpec& spec);

// A data root as configured: made absolute and clean by the caller; here only the
// ':'-separated list the agent hands the trainer (GRADHUB_DATA_ROOTS) is parsed and written.
// Roots containing ':' cannot be passed that way (the agent refuses them at start). No roots
// is written ":", because an empty variable reads as unset, and the trainer's default (when
// unset) is to allow any path.
std::vector<std::string> SplitRootList(const std::string& text);
std::string JoinRootList(const std::vector<std::string>& roots);

}  // namespace gradhub
