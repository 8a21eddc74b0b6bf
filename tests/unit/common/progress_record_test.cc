#include "services/common/contract/progress_record.h"

#include <gtest/gtest.h>

#include <limits>

namespace gradhub {
namespace {

// The lines as the trainer printed them before the record had one writer: users and tests
// grep for them, so the writer must reproduce them byte for byte.
TEST(ProgressRecordTest, FormatsProgressAsBefore) {
  ProgressRecord r;
  r.step = 10;
  r.total_steps = 100;
  r.epoch = 0;
  r.loss = 0.25;
  r.learning_rate = 0.01;
  r.samples_per_second = 1234.5;
  r.forward_seconds = 0.001;
  r.backward_seconds = 0.002;
  r.allreduce_wait_seconds = 0;
  r.optimizer_seconds = 0.0005;
  r.step_seconds = 1.0 / 3;
  r.allreduce_bytes = 4096;
  EXPECT_EQ(FormatProgressRecord(r),
            R"({"event":"progress","step":10,"totalSteps":100,"epoch":0,"loss":0.25,"lr":0.01,)"
            R"("samplesPerSecond":1234.5,"forwardSeconds":0.001,"backwardSeconds":0.002,)"
            R"("allreduceWaitSeconds":0,"optimizerSeconds":0.0005,"stepSeconds":0.333333333,)"
            R"("allreduceBytes":4096})");
}

TEST(ProgressRecordTest, FormatsEvalAndDoneAsBefore) {
  ProgressRecord eval;
  eval.event = ProgressEvent::kEval;
  eval.step = 20;
  eval.total_steps = 100;
  eval.eval_metrics = {{"loss", 0.5}, {"accuracy", 0.75}};
  EXPECT_EQ(FormatProgressRecord(eval),
            R"({"event":"eval","step":20,"totalSteps":100,"eval.accuracy":0.75,"eval.loss":0.5})");

  ProgressRecord done;
  done.event = ProgressEvent::kDone;
  done.rank = 1;
  done.step = 100;
  done.total_steps = 100;
  done.loss = 0.125;
  done.train_seconds = 12.5;
  done.allreduce_bytes = 1 << 20;
  done.allreduce_seconds = 0.25;
  done.optimizer_state_bytes = 2048;
  done.bus_bandwidth_bytes_per_second = 4194304;
  done.eval_metrics = {{"accuracy", 0.9}};
  done.checkpoints = 2;
  done.checkpoint_bytes = 65536;
  done.checkpoint_snapshot_seconds = 0.01;
  done.checkpoint_wait_seconds = 0;
  done.parameters_sha256 = "ab12";
  EXPECT_EQ(FormatProgressRecord(done),
            R"({"event":"done","rank":1,"step":100,"totalSteps":100,"loss":0.125,)"
            R"("trainSeconds":12.5,"allreduceBytes":1048576,"allreduceSeconds":0.25,)"
            R"("optimizerStateBytes":2048,"busBandwidthBytesPerSecond":4194304,)"
            R"("eval.accuracy":0.9,"checkpoints":2,"checkpointBytes":65536,)"
            R"("checkpointSnapshotSeconds":0.01,"checkpointWaitSeconds":0,)"
            R"("parametersSha256":"ab12"})");
}

// Rank 0's record of a periodic checkpoint it skipped (the api's CHECKPOINT_SKIPPED event).
TEST(ProgressRecordTest, FormatsAndParsesASkippedCheckpoint) {
  ProgressRecord r;
  r.event = ProgressEvent::kCheckpointSkipped;
  r.step = 60;
  r.total_steps = 100;
  r.checkpoint_in_flight_step = 40;
  r.checkpoint_in_flight_seconds = 2.5;
  const std::string line = FormatProgressRecord(r);
  EXPECT_EQ(line, R"({"event":"checkpoint_skipped","step":60,"totalSteps":100,)"
                  R"("checkpointInFlightStep":40,"checkpointInFlightSeconds":2.5})");
  const std::optional<ProgressRecord> parsed = ParseProgressRecord(line);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->event, ProgressEvent::kCheckpointSkipped);
  EXPECT_EQ(parsed->step, 60);
  EXPECT_EQ(parsed->checkpoint_in_flight_step, 40);
  EXPECT_EQ(parsed->checkpoint_in_flight_seconds, 2.5);
}

TEST(ProgressRecordTest, RoundTripsEveryField) {
  ProgressRecord r;
  r.event = ProgressEvent::kDone;
  r.rank = 3;
  r.step = 123456789012;
  r.total_steps = 200000000000;
  r.epoch = 7;
  r.loss = 1.5e-7;
  r.learning_rate = 3e-4;
  r.samples_per_second = 98765.4321;
  r.forward_seconds = 0.1;
  r.backward_seconds = 0.2;
  r.allreduce_wait_seconds = 0.3;
  r.optimizer_seconds = 0.4;
  r.step_seconds = 0.5;
  r.train_seconds = 600;
  r.allreduce_bytes = int64_t{1} << 40;
  r.allreduce_seconds = 2.5;
  r.optimizer_state_bytes = 12;
  r.bus_bandwidth_bytes_per_second = 1.25e10;
  r.loss_scale = 32768;
  r.skipped_steps = 6;
  r.eval_metrics = {{"accuracy", 0.5}, {"loss", -2}};
  r.checkpoints = 4;
  r.checkpoint_bytes = 5;
  r.checkpoint_snapshot_seconds = 0.75;
  r.checkpoint_wait_seconds = 0.125;
  r.checkpoints_skipped = 2;
  r.parameters_sha256 = "0123abcd";
  r.checkpoint_in_flight_step = 40;
  r.checkpoint_in_flight_seconds = 3.25;
  const std::string line = FormatProgressRecord(r);
  const std::optional<ProgressRecord> parsed = ParseProgressRecord(line);
  ASSERT_TRUE(parsed.has_value()) << line;
  EXPECT_EQ(parsed->event, ProgressEvent::kDone);
  EXPECT_EQ(parsed->rank, 3);
  EXPECT_EQ(parsed->step, 123456789012);
  EXPECT_EQ(parsed->total_steps, 200000000000);
  EXPECT_EQ(parsed->epoch, 7);
  EXPECT_DOUBLE_EQ(*parsed->loss, 1.5e-7);
  EXPECT_DOUBLE_EQ(*parsed->learning_rate, 3e-4);
  EXPECT_NEAR(*parsed->samples_per_second, 98765.4321, 1e-4);  // 9 significant digits
  EXPECT_EQ(parsed->forward_seconds, 0.1);
  EXPECT_EQ(parsed->backward_seconds, 0.2);
  EXPECT_EQ(parsed->allreduce_wait_seconds, 0.3);
  EXPECT_EQ(parsed->optimizer_seconds, 0.4);
  EXPECT_EQ(parsed->step_seconds, 0.5);
  EXPECT_EQ(parsed->train_seconds, 600);
  EXPECT_EQ(parsed->allreduce_bytes, int64_t{1} << 40);
  EXPECT_EQ(parsed->allreduce_seconds, 2.5);
  EXPECT_EQ(parsed->optimizer_state_bytes, 12);
  EXPECT_EQ(parsed->bus_bandwidth_bytes_per_second, 1.25e10);
  EXPECT_EQ(parsed->loss_scale, 32768);
  EXPECT_EQ(parsed->skipped_steps, 6);
  EXPECT_EQ(parsed->eval_metrics, r.eval_metrics);
  EXPECT_EQ(parsed->checkpoints, 4);
  EXPECT_EQ(parsed->checkpoint_bytes, 5);
  EXPECT_EQ(parsed->checkpoint_snapshot_seconds, 0.75);
  EXPECT_EQ(parsed->checkpoint_wait_seconds, 0.125);
  EXPECT_EQ(parsed->checkpoints_skipped, 2);
  EXPECT_EQ(parsed->parameters_sha256, "0123abcd");
  EXPECT_EQ(parsed->checkpoint_in_flight_step, 40);
  EXPECT_EQ(parsed->checkpoint_in_flight_seconds, 3.25);
  // Formatting what was parsed gives the same line again.
  EXPECT_EQ(FormatProgressRecord(*parsed), line);
}

TEST(ProgressRecordTest, NonFiniteNumbersPrintAsNullAndReadBackUnset) {
  ProgressRecord r;
  r.step = 5;
  r.loss = std::numeric_limits<double>::quiet_NaN();
  r.learning_rate = std::numeric_limits<double>::infinity();
  r.samples_per_second = -std::numeric_limits<double>::infinity();
  r.eval_metrics = {{"accuracy", std::numeric_limits<double>::quiet_NaN()}};
  const std::string line = FormatProgressRecord(r);
  EXPECT_EQ(line, R"({"event":"progress","step":5,"loss":null,"lr":null,"samplesPerSecond":null,)"
                  R"("eval.accuracy":null})");
  const std::optional<ProgressRecord> parsed = ParseProgressRecord(line);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_FALSE(parsed->loss.has_value());
  EXPECT_FALSE(parsed->learning_rate.has_value());
  EXPECT_FALSE(parsed->samples_per_second.has_value());
  EXPECT_TRUE(parsed->eval_metrics.empty());
}

TEST(ProgressRecordTest, EscapesStringsAndEvalNames) {
  ProgressRecord r;
  r.event = ProgressEvent::kDone;
  r.step = 1;
  r.eval_metrics = {{"top\"1\"\\x\n", 0.5}};
  r.parameters_sha256 = "a\"b\\c\td\x01";
  const std::string line = FormatProgressRecord(r);
  EXPECT_EQ(line, R"({"event":"done","step":1,"eval.top\"1\"\\x\n":0.5,)"
                  R"("parametersSha256":"a\"b\\c\td\u0001"})");
  const std::optional<ProgressRecord> parsed = ParseProgressRecord(line);
  ASSERT_TRUE(parsed.has_value()) << line;
  EXPECT_EQ(parsed->eval_metrics, r.eval_metrics);
  EXPECT_EQ(parsed->parameters_sha256, r.parameters_sha256);
}

TEST(ProgressRecordTest, ReadsOnlyWhatALineSays) {
  const std::optional<ProgressRecord> eval =
      ParseProgressRecord(R"({"event":"eval","step":9,"eval.top1":0.5,"eval.":1,"eval.x":"y"})");
  ASSERT_TRUE(eval.has_value());
  EXPECT_EQ(eval->event, ProgressEvent::kEval);
  EXPECT_EQ(eval->step, 9);
  EXPECT_EQ(eval->eval_metrics, (std::map<std::string, double>{{"top1", 0.5}}));
  EXPECT_FALSE(eval->total_steps.has_value());
  EXPECT_FALSE(eval->loss.has_value());
  EXPECT_FALSE(eval->rank.has_value());

  // Values of the wrong type are unset; unknown keys are ignored (a newer trainer's).
  const std::optional<ProgressRecord> odd = ParseProgressRecord(
      R"({"event":"progress","step":3,"totalSteps":2.5,"epoch":"1","loss":"x","lr":true,)"
      R"("parametersSha256":7,"futureKey":{"a":[1]},"rank":-1})");
  ASSERT_TRUE(odd.has_value());
  EXPECT_FALSE(odd->total_steps.has_value());
  EXPECT_FALSE(odd->epoch.has_value());
  EXPECT_FALSE(odd->loss.has_value());
  EXPECT_FALSE(odd->learning_rate.has_value());
  EXPECT_FALSE(odd->parameters_sha256.has_value());
  EXPECT_EQ(odd->rank, -1);
}

TEST(ProgressRecordTest, RefusesLinesThatAreNotRecords) {
  for (const char* line : {
           "",
           "step 7 loss 0.25",
           "gradhub-trainer: step 10/100 loss 0.5",
           R"({"step":7,"loss":0.2})",                     // no event first
           R"({"loss":0.2,"event":"progress","step":7})",  // event not first
           R"( {"event":"progress","step":7})",            // leading blank
           R"({"event":"started","step":7})",              // unknown event
           R"({"event":1,"step":7})",
           R"({"event":"progress"})",  // truncated
           R"({"event":"progress","step":7,)",
           R"({"event":"progress","loss":1})",  // no step
           R"({"event":"progress","step":-1,"loss":1})",
           R"({"event":"progress","step":1.5})",
           R"({"event":"progress","step":"7"})",
           R"({"event":"progress","step":null})",
           R"({"event":"progress","step":1e30})",
           R"({"event":"progress","step":7} trailing)",
       }) {
    EXPECT_FALSE(ParseProgressRecord(line).has_value()) << line;
  }
}

TEST(ProgressRecordTest, EventNames) {
  EXPECT_STREQ(ProgressEventName(ProgressEvent::kProgress), "progress");
  EXPECT_STREQ(ProgressEventName(ProgressEvent::kEval), "eval");
  EXPECT_STREQ(ProgressEventName(ProgressEvent::kCheckpointSkipped), "checkpoint_skipped");
  EXPECT_STREQ(ProgressEventName(ProgressEvent::kDone), "done");
}

}  // namespace
}  // namespace gradhub
