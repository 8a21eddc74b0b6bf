#include "services/common/contract/data_paths.h"

namespace gradhub {

std::vector<SpecPath> SpecPaths(const v1::JobSpec& spec) {
  std::vector<SpecPath> paths;
  const auto add = [&](const char* field, const std::string& path) {
    if (!path.empty()) paths.push_back({field, path});
  };
  const v1::DatasetSpec& data = spec.dataset();
  if (data.has_csv()) add("dataset.csv.path", data.csv().path());
  if (data.has_idx()) {
    add("dataset.idx.imagesPath", data.idx().images_path());
    add("dataset.idx.labelsPath", data.idx().labels_path());
  }
  if (data.has_text()) add("dataset.text.path", data.text().path());
  if (spec.model().has_torchscript()) {
    add("model.torchscript.path", spec.model().torchscript().path());
  }
  return paths;
}

bool IsCleanPath(const std::string& path) {
  if (path.empty() || path.size() > kMaxSpecPathBytes || path[0] != '/') return false;
  if (path.find('\0') != std::string::npos) return false;
  if (path == "/") return true;
  if (path.back() == '/') return false;
  size_t start = 1;  // after the leading '/'
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string component = path.substr(start, end - start);
    if (component.empty() || component == "." || component == "..") return false;
    start = end + 1;
  }
  return true;
}

bool IsUnderRoot(const std::string& path, const std::string& root) {
  if (!IsCleanPath(path) || !IsCleanPath(root)) return false;
  if (root == "/") return true;
  if (path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

bool IsUnderAnyRoot(const std::string& path, const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    if (IsUnderRoot(path, root)) return true;
  }
  return false;
}

std::string DescribeRoots(const std::vector<std::string>& roots) {
  if (roots.empty()) return "none";
  std::string text;
  for (const std::string& root : roots) text += (text.empty() ? "" : ", ") + root;
  return text;
}

std::string PathProblem(const SpecPath& path, const std::vector<std::string>& roots) {
  if (!IsCleanPath(path.path)) {
    return path.field +
           ": must be an absolute path without '.' or '..' components, empty "
           "components or a trailing '/' (at most 4096 bytes)";
  }
  if (!IsUnderAnyRoot(path.path, roots)) {
    return path.field + ": " + path.path +
           " is not under a data root of this node (allowed: " + DescribeRoots(roots) + ")";
  }
  return "";
}

bool RootsServeSpec(const std::vector<std::string>& roots, const v1::JobSpec& spec) {
  for (const SpecPath& path : SpecPaths(spec)) {
    if (!IsUnderAnyRoot(path.path, roots)) return false;
  }
  return true;
}

std::vector<std::string> SplitRootList(const std::string& text) {
  std::vector<std::string> roots;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(':', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) roots.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return roots;
}

std::string JoinRootList(const std::vector<std::string>& roots) {
  if (roots.empty()) return ":";  // not "": an empty variable counts as unset (flags.h)
  std::string text;
  for (const std::string& root : roots) text += (text.empty() ? "" : ":") + root;
  return text;
}

}  // namespace gradhub
