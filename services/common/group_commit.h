// Group commit for writes each caller must wait for (the audit log's rows, services/common/
// audit/audit_log.h): calls that arrive while a batch is being written queue up and share the
// next batch's statement and durable commit, so under load a commit's fixed costs (round trips,
// BEGIN/COMMIT, the WAL flush) are paid once per batch rather than once per call, and nobody is
// answered before its write is done. The same leader/follower scheme as PostgreSQL's own WAL
// group commit and services/api/job_inserter.h:
//   1. Submit queues the item and waits for its result;
//   2. a waiter that finds no batch in flight leads: it takes the oldest `max_batch` items
//      (which may not include its own, behind a long queue), writes them outside the lock, and
//      hands each its result;
//   3. it then returns, or leads again until its own item is written; the oldest waiter is
//      woken for the next batch.
// A lone call is written at once; batches form only when calls queue. No thread of its own.
// Thread-safe: Submit may be called from any number of threads.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace gradhub {

template <typename Item, typename Result>
class GroupCommit {
 public:
  // Writes one batch (oldest first) and returns one result per item, in the same order.
  using WriteBatch = std::function<std::vector<Result>(const std::vector<const Item*>& items)>;

  GroupCommit(WriteBatch write, int max_batch) : write_(std::move(write)), max_batch_(max_batch) {}

  // Blocks until `item` was written; its own result.
  Result Submit(const Item& item) {
    Request request{&item, std::nullopt, {}};
    std::unique_lock lock(mu_);
    queue_.push_back(&request);
    while (!request.result) {
      if (writing_) {
        request.done.wait(lock);
        continue;
      }
      Lead(lock);
    }
    return std::move(*request.result);
  }

 private:
  struct Request {
    const Item* item;
    std::optional<Result> result;
    std::condition_variable done;
  };

  // Step 2, with `lock` held on entry and exit (released while writing).
  void Lead(std::unique_lock<std::mutex>& lock) {
    std::vector<Request*> batch;
    while (!queue_.empty() && static_cast<int>(batch.size()) < max_batch_) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    writing_ = true;
    lock.unlock();
    std::vector<const Item*> items;
    for (const Request* member : batch) items.push_back(member->item);
    std::vector<Result> results = write_(items);
    lock.lock();
    writing_ = false;
    // Set and announced under the lock: a member that saw its result could return and take its
    // condition variable with it before a notify made after unlocking.
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->result = std::move(results[i]);
      batch[i]->done.notify_one();
    }
    if (!queue_.empty()) queue_.front()->done.notify_one();  // step 3: the next leader
  }

  const WriteBatch write_;
  const int max_batch_;
  std::mutex mu_;
  std::deque<Request*> queue_;  // waiting for a batch, oldest first
  bool writing_ = false;
};

}  // namespace gradhub
