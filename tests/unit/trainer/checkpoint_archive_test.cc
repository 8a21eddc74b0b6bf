// CheckCheckpointArchive (checkpoint_archive.h): every archive gradhub's trainer writes passes
// and loads; hostile ones are refused with UserError("checkpoint") before torch reads them,
// among them the one the checkpoint_state fuzz target found crashing libtorch's TorchScript
// compiler (tests/fuzz/corpus/checkpoint_state/class_constant.records).
#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/trainer/checkpoint_archive.h"
#include "gpu_worker/trainer/checkpoint_bytes.h"
#include "gpu_worker/trainer/checkpoint_state.h"
#include "gpu_worker/trainer/pipeline_checkpoint_format.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

using ::testing::HasSubstr;

const v1::JobSpec& Spec() {
  static const v1::JobSpec spec = WithDefaults(
      ParseJobSpec("model: {mlp: {layers: [4, 3]}}\n"
                   "dataset: {synthetic: {numSamples: 64, numFeatures: 4, numClasses: 3}}\n"
                   "optimizer: {sgd: {lr: 0.1}}\n"
                   "batchSizePerRank: 8\n"
                   "maxSteps: 10\n"));
  return spec;
}

// A rank's state after one step of `optimizer` (its state holds what that optimizer saves).
struct Trained {
  torch::nn::Sequential model{torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3)};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ddp::LossScaler loss_scaler;

  explicit Trained(const std::string& kind) {
    if (kind == "sgd") {
      optimizer = std::make_unique<torch::optim::SGD>(
          model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
    } else if (kind == "adam") {
      optimizer = std::make_unique<torch::optim::Adam>(
          model->parameters(), torch::optim::AdamOptions(0.01).amsgrad(true));
    } else {
      optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                        torch::optim::AdamWOptions(0.01));
    }
    optimizer->zero_grad();
    model->forward(torch::ones({2, 4})).sum().backward();
    optimizer->step();
  }
  SharedUpdateState shared() { return {optimizer.get(), &loss_scaler}; }
  RankStateParts parts() { return {model.ptr().get(), optimizer.get(), nullptr}; }
  std::string Checkpoint() {
    const std::string rank_state = SerializeRankState(parts());
    return SerializeState(*model, shared(), 7, Spec(), {rank_state, rank_state});
  }
};

// `archive` with each record passed through `change` (nullopt drops it), plus `extra` records.
std::string Rewritten(
    const std::string& archive,
    const std::function<std::optional<std::string>(const std::string&, std::string)>& change,
    const std::map<std::string, std::string>& extra = {}) {
  std::istringstream in(archive);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version") continue;  // the writer adds it
    auto [data, size] = reader.getRecord(name);
    std::optional<std::string> content =
        change(name, std::string(static_cast<const char*>(data.get()), size));
    if (content) writer.writeRecord(name, content->data(), content->size());
  }
  for (const auto& [name, content] : extra)
    writer.writeRecord(name, content.data(), content.size());
  writer.writeEndOfFile();
  return out;
}

// `archive` with `from` replaced by `to` in its first code record that holds it.
std::string WithCode(const std::string& archive, const std::string& from, const std::string& to) {
  bool done = false;
  std::string result = Rewritten(
      archive, [&](const std::string& name, std::string content) -> std::optional<std::string> {
        const size_t at = content.find(from);
        if (!done && name.size() > 3 && name.substr(name.size() - 3) == ".py" &&
            at != std::string::npos) {
          content.replace(at, from.size(), to);
          done = true;
        }
        return content;
      });
  EXPECT_TRUE(done) << "no code record holds " << from;
  return result;
}

void ExpectRefused(const std::string& bytes, const std::string& why) {
  try {
    CheckCheckpointArchive(bytes);
    ADD_FAILURE() << "accepted: " << why;
  } catch (const UserError& error) {
    EXPECT_EQ(error.field(), "checkpoint") << why;
    EXPECT_THAT(error.what(), HasSubstr(why));
  }
}

TEST(CheckpointArchiveTest, WhatTheTrainerWritesPassesAndLoads) {
  for (const std::string kind : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(kind);
    Trained saved(kind);
    const std::string checkpoint = saved.Checkpoint();
    EXPECT_NO_THROW(CheckCheckpointArchive(checkpoint));
    EXPECT_NO_THROW(CheckCheckpointArchive(SerializeRankState(saved.parts())));
    Trained resumed(kind);
    std::string rank_state;
    EXPECT_EQ(RestoreState(checkpoint, *resumed.model, resumed.shared(), Spec(), 1, &rank_state),
              7);
    RestoreRankState(rank_state, resumed.parts());
    for (size_t i = 0; i < saved.model->parameters().size(); ++i) {
      EXPECT_TRUE(saved.model->parameters()[i].equal(resumed.model->parameters()[i]));
    }
  }
}

TEST(CheckpointArchiveTest, TheClassConstantThatCrashedTorchIsRefused) {
  // libtorch 1.13 dies of SIGSEGV compiling this class (ScriptTypeParser::parseClassConstant).
  const std::string hostile = WithCode(Trained("sgd").Checkpoint(), "__buffers__", "__bufcers__");
  ExpectRefused(hostile, "is not an attribute declaration");
  Trained resumed("sgd");
  EXPECT_THROW(RestoreState(hostile, *resumed.model, resumed.shared(), Spec()), UserError);
}

TEST(CheckpointArchiveTest, CodeOtherThanAttributeDeclarationsIsRefused) {
  const std::string checkpoint = Trained("adam").Checkpoint();
  ExpectRefused(WithCode(checkpoint, "  __buffers__ = []\n",
                         "  __buffers__ = []\n  def __setstate__(self, state: str) -> None:\n"
                         "    return None\n"),
                "is not an attribute declaration");
  ExpectRefused(WithCode(checkpoint, "class Module(Module):", "class Module(Other):"),
                "does not declare one class");
  ExpectRefused(WithCode(checkpoint, "step : Tensor", "step : Future[Tensor]"),
                "is not an attribute declaration");
  ExpectRefused(WithCode(checkpoint, "spec : str", "spec : List[List[List[List[List[str]]]]]"),
                "is not an attribute declaration");
  ExpectRefused(
      WithCode(checkpoint, "__parameters__ = [\"step\", ]", "__parameters__ = [\"st\\\"ep\", ]"),
      "is not an attribute declaration");
}

// `archive` with its data pickle changed by `change`.
std::string WithPickle(const std::string& archive,
                       const std::function<void(std::string&)>& change) {
  return Rewritten(archive,
                   [&](const std::string& name, std::string content) -> std::optional<std::string> {
                     if (name == "data.pkl") change(content);
                     return content;
                   });
}

TEST(CheckpointArchiveTest, AStorageLargerThanItsRecordIsRefused) {
  // The first tensor's persistent id: ('storage', torch.FloatStorage, '0', 'cpu', 12), its
  // numel a BININT1 after the location's string and its BINPUT. torch 1.13 makes a storage of
  // the numel the pickle says, over a record of 48 bytes: a 255-element tensor then reads the
  // heap past them (found with the checkpoint_state fuzz target's records; it loads in torch).
  const std::string checkpoint = WithPickle(Trained("sgd").Checkpoint(), [](std::string& pickle) {
    size_t at = pickle.find(std::string("X\x03\x00\x00\x00"
                                        "cpu",
                                        8)) +
                8;
    if (pickle[at] == 'q') at += 2;
    ASSERT_EQ(pickle.substr(at, 2), std::string("K\x0c", 2));
    pickle[at + 1] = static_cast<char>(0xff);
  });
  ExpectRefused(checkpoint, "a storage of 1020 bytes that its record does not hold");
}

TEST(CheckpointArchiveTest, ATensorOfAnotherShapeThanTheModelsIsRefusedAfterTheLoad) {
  // The first weight [3, 4] made [2, 4] over the same storage: a valid archive, which torch
  // loads into the parameter as it is (Tensor::set_).
  Trained saved("sgd");
  const std::string checkpoint = WithPickle(saved.Checkpoint(), [](std::string& pickle) {
    const size_t at = pickle.find(std::string("K\x03K\x04", 4));
    ASSERT_NE(at, std::string::npos);
    pickle[at + 1] = 2;
  });
  EXPECT_NO_THROW(CheckCheckpointArchive(checkpoint));
  Trained resumed("sgd");
  try {
    RestoreState(checkpoint, *resumed.model, resumed.shared(), Spec());
    FAIL() << "expected UserError";
  } catch (const UserError& error) {
    EXPECT_EQ(error.field(), "checkpoint");
    EXPECT_THAT(error.what(), HasSubstr("0.weight is [2, 4] float on cpu in the checkpoint; the "
                                        "model's is [3, 4] float on cpu"));
  }
}

// A checkpoint whose parameters are named otherwise (one written before the zoo's models
// became lists of layers) fails as the user's, saying why, not as a torch error that would
// restart the job in vain.
TEST(CheckpointArchiveTest, ACheckpointOfOtherParameterNamesIsRefusedAsTheUsers) {
  Trained saved("sgd");
  struct Renamed : torch::nn::Module {
    Renamed() {
      register_module("linear0", torch::nn::Linear(4, 3));
      register_module("norm0", torch::nn::BatchNorm1d(3));
    }
  };
  const auto renamed = std::make_shared<Renamed>();
  const std::string checkpoint = SerializeState(*renamed, {}, 7, Spec(), {});
  try {
    RestoreState(checkpoint, *saved.model, {}, Spec());
    FAIL() << "expected UserError";
  } catch (const UserError& error) {
    EXPECT_EQ(error.field(), "checkpoint");
    EXPECT_THAT(error.what(), HasSubstr("written by an older gradhub"));
  }
}

// A pipeline's checkpoint keeps the layer costs its split balanced, readable without its
// stages' states; a checkpoint without them reads as none.
TEST(CheckpointArchiveTest, APipelineCheckpointKeepsTheLayerCostsOfItsSplit) {
  const std::string checkpoint =
      PipelineCheckpointIndex(5, "spec", {0.25, 1.5, 3.0}, {7, 7}) + "stage 0" + "stage 1";
  EXPECT_EQ(ReadPipelineLayerCosts(checkpoint), (std::vector<double>{0.25, 1.5, 3.0}));
  const PipelineState state = ReadPipelineState(checkpoint);
  EXPECT_EQ(state.step, 5);
  EXPECT_EQ(state.spec, "spec");
  EXPECT_EQ(state.layer_costs, (std::vector<double>{0.25, 1.5, 3.0}));
  ASSERT_EQ(state.stage_states.size(), 2u);
  EXPECT_EQ(state.stage_states[0], "stage 0");
  EXPECT_EQ(state.stage_states[1], "stage 1");
  EXPECT_TRUE(ReadPipelineLayerCosts(Trained("sgd").Checkpoint()).empty());
}

// A pipeline's checkpoint from before pipeline_checkpoint_format.h (a torch archive holding
// each stage's state as a string, as stop 42 wrote them) still resumes.
TEST(CheckpointArchiveTest, APipelineCheckpointOfTheArchiveLayoutStillReads) {
  torch::serialize::OutputArchive archive;
  archive.write("step", torch::tensor(int64_t{5}));
  archive.write("spec", c10::IValue(std::string("spec")));
  archive.write("layer_costs", torch::tensor(std::vector<double>{0.25, 1.5}, at::kDouble));
  archive.write("stage_state_0", c10::IValue(std::string("stage 0")));
  archive.write("stage_state_1", c10::IValue(std::string("stage 1")));
  std::ostringstream out;
  archive.save_to(out);
  const std::string checkpoint = out.str();
  EXPECT_EQ(ReadPipelineLayerCosts(checkpoint), (std::vector<double>{0.25, 1.5}));
  const PipelineState state = ReadPipelineState(checkpoint);
  EXPECT_EQ(state.step, 5);
  EXPECT_EQ(state.spec, "spec");
  ASSERT_EQ(state.stage_states.size(), 2u);
  EXPECT_EQ(state.stage_states[0], "stage 0");
  EXPECT_EQ(state.stage_states[1], "stage 1");
}

// A stage's state written to a scratch file (as a pipeline's ranks write theirs) is the same
// archive as in memory, and restores from its mapping.
TEST(CheckpointArchiveTest, AStageStateWrittenToAScratchFileRestoresFromItsMapping) {
  Trained saved("adam");
  ScratchFile file(::testing::TempDir());
  WriteRankState(saved.parts(), file);
  const CheckpointBytes mapped = file.Map();
  EXPECT_TRUE(mapped.mapped());
  EXPECT_EQ(mapped.view(), SerializeRankState(saved.parts()));
  Trained resumed("adam");
  RestoreRankState(mapped.view(), resumed.parts());
  for (size_t i = 0; i < saved.model->parameters().size(); ++i) {
    EXPECT_TRUE(saved.model->parameters()[i].equal(resumed.model->parameters()[i]));
  }
}

TEST(CheckpointArchiveTest, APickleThatWouldMakeTorchAllocateGigabytesIsRefused) {
  const std::string checkpoint = Trained("sgd").Checkpoint();
  // A string's length of 1.6 GB in a pickle of a few KB (the fuzz target's out-of-memory).
  ExpectRefused(WithPickle(checkpoint,
                           [](std::string& pickle) {
                             const size_t at =
                                 pickle.find(std::string("X\x05\x00\x00\x00model", 10));
                             ASSERT_NE(at, std::string::npos);
                             pickle.replace(at + 1, 4, "\x0e\x00__");
                           }),
                "a string past the end");
  // A memo index of 2^32 - 1: torch would grow its memo table to it.
  ExpectRefused(WithPickle(checkpoint,
                           [](std::string& pickle) {
                             const size_t at = pickle.find('q');  // the first BINPUT
                             pickle.replace(at, 2, "r\xff\xff\xff\xff");
                           }),
                "a memo index out of order");
  ExpectRefused(WithPickle(checkpoint, [](std::string& pickle) { pickle.insert(2, "("); }),
                "STOP with more to read, or not one value left");
}

TEST(CheckpointArchiveTest, ARecordClaimingMoreBytesThanTheArchiveIsRefused) {
  // A compressed code record whose zip directory says it inflates to 3.5 GB (found by the
  // fuzz target: the reader allocates that much before inflating).
  std::string checkpoint = Trained("sgd").Checkpoint();
  const std::string name = "archive/code/__torch__/___torch_mangle_0.py";  // deflated
  size_t header = std::string::npos;
  for (size_t at = checkpoint.find("PK\x01\x02"); at != std::string::npos;
       at = checkpoint.find("PK\x01\x02", at + 4)) {
    const size_t name_size =
        static_cast<uint8_t>(checkpoint[at + 28]) + 256 * static_cast<uint8_t>(checkpoint[at + 29]);
    if (name_size == name.size() && checkpoint.compare(at + 46, name.size(), name) == 0) {
      header = at;
    }
  }
  ASSERT_NE(header, std::string::npos);
  checkpoint.replace(header + 24, 4, "\xce\x0f\x00\xd2", 4);  // uncompressed size
  ExpectRefused(checkpoint, "a record that unpacks to more bytes than the whole archive");
}

TEST(CheckpointArchiveTest, RecordsSuchArchivesNeverHaveAreRefused) {
  const std::string checkpoint = Trained("sgd").Checkpoint();
  auto same = [](const std::string&, std::string content) -> std::optional<std::string> {
    return content;
  };
  ExpectRefused(Rewritten(checkpoint, same, {{"extra/notes.txt", "hi"}}),
                "a record whose name such an archive never has");
  ExpectRefused(Rewritten(checkpoint, same, {{"code/__torch__/torch/nn.py", "class A:\n"}}),
                "a record whose name such an archive never has");
  ExpectRefused(
      Rewritten(checkpoint,
                [](const std::string& name, std::string content) -> std::optional<std::string> {
                  return name == "constants.pkl" ? std::string("\x80\x02(K\x01t.", 7) : content;
                }),
      "constants.pkl is not empty");
  ExpectRefused(
      Rewritten(checkpoint,
                [](const std::string& name, std::string content) -> std::optional<std::string> {
                  if (name.find("debug_pkl") != std::string::npos) content[20] ^= 1;
                  return content;
                }),
      "is not a class's");
  ExpectRefused("PK\x03\x04 not really a zip", "not a readable zip archive");
  ExpectRefused(checkpoint.substr(0, checkpoint.size() / 2), "not a readable zip archive");
}

}  // namespace
}  // namespace gradhub::trainer
