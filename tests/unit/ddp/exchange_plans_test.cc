// The plans of the encrypted collectives (gpu_worker/ddp/comm/gloo/exchange_plans.h), run for
// every rank of a world over in-memory FIFO links in round-robin, each send as early as its
// after_receives allows: each rank finishes with the right result, none ever waits forever,
// every rank ends with the same bits, and the ring moves no more than its 2 (n-1)/n share.
#include "gpu_worker/ddp/comm/gloo/exchange_plans.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace gradhub::ddp {
namespace {

using Message = std::vector<uint8_t>;

struct Network {
  std::map<std::pair<int, int>, std::deque<Message>> links;  // (from, to) -> messages in order
  std::vector<size_t> sent_bytes;
};

// Called for an IncomingChunk with reduce set (int64 elements summed in the tests).
using ReduceFn = std::function<void(const IncomingChunk&, const Message&)>;

// One rank's run of its plan as the sealed pipeline runs it: every send goes out as early as
// its after_receives allows (so a wrong one sends bytes not yet final, and the results show
// it), and each step's send must be out before its receive.
struct RankRun {
  const ExchangePlan* plan = nullptr;
  std::vector<const OutgoingChunk*> sends;
  std::vector<size_t> send_of_step;  // index into sends, or SIZE_MAX
  size_t next_send = 0, next_step = 0, received = 0;

  explicit RankRun(const ExchangePlan& p) : plan(&p) {
    for (const ExchangeStep& step : p.steps) {
      send_of_step.push_back(step.send ? sends.size() : SIZE_MAX);
      if (step.send) sends.push_back(&*step.send);
    }
  }
  bool Done() const { return next_step == plan->steps.size() && next_send == sends.size(); }
};

// Moves rank r as far as it can; true if it moved.
bool Advance(RankRun& run, int r, const ReduceFn& reduce, Network& net) {
  bool moved = false;
  for (;;) {
    while (run.next_send < run.sends.size() &&
           run.sends[run.next_send]->after_receives <= run.received) {
      const OutgoingChunk& out = *run.sends[run.next_send++];
      net.links[{r, run.plan->send_to}].emplace_back(out.plain, out.plain + out.bytes);
      net.sent_bytes[r] += out.bytes;
      moved = true;
    }
    if (run.next_step == run.plan->steps.size()) return moved;
    const ExchangeStep& step = run.plan->steps[run.next_step];
    const size_t own_send = run.send_of_step[run.next_step];
    EXPECT_TRUE(own_send == SIZE_MAX || own_send < run.next_send)
        << "rank " << r << " step " << run.next_step << ": its send waits for a later receive";
    if (step.recv) {
      auto& link = net.links[{run.plan->recv_from, r}];
      if (link.empty()) return moved;
      const Message message = std::move(link.front());
      link.pop_front();
      EXPECT_EQ(message.size(), step.recv->bytes) << "rank " << r << " step " << run.next_step;
      if (step.recv->reduce) {
        reduce(*step.recv, message);
      } else if (!message.empty()) {
        std::memcpy(step.recv->target, message.data(), message.size());
      }
      ++run.received;
    }
    ++run.next_step;
    moved = true;
  }
}

// Runs every rank's plan in round-robin over FIFO links. False when no rank can move although
// some have work left: a deadlock.
bool RunPlans(const std::vector<ExchangePlan>& plans, const ReduceFn& reduce, Network& net) {
  const int n = static_cast<int>(plans.size());
  std::vector<RankRun> runs(plans.begin(), plans.end());
  net.sent_bytes.assign(n, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) moved = Advance(runs[r], r, reduce, net) || moved;
  }
  for (const RankRun& run : runs) {
    if (!run.Done()) return false;
  }
  for (const auto& [link, messages] : net.links) {
    EXPECT_TRUE(messages.empty()) << "undelivered on " << link.first << "->" << link.second;
  }
  return true;
}

std::vector<int64_t> RankValues(int rank, size_t count) {
  std::vector<int64_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<int64_t>(i * 7 + 1) * (rank + 3);
  return values;
}

TEST(ExchangePlansTest, RingAllReduceSumsOnEveryRankAndCompletesEachElementOnce) {
  for (int n = 1; n <= 5; ++n) {
    for (size_t count : {size_t{0}, size_t{1}, size_t(n - 1), size_t(n), size_t(n + 1), size_t{7},
                         size_t{1000}, size_t{4099}}) {
      for (size_t chunk_bytes : {size_t{8}, size_t{24}, size_t{4096}}) {
        SCOPED_TRACE(::testing::Message() << n << " ranks, " << count << " elements, chunks of "
                                          << chunk_bytes << " bytes");
        std::vector<std::vector<int64_t>> data(n);
        std::vector<ExchangePlan> plans;
        for (int r = 0; r < n; ++r) {
          data[r] = RankValues(r, count);
          plans.push_back(RingAllReducePlan(reinterpret_cast<uint8_t*>(data[r].data()), count,
                                            sizeof(int64_t), r, n, chunk_bytes));
        }
        std::map<const uint8_t*, int> completed;  // first byte of an element -> times
        const ReduceFn sum = [&](const IncomingChunk& in, const Message& message) {
          auto* target = reinterpret_cast<int64_t*>(in.target);
          const auto* received = reinterpret_cast<const int64_t*>(message.data());
          for (size_t i = 0; i < in.bytes / sizeof(int64_t); ++i) {
            target[i] += received[i];
            if (in.complete) ++completed[in.target + i * sizeof(int64_t)];
          }
        };
        Network net;
        ASSERT_TRUE(RunPlans(plans, sum, net)) << "deadlock";
        for (size_t i = 0; i < count; ++i) {
          int64_t expected = 0;
          for (int r = 0; r < n; ++r) expected += RankValues(r, count)[i];
          for (int r = 0; r < n; ++r)
            ASSERT_EQ(data[r][i], expected) << "rank " << r << " [" << i << "]";
        }
        if (n < 2) continue;
        // Each element is completed by exactly one rank, its block's owner.
        size_t completions = 0;
        for (const auto& [element, times] : completed) completions += times;
        EXPECT_EQ(completed.size(), count);
        EXPECT_EQ(completions, count);
        const size_t largest_block = (count + n - 1) / n * sizeof(int64_t);
        for (int r = 0; r < n; ++r) {
          EXPECT_LE(net.sent_bytes[r], 2 * (n - 1) * largest_block) << "rank " << r;
        }
      }
    }
  }
}

TEST(ExchangePlansTest, RingAllGatherDeliversEveryRanksInput) {
  for (int n = 1; n <= 4; ++n) {
    for (size_t bytes : {size_t{1}, size_t{5}, size_t{100}}) {
      for (size_t chunk_bytes : {size_t{3}, size_t{64}}) {
        SCOPED_TRACE(::testing::Message()
                     << n << " ranks, " << bytes << " bytes, chunks of " << chunk_bytes);
        std::vector<Message> inputs(n);
        std::vector<std::vector<Message>> outputs(n, std::vector<Message>(n, Message(bytes, 0)));
        std::vector<ExchangePlan> plans;
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < bytes; ++i) inputs[r].push_back(static_cast<uint8_t>(r * 50 + i));
          std::vector<uint8_t*> blocks;
          for (auto& block : outputs[r]) blocks.push_back(block.data());
          plans.push_back(RingAllGatherPlan(inputs[r].data(), blocks, bytes, r, n, chunk_bytes));
        }
        Network net;
        ASSERT_TRUE(RunPlans(plans, nullptr, net)) << "deadlock";
        for (int r = 0; r < n; ++r) {
          outputs[r][r] = inputs[r];  // the caller's copy of its own block
          for (int b = 0; b < n; ++b)
            EXPECT_EQ(outputs[r][b], inputs[b]) << "rank " << r << " block " << b;
          EXPECT_EQ(net.sent_bytes[r], (n - 1) * bytes) << "rank " << r;
        }
      }
    }
  }
}

TEST(ExchangePlansTest, ChainBroadcastFromEveryRootSendsEachByteOncePerLink) {
  for (int n = 1; n <= 4; ++n) {
    for (int root = 0; root < n; ++root) {
      for (size_t bytes : {size_t{1}, size_t{10}, size_t{1000}}) {
        for (size_t chunk_bytes : {size_t{7}, size_t{256}}) {
          SCOPED_TRACE(::testing::Message() << n << " ranks, root " << root << ", " << bytes
                                            << " bytes, chunks of " << chunk_bytes);
          std::vector<Message> data(n, Message(bytes, 0));
          for (size_t i = 0; i < bytes; ++i) data[root][i] = static_cast<uint8_t>(i * 13 + 1);
          std::vector<ExchangePlan> plans;
          for (int r = 0; r < n; ++r) {
            plans.push_back(ChainBroadcastPlan(data[r].data(), bytes, root, r, n, chunk_bytes));
          }
          Network net;
          ASSERT_TRUE(RunPlans(plans, nullptr, net)) << "deadlock";
          for (int r = 0; r < n; ++r) {
            EXPECT_EQ(data[r], data[root]) << "rank " << r;
            const bool last = (r - root + n) % n == n - 1;
            EXPECT_EQ(net.sent_bytes[r], last ? 0 : bytes) << "rank " << r;
          }
        }
      }
    }
  }
}

TEST(ExchangePlansTest, AWorldOfOneExchangesNothing) {
  uint8_t byte = 1;
  std::vector<uint8_t*> outputs = {&byte};
  EXPECT_TRUE(RingAllReducePlan(&byte, 1, 1, 0, 1, 64).steps.empty());
  EXPECT_TRUE(RingAllGatherPlan(&byte, outputs, 1, 0, 1, 64).steps.empty());
  EXPECT_TRUE(ChainBroadcastPlan(&byte, 1, 0, 0, 1, 64).steps.empty());
}

}  // namespace
}  // namespace gradhub::ddp
