// Data roots of one tenant (gradhub-agent --tenant-data-root TENANT=DIR; docs/architecture.md,
// "Isolation of tenants on a node"). An admin maps tenants to directories; a rank of tenant T
// may read the shared --data-root directories and T's own roots, never another tenant's.
// Enforced twice:
//   1. By path, before the start (isolation.h CheckRankSpec) and in the trainer (its input
//      policy, GRADHUB_DATA_ROOTS): a rank is given only RootsOfTenant. Roots of different
//      owners (the shared ones, each tenant) never overlap, as written or resolved
//      (CheckRootsApart), so no other tenant's file lies under a rank's roots, neither by its
//      spelling nor, after symlinks, by its real path.
//   2. By the file system, for script ranks, whose code can open any file its uid may: a root
//      agent gives each tenant root the group TenantGid(tenant) and mode 0750
//      (RestrictTenantRoot), and only the ranks of that tenant's jobs carry that gid, as a
//      supplementary group (rank_launch.h IsolateRank). Another rank cannot even enter it.
// The gid is base + FNV-1a(tenant) % count (--tenant-gid-base, --tenant-gid-count): the same
// for a tenant whichever other tenants the node serves, across restarts and on every node with
// the same flags, so a leftover process of a tenant never holds another tenant's gid. Two
// tenants of a node whose gids collide are refused at start (CheckGidsDistinct). No group
// entry is needed.
//
// All functions but RestrictTenantRoot are pure; everything here is thread-compatible.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub::agent {

struct TenantRoot {
  std::string tenant;  // tenants/<id>, as RankAssignment.tenant spells it
  std::string path;    // as the flag gave it; SetUpIsolation makes it absolute and clean
  gid_t gid = 0;       // TenantGid
};

// "TENANT=DIR" (one --tenant-data-root) -> {tenants/<id>, DIR}. TENANT is <id> or
// tenants/<id>, the id as the api names tenants ([a-z][a-z0-9-]{0,62}); DIR is not empty.
// INVALID_ARGUMENT naming --tenant-data-root otherwise. No gid yet.
absl::StatusOr<TenantRoot> ParseTenantRootFlag(const std::string& text);

// base + FNV-1a(tenant) % count.
gid_t TenantGid(const std::string& tenant, int64_t base, int64_t count);

// The range [base, base + count) must lie in [1000, 4294967294), apart from the uids of
// script ranks [job_uid_base, job_uid_base + job_uid_count) (a job's primary group has its
// uid's number, so an overlap could give a job another tenant's group) and from `rank_gid`,
// the node rank user's group (every rank carries it). INVALID_ARGUMENT naming
// --tenant-gid-base / --tenant-gid-count.
absl::Status CheckTenantGidRange(int64_t base, int64_t count, int64_t job_uid_base,
                                 int64_t job_uid_count, gid_t rank_gid);

// INVALID_ARGUMENT naming both tenants and --tenant-gid-base when two tenants got one gid.
absl::Status CheckGidsDistinct(const std::vector<TenantRoot>& roots);

// Roots of different owners may not overlap: a tenant root equal to, under or above a shared
// root or another tenant's root is refused (INVALID_ARGUMENT naming --tenant-data-root and
// both paths). Roots of one owner may nest. Paths must be clean (data_paths.h); called once as
// written and once resolved.
absl::Status CheckRootsApart(const std::vector<std::string>& shared,
                             const std::vector<TenantRoot>& tenant_roots);

// What a rank of `tenant` (tenants/<id>; "" = none) may read: the shared roots, then that
// tenant's, in flag order.
std::vector<std::string> RootsOfTenant(const std::vector<std::string>& shared,
                                       const std::vector<TenantRoot>& tenant_roots,
                                       const std::string& tenant);

// The supplementary group a rank of `tenant` carries; 0 when the tenant has no root here.
gid_t GidOfTenant(const std::vector<TenantRoot>& tenant_roots, const std::string& tenant);

// Step 2 above, for a root agent: the directory's group becomes root.gid and its mode 0750
// (its owner keeps it; the files below keep theirs, and must be readable by group or others
// for the tenant's ranks to read them). INTERNAL naming the path when either call fails.
absl::Status RestrictTenantRoot(const TenantRoot& root);

}  // namespace gradhub::agent
