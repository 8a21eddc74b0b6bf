#include "services/checkpoint/key_store.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

constexpr char kKeyColumns[] =
    "id::text AS id, tenant_id, wrapped_key, master_key_id FROM checkpoint_keys";

std::optional<int64_t> TenantOf(const KeyScope& scope) { return scope.tenant_id; }

}  // namespace

absl::StatusOr<std::string> UuidBytes(std::string_view uuid) {
  const std::string text(uuid);
  const std::string hex = absl::StrReplaceAll(text, {{"-", ""}});
  if (text.size() != 36 || hex.size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a uuid"));
  }
  return sealed::FromHex(hex);
}

std::string UuidText(std::string_view bytes) {
  const std::string hex = sealed::ToHex(bytes);
  return absl::StrCat(hex.substr(0, 8), "-", hex.substr(8, 4), "-", hex.substr(12, 4), "-",
                      hex.substr(16, 4), "-", hex.substr(20));
}

absl::StatusOr<DataKey> KeyStore::FromRow(const db::Row& row) {
  GRADHUB_ASSIGN_OR_RETURN(std::string id, UuidBytes(row.Get<std::string>("id")));
  {
    absl::MutexLock lock(&mu_);
    auto cached = cache_.find(id);
    if (cached != cache_.end()) return cached->second;
  }
  const std::string master_id = row.Get<std::string>("master_key_id");
  if (master_id != master_->id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("data key ", UuidText(id), " is wrapped by master key ", master_id,
                     ", and this server holds master key ", master_->id(),
                     ": run `gradhub-checkpoint --old-master-key-file OLD rewrap-keys`"));
  }
  const KeyScope scope{row.Get<std::optional<int64_t>>("tenant_id")};
  GRADHUB_ASSIGN_OR_RETURN(
      const sealed::SecretKey key,
      master_->Unwrap(db::DecodeBytea(row.Get<std::string>("wrapped_key")), id, scope));
  DataKey data_key{id, scope, std::make_shared<const sealed::SecretKey>(key)};
  absl::MutexLock lock(&mu_);
  return cache_.emplace(std::move(id), std::move(data_key)).first->second;
}

absl::StatusOr<DataKey> KeyStore::Insert(db::Transaction& tx, const KeyScope& scope) {
  DataKey key{sealed::RandomBytes(sealed::kKeyIdBytes), scope,
              std::make_shared<const sealed::SecretKey>(sealed::SecretKey::Random())};
  // ON CONFLICT: another server (or call) made the scope's current key first; it is read back.
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("INSERT INTO checkpoint_keys (id, tenant_id, wrapped_key, master_key_id)"
              " VALUES ($1::uuid, $2::bigint, $3::bytea, $4) ON CONFLICT DO NOTHING",
              {UuidText(key.id), TenantOf(scope), db::Param::Bytes(master_->Wrap(key)),
               master_->id()})
          .status());
  return key;
}

absl::StatusOr<DataKey> KeyStore::Current(const KeyScope& scope) {
  const std::string select =
      absl::StrCat("SELECT ", kKeyColumns,
                   " WHERE tenant_id IS NOT DISTINCT FROM $1::bigint AND retire_time IS NULL");
  for (int tries = 0; tries < 2; ++tries) {
    GRADHUB_ASSIGN_OR_RETURN(db::Result rows, pool_->Exec(select, {TenantOf(scope)}));
    if (!rows.empty()) return FromRow(rows.row(0));
    GRADHUB_RETURN_IF_ERROR(pool_->Transact(
        [&](db::Transaction& tx) -> absl::Status { return Insert(tx, scope).status(); }));
  }
  return absl::UnavailableError(absl::StrCat("no current data key of ", scope.ToString()));
}

absl::StatusOr<DataKey> KeyStore::Find(std::string_view id) {
  {
    absl::MutexLock lock(&mu_);
    auto cached = cache_.find(std::string(id));
    if (cached != cache_.end()) return cached->second;
  }
  if (id.size() != sealed::kKeyIdBytes) {
    return absl::NotFoundError(absl::StrCat("no data key ", sealed::ToHex(id)));
  }
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec(absl::StrCat("SELECT ", kKeyColumns, " WHERE id = $1::uuid"), {UuidText(id)}));
  if (rows.empty()) return absl::NotFoundError(absl::StrCat("no data key ", UuidText(id)));
  return FromRow(rows.row(0));
}

absl::StatusOr<DataKey> KeyStore::Rotate(const KeyScope& scope) {
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<DataKey> {
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("UPDATE checkpoint_keys SET retire_time = now()"
                " WHERE tenant_id IS NOT DISTINCT FROM $1::bigint AND retire_time IS NULL",
                {TenantOf(scope)})
            .status());
    return Insert(tx, scope);
  });
}

absl::StatusOr<int> KeyStore::Rewrap(const MasterKey& old_master) {
  if (old_master.id() == master_->id()) {
    return absl::InvalidArgumentError(
        "--old-master-key-file: the same key as --master-key-file; nothing to re-wrap");
  }
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<int> {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result rows,
        tx.Exec(absl::StrCat("SELECT ", kKeyColumns, " WHERE master_key_id = $1 FOR UPDATE"),
                {old_master.id()}));
    int rewrapped = 0;
    for (const db::Row& row : rows) {
      GRADHUB_ASSIGN_OR_RETURN(const std::string id, UuidBytes(row.Get<std::string>("id")));
      const KeyScope scope{row.Get<std::optional<int64_t>>("tenant_id")};
      GRADHUB_ASSIGN_OR_RETURN(
          const sealed::SecretKey key,
          old_master.Unwrap(db::DecodeBytea(row.Get<std::string>("wrapped_key")), id, scope));
      const DataKey data_key{id, scope, std::make_shared<const sealed::SecretKey>(key)};
      GRADHUB_RETURN_IF_ERROR(
          tx.Exec("UPDATE checkpoint_keys SET wrapped_key = $2::bytea, master_key_id = $3"
                  " WHERE id = $1::uuid",
                  {UuidText(id), db::Param::Bytes(master_->Wrap(data_key)), master_->id()})
              .status());
      ++rewrapped;
    }
    return rewrapped;
  });
}

absl::Status KeyStore::CheckAllWrappedByMaster() {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec("SELECT master_key_id, count(*) AS n FROM checkpoint_keys"
                  " WHERE master_key_id <> $1 GROUP BY master_key_id ORDER BY master_key_id",
                  {master_->id()}));
  if (rows.empty()) return absl::OkStatus();
  std::vector<std::string> others;
  for (const db::Row& row : rows) {
    others.push_back(absl::StrCat(row.Get<int64_t>("n"), " by master key ",
                                  row.Get<std::string>("master_key_id")));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "data keys are wrapped by another master key than --master-key-file's (", master_->id(),
      "): ", absl::StrJoin(others, ", "),
      ". Re-wrap them: gradhub-checkpoint --master-key-file NEW --old-master-key-file OLD "
      "rewrap-keys"));
}

}  // namespace gradhub::checkpoint
