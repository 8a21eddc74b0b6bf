// Which connections an HTTP server has open, and whether one more may open: the admission layer
// of http_server.h, applied on the accepting thread before any worker thread serves the
// connection, so that an excess costs no thread.
//   1. Admit(fd, client) for each accepted connection. When `client` (the peer's address) has
//      max_connections_per_client open, refused: RESOURCE_EXHAUSTED naming the flag. When the
//      server has max_connections open, the connection that has waited longest for a request
//      (idle between requests, or still sending its headers: a slow client) is shut down to make
//      room; when none is waiting (every one is in a handler, a body or a stream), refused.
//   2. A connection is waiting from its admission (its thread may start later). The thread
//      serving it marks it Busy once a request's headers are in, and Waiting again when it waits
//      for the next request. Only waiting connections are ever shut down,
//      so a request being answered is never cut, and a probe's connection is admitted as long as
//      slow clients hold the rest.
//   3. Destroying the Admission, before the fd is closed, removes it: the table never shuts
//      down an fd number after it was closed (and perhaps reused).
// Shutting down is shutdown(fd, SHUT_RDWR): the serving thread's next wait or read sees the end.
//
// Thread-safe. Admissions must not outlive their table.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/edge_limits.h"

namespace gradhub {

class ConnectionTable {
 private:
  struct Entry {
    int fd = -1;
    std::string client;
    bool waiting = true;   // step 2: waiting for a request since `since`
    bool evicted = false;  // shut down to make room; no longer counted
    absl::Time since;
  };

 public:
  // One admitted connection, held by the thread that serves it. Move-only.
  class Admission {
   public:
    Admission() = default;
    Admission(Admission&& other) noexcept
        : table_(std::exchange(other.table_, nullptr)), entry_(other.entry_) {}
    Admission& operator=(Admission&& other) noexcept;
    ~Admission() { Release(); }
    Admission(const Admission&) = delete;
    Admission& operator=(const Admission&) = delete;

    // Step 2.
    void MarkWaiting();
    void MarkBusy();

   private:
    friend class ConnectionTable;
    Admission(ConnectionTable* table, std::list<Entry>::iterator entry)
        : table_(table), entry_(entry) {}
    void Release();

    ConnectionTable* table_ = nullptr;  // null once moved from or released
    std::list<Entry>::iterator entry_;
  };

  // Uses max_connections and max_connections_per_client (both at least 1).
  explicit ConnectionTable(const HttpLimits& limits)
      : max_total_(limits.max_connections), max_per_client_(limits.max_connections_per_client) {}

  // Step 1.
  absl::StatusOr<Admission> Admit(int fd, const std::string& client);
  // Shuts down every waiting connection (the server stops: it serves no further request).
  void ShutDownWaiting();
  // Connections counted against the limits.
  int64_t open() const;
  int64_t open_from(const std::string& client) const;

 private:
  // Under mu_: shuts down the connection waiting longest; false when none waits.
  bool EvictLongestWaiting();
  void Uncount(Entry& entry);

  const int64_t max_total_;
  const int64_t max_per_client_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;                   // guarded by mu_; evicted ones until released
  int64_t open_ = 0;                           // guarded by mu_: entries not evicted
  std::map<std::string, int64_t> per_client_;  // guarded by mu_: none at 0
};

}  // namespace gradhub
