#include "services/api/postgres_rendezvous_backend.h"

#include <initializer_list>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/db/error.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

// Every database failure, as the store's callers see it: retryable, with the cause.
absl::Status Unavailable(const absl::Status& status) {
  return absl::UnavailableError(
      absl::StrCat("the rendezvous store's database: ", status.message()));
}

// One statement on a pooled connection, with no backoff: these calls run on StoreService's
// queue thread, and a client retrying is better than that thread sleeping through an outage.
// An `idempotent` statement whose connection turned out lost (a stale one after a server
// restart) is sent once more on a fresh connection.
absl::StatusOr<db::Result> ExecOnce(db::Pool& pool, std::string_view sql,
                                    std::initializer_list<db::Param> params, bool idempotent) {
  absl::Status failure;
  for (int tries = idempotent ? 2 : 1; tries > 0; --tries) {
    absl::StatusOr<db::Pool::Lease> lease = pool.Acquire();
    if (!lease.ok()) return Unavailable(lease.status());
    absl::StatusOr<db::Result> rows = (*lease)->Exec(sql, params);
    if (rows.ok()) return rows;
    failure = rows.status();
    if (!db::IsConnectionLost(failure) || db::IsSilence(failure)) break;
  }
  return Unavailable(failure);
}

// Counts only when the held value is a decimal int64 and the sum stays one; otherwise the
// upsert changes nothing and returns no row (AddRefused says why). CASE, not AND: SQL does not
// promise to test the pattern before it casts.
constexpr char kAddSql[] =
    "INSERT INTO rendezvous_keys AS k (key, value) VALUES ($1, convert_to($2::bigint::text, "
    "'UTF8'))"
    " ON CONFLICT (key) DO UPDATE"
    " SET value = convert_to((encode(k.value, 'escape')::numeric + $2::bigint)::text, 'UTF8')"
    " WHERE CASE WHEN encode(k.value, 'escape') ~ '^\\s*[+-]?[0-9]{1,30}\\s*$'"
    " THEN encode(k.value, 'escape')::numeric + $2::bigint"
    " BETWEEN -9223372036854775808 AND 9223372036854775807 ELSE false END"
    " RETURNING encode(value, 'escape') AS value";

// The keys travel as one text of comma-separated hex strings: no array literal to escape.
constexpr char kReadValuesSql[] =
    "SELECT key, value FROM rendezvous_keys WHERE key IN"
    " (SELECT decode(h, 'hex') FROM unnest(string_to_array($1, ',')) AS h)";
constexpr char kReadKeysSql[] =
    "SELECT key, ''::bytea AS value FROM rendezvous_keys WHERE key IN"
    " (SELECT decode(h, 'hex') FROM unnest(string_to_array($1, ',')) AS h)";

}  // namespace

std::string PrefixSuccessor(const std::string& prefix) {
  std::string successor = prefix;
  while (!successor.empty() && static_cast<unsigned char>(successor.back()) == 0xff) {
    successor.pop_back();
  }
  if (!successor.empty()) successor.back() = static_cast<char>(successor.back() + 1);
  return successor;
}

absl::Status PostgresRendezvousBackend::Set(const std::string& key, const std::string& value) {
  return ExecOnce(*pool_,
                  "INSERT INTO rendezvous_keys (key, value) VALUES ($1, $2)"
                  " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                  {db::Param::Bytes(key), db::Param::Bytes(value)}, /*idempotent=*/true)
      .status();
}

absl::StatusOr<int64_t> PostgresRendezvousBackend::Add(const std::string& key, int64_t delta) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      ExecOnce(*pool_, kAddSql, {db::Param::Bytes(key), delta}, /*idempotent=*/false));
  if (rows.empty()) return AddRefused(key, delta);
  int64_t result = 0;
  if (!absl::SimpleAtoi(rows.row(0).Get<std::string>("value"), &result)) {
    return absl::InternalError(absl::StrCat("key ", QuoteKey(key), ": Add stored no int64"));
  }
  return result;
}

absl::Status PostgresRendezvousBackend::AddRefused(const std::string& key, int64_t delta) {
  using Values = std::map<std::string, std::string>;
  GRADHUB_ASSIGN_OR_RETURN(Values held, Read({key}, /*with_values=*/true));
  auto it = held.find(key);
  absl::StatusOr<int64_t> sum = AddToCounter(key, it == held.end() ? nullptr : &it->second, delta);
  if (!sum.ok()) return sum.status();
  // The value changed between the upsert and this read: nothing was counted.
  return absl::AbortedError(
      absl::StrCat("key ", QuoteKey(key), " changed during Add; nothing was added, try again"));
}

absl::StatusOr<std::map<std::string, std::string>> PostgresRendezvousBackend::Read(
    const std::vector<std::string>& keys, bool with_values) {
  std::map<std::string, std::string> present;
  if (keys.empty()) return present;
  std::vector<std::string> hex;
  hex.reserve(keys.size());
  for (const std::string& key : keys) hex.push_back(absl::BytesToHexString(key));
  GRADHUB_ASSIGN_OR_RETURN(db::Result rows,
                           ExecOnce(*pool_, with_values ? kReadValuesSql : kReadKeysSql,
                                    {absl::StrJoin(hex, ",")}, /*idempotent=*/true));
  for (db::Row row : rows) {
    present.emplace(db::DecodeBytea(row.Get<std::string>("key")),
                    db::DecodeBytea(row.Get<std::string>("value")));
  }
  return present;
}

absl::StatusOr<int64_t> PostgresRendezvousBackend::DeletePrefix(const std::string& prefix) {
  const std::string successor = PrefixSuccessor(prefix);
  absl::StatusOr<db::Result> rows =
      successor.empty()
          ? ExecOnce(*pool_, "DELETE FROM rendezvous_keys WHERE key >= $1",
                     {db::Param::Bytes(prefix)}, /*idempotent=*/true)
          : ExecOnce(*pool_, "DELETE FROM rendezvous_keys WHERE key >= $1 AND key < $2",
                     {db::Param::Bytes(prefix), db::Param::Bytes(successor)}, /*idempotent=*/true);
  if (!rows.ok()) return rows.status();
  return rows->affected();
}

absl::StatusOr<int64_t> PostgresRendezvousBackend::Size() {
  GRADHUB_ASSIGN_OR_RETURN(db::Result rows,
                           ExecOnce(*pool_, "SELECT count(*) AS n FROM rendezvous_keys", {},
                                    /*idempotent=*/true));
  return rows.row(0).Get<int64_t>("n");
}

}  // namespace gradhub::api
