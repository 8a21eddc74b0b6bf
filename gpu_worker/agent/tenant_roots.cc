#include "gpu_worker/agent/tenant_roots.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "services/common/contract/data_paths.h"

namespace gradhub::agent {
namespace {

constexpr char kTenantPrefix[] = "tenants/";
constexpr int64_t kLowestGid = 1000;
constexpr int64_t kGidEnd = 4294967294;  // (gid_t)-2 and -1 are "nobody" and "unchanged"

// [a-z][a-z0-9-]{0,62}, as the api checks tenant names (authenticator.cc).
bool IsTenantId(absl::string_view id) {
  if (id.empty() || id.size() > 63 || !absl::ascii_islower(id[0])) return false;
  for (const char c : id) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') return false;
  }
  return true;
}

bool Overlap(const std::string& a, const std::string& b) {
  return IsUnderRoot(a, b) || IsUnderRoot(b, a);
}

bool RangesMeet(int64_t a, int64_t a_count, int64_t b, int64_t b_count) {
  return a < b + b_count && b < a + a_count;
}

}  // namespace

absl::StatusOr<TenantRoot> ParseTenantRootFlag(const std::string& text) {
  const size_t eq = text.find('=');
  absl::string_view tenant = absl::string_view(text).substr(0, eq);
  absl::ConsumePrefix(&tenant, kTenantPrefix);
  if (eq == std::string::npos || eq + 1 == text.size() || !IsTenantId(tenant)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenant-data-root ", text,
                     ": must be TENANT=DIR, TENANT a tenant id ([a-z][a-z0-9-]{0,62}, "
                     "optionally as tenants/<id>) and DIR a directory"));
  }
  return TenantRoot{absl::StrCat(kTenantPrefix, tenant), text.substr(eq + 1), 0};
}

gid_t TenantGid(const std::string& tenant, int64_t base, int64_t count) {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a, 64 bits: stable across builds
  for (const unsigned char c : tenant) hash = (hash ^ c) * 1099511628211ULL;
  return static_cast<gid_t>(base + static_cast<int64_t>(hash % static_cast<uint64_t>(count)));
}

absl::Status CheckTenantGidRange(int64_t base, int64_t count, int64_t job_uid_base,
                                 int64_t job_uid_count, gid_t rank_gid) {
  if (base < kLowestGid || count < 1 || base + count > kGidEnd) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenant-gid-base/--tenant-gid-count: a range of gids above ", kLowestGid - 1,
                     " and below ", kGidEnd));
  }
  if (RangesMeet(base, count, job_uid_base, job_uid_count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tenant-gid-base/--tenant-gid-count: [", base, ", ", base + count,
        ") overlaps the job uids (--job-uid-base/--job-uid-count), whose numbers are also "
        "their jobs' groups"));
  }
  if (RangesMeet(base, count, rank_gid, 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--tenant-gid-base/--tenant-gid-count: [", base,
                                                   ", ", base + count,
                                                   ") holds the rank user's group ", rank_gid));
  }
  return absl::OkStatus();
}

absl::Status CheckGidsDistinct(const std::vector<TenantRoot>& roots) {
  std::map<gid_t, std::string> tenant_of_gid;
  for (const TenantRoot& root : roots) {
    const auto [it, added] = tenant_of_gid.emplace(root.gid, root.tenant);
    if (!added && it->second != root.tenant) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tenant-data-root: ", it->second, " and ", root.tenant, " hash to the same gid ",
          root.gid, "; choose another --tenant-gid-base or --tenant-gid-count"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRootsApart(const std::vector<std::string>& shared,
                             const std::vector<TenantRoot>& tenant_roots) {
  for (size_t i = 0; i < tenant_roots.size(); ++i) {
    const TenantRoot& root = tenant_roots[i];
    for (const std::string& other : shared) {
      if (Overlap(root.path, other)) {
        return absl::InvalidArgumentError(absl::StrCat("--tenant-data-root ", root.tenant, "=",
                                                       root.path, ": overlaps --data-root ", other,
                                                       ", which every tenant reads"));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      const TenantRoot& other = tenant_roots[j];
      if (other.tenant != root.tenant && Overlap(root.path, other.path)) {
        return absl::InvalidArgumentError(absl::StrCat("--tenant-data-root ", root.tenant, "=",
                                                       root.path, ": overlaps the root ",
                                                       other.path, " of another tenant"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> RootsOfTenant(const std::vector<std::string>& shared,
                                       const std::vector<TenantRoot>& tenant_roots,
                                       const std::string& tenant) {
  std::vector<std::string> roots = shared;
  for (const TenantRoot& root : tenant_roots) {
    if (!tenant.empty() && root.tenant == tenant) roots.push_back(root.path);
  }
  return roots;
}

gid_t GidOfTenant(const std::vector<TenantRoot>& tenant_roots, const std::string& tenant) {
  for (const TenantRoot& root : tenant_roots) {
    if (!tenant.empty() && root.tenant == tenant) return root.gid;
  }
  return 0;
}

absl::Status RestrictTenantRoot(const TenantRoot& root) {
  if (chown(root.path.c_str(), static_cast<uid_t>(-1), root.gid) != 0 ||
      chmod(root.path.c_str(), 0750) != 0) {
    return absl::InternalError(absl::StrCat("--tenant-data-root ", root.tenant, "=", root.path,
                                            ": cannot give it group ", root.gid,
                                            " and mode 0750: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace gradhub::agent
