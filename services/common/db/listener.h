// Signals between processes that share one PostgreSQL: LISTEN/NOTIFY.
//
// A notification is a hint that something changed, never the change itself: it is lost when
// no listener is connected at the moment it is delivered, so whoever acts on one reads the
// state it concerns from the database afterwards, and reads everything again after a gap
// (on_reconnected). Sent inside the transaction that made the change (Notify(Transaction&)),
// it is delivered only once that transaction commits, and never when it rolls back; sent after
// a commit (Notify(Pool&)), it arrives after the change is visible.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/common/db/connection.h"
#include "services/common/db/pool.h"

namespace gradhub::db {

// PostgreSQL refuses payloads of 8000 bytes or more.
inline constexpr size_t kMaxNotifyPayloadBytes = 7999;

// OK, or INVALID_ARGUMENT naming `field`: a channel is 1-63 characters of [a-z0-9_], not
// starting with a digit, so that it is the same identifier quoted or not.
absl::Status CheckChannelName(std::string_view channel, std::string_view field = "channel");

// Sends `payload` on `channel` as part of `tx`: delivered when tx commits, never if it rolls
// back. INVALID_ARGUMENT naming the channel or payload for bad ones (sent nowhere).
absl::Status Notify(Transaction& tx, std::string_view channel, std::string_view payload);
// The same outside a transaction (delivered at once). Pool::Exec may run it twice after a lost
// connection, so a listener may receive it twice: notifications are hints.
absl::Status Notify(Pool& pool, std::string_view channel, std::string_view payload);

struct ListenerOptions {
  // Its connection; silence_timeout bounds how long a dead link goes unnoticed (keepalives
  // run once a second on the idle connection, connection.h).
  ConnectionOptions connection;
  std::vector<std::string> channels;  // CheckChannelName each; at least one
  // Every notification on one of the channels, in the order the server delivers them.
  std::function<void(const std::string& channel, const std::string& payload)> on_notification;
  // After each reconnect (not the first connect): notifications sent meanwhile are lost, so the
  // consumer must read again whatever it watches. Optional.
  std::function<void()> on_reconnected;
  // Between failed connects: doubles from the first to the last.
  absl::Duration first_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  // How often an idle wait looks whether Stop was called.
  absl::Duration stop_check = absl::Milliseconds(100);
};

// One dedicated connection that LISTENs on a set of channels and calls on_notification for
// each notification, on a thread of its own.
//
// Protocol, on that thread:
//   1. Connect (Connection::Open, bounded by connect_timeout) and LISTEN on every channel.
//   2. Wait for the socket with poll(2), at most stop_check at a time; when readable,
//      PQconsumeInput, then call on_notification for each PQnotifies entry.
//   3. The connection lost (closed, reset, or silent past silence_timeout: the kernel drops an
//      idle link whose keepalives go unanswered): back to 1 after a backoff that grows from
//      first_backoff to max_backoff, reset by a successful connect.
//   4. Connected again: on_reconnected, then 2.
//
// Failure cases:
//   - Notifications sent while it is away (steps 3-4) are lost, as are those sent before the
//     first LISTEN took effect (WaitUntilListening); on_reconnected covers the first kind, a
//     consumer reads its state after Start for the second.
//   - The database down: connects fail at once (refused) or after connect_timeout (silent);
//     the listener logs one line per outage (error.h logs each failed connect).
//   - A callback that blocks delays every later notification (the server queues them); one
//     that throws ends the process. Callbacks must not call Stop (it joins their thread).
//   - Stop while a connect waits on a silent database returns when that connect gives up
//     (connect_timeout); otherwise within stop_check.
//
// Thread-safety: Start, Stop and the destructor from the owning thread; WaitUntilListening
// and listening() from any thread. The callbacks run only on the listener's thread, one at a
// time.
class Listener {
 public:
  explicit Listener(ListenerOptions options);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // INVALID_ARGUMENT naming the field for bad options (nothing started); otherwise starts the
  // thread, which connects in the background (step 1). At most once.
  absl::Status Start();
  // Ends the thread (see Failure cases for how soon). Idempotent.
  void Stop();

  // Whether every LISTEN is in effect now, waiting until `deadline` for it.
  bool WaitUntilListening(absl::Time deadline);
  bool listening() const { return listening_; }

 private:
  absl::Status CheckOptions() const;
  void Run();
  // Step 1: a connection listening on every channel, or why not.
  absl::StatusOr<std::unique_ptr<Connection>> ConnectAndListen();
  // Step 2 until the connection is lost (returns why) or Stop (OK).
  absl::Status Receive(Connection& connection);
  // Calls on_notification for every notification libpq has read.
  void Deliver(PGconn* conn);
  void SetListening(bool listening);
  // Sleeps `pause` or until Stop; returns whether to go on.
  bool Pause(absl::Duration pause);

  const ListenerOptions options_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> listening_{false};
  std::mutex mu_;                    // for the waits below
  std::condition_variable changed_;  // listening_ or stopping_
};

}  // namespace gradhub::db
