// Datasets, the distributed sampler and the batch loader, on small files written per test.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gpu_worker/data/batch_loader.h"
#include "gpu_worker/data/dataset.h"
#include "gpu_worker/data/sampler.h"
#include "services/common/contract/user_error.h"

namespace gradhub::data {
namespace {

using ::testing::HasSubstr;

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

class DataFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gradhub-data-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string WriteGzip(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    gzFile file = gzopen(path.c_str(), "wb");
    gzwrite(file, text.data(), static_cast<unsigned>(text.size()));
    gzclose(file);
    return path;
  }
  std::filesystem::path dir_;
};

v1::DatasetSpec Csv(const std::string& path) {
  v1::DatasetSpec spec;
  spec.mutable_csv()->set_path(path);
  return spec;
}

TEST(DistributedSamplerTest, ShardsAreDisjointEqualAndCoverEverything) {
  for (bool drop_last : {false, true}) {
    std::vector<std::vector<int64_t>> shards;
    for (int rank = 0; rank < 3; ++rank) {
      DistributedSampler sampler(Iota(10), 3, rank, 7, /*shuffle=*/true, drop_last);
      shards.push_back(sampler.EpochIndices(0));
      EXPECT_EQ(static_cast<int64_t>(shards.back().size()), sampler.per_rank());
    }
    EXPECT_EQ(shards[0].size(), drop_last ? 3u : 4u);
    EXPECT_EQ(shards[0].size(), shards[1].size());
    EXPECT_EQ(shards[1].size(), shards[2].size());
    std::multiset<int64_t> all;
    for (const auto& shard : shards) all.insert(shard.begin(), shard.end());
    if (drop_last) {
      EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 9u) << "no index twice";
    } else {
      EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 10u) << "every index";
      EXPECT_EQ(all.size(), 12u) << "padded by wrapping around";
    }
  }
}

TEST(DistributedSamplerTest, EpochsShuffleDifferentlyButReproducibly) {
  DistributedSampler a(Iota(100), 2, 0, 5, true, false);
  DistributedSampler b(Iota(100), 2, 0, 5, true, false);
  EXPECT_EQ(a.EpochIndices(3), b.EpochIndices(3));
  EXPECT_NE(a.EpochIndices(0), a.EpochIndices(1));
  DistributedSampler ordered(Iota(6), 2, 1, 5, /*shuffle=*/false, false);
  EXPECT_EQ(ordered.EpochIndices(4), (std::vector<int64_t>{1, 3, 5}));
}

TEST(DistributedSamplerTest, SeededShuffleIsAFixedPermutation) {
  std::vector<int64_t> values = Iota(8);
  SeededShuffle(values, 42);
  std::vector<int64_t> again = Iota(8);
  SeededShuffle(again, 42);
  EXPECT_EQ(values, again);
  std::vector<int64_t> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Iota(8));
}

TEST(SplitIndicesTest, DeterministicDisjointAndSized) {
  Split a = SplitIndices(100, 0.2, 9);
  Split b = SplitIndices(100, 0.2, 9);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.validation, b.validation);
  EXPECT_EQ(a.validation.size(), 20u);
  EXPECT_EQ(a.train.size(), 80u);
  std::set<int64_t> all(a.train.begin(), a.train.end());
  all.insert(a.validation.begin(), a.validation.end());
  EXPECT_EQ(all.size(), 100u);
  EXPECT_NE(SplitIndices(100, 0.2, 10).validation, a.validation);
}

TEST_F(DataFileTest, CsvWithHeaderAndNamedLabel) {
  v1::DatasetSpec spec = Csv(Write("h.csv", "label,a,b\n1,0.5,2\n0,1.5,3\n2,2.5,4\n"));
  spec.mutable_csv()->set_label_column_name("label");
  auto dataset = LoadDataset(spec, 1, 0);
  ASSERT_EQ(dataset->size(), 3);
  EXPECT_EQ(dataset->shape().task, Task::kClassification);
  EXPECT_EQ(dataset->shape().num_classes, 3);
  at::Tensor x, y;
  dataset->Batch({1}, &x, &y);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_FLOAT_EQ(x[0][0].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(x[0][1].item<float>(), 3.0f);
  EXPECT_EQ(y[0].item<int64_t>(), 0);
}

TEST_F(DataFileTest, GzippedCsvWithoutHeaderTakesTheLastColumn) {
  auto dataset = LoadDataset(Csv(WriteGzip("d.csv.gz", "1,2,0\n3,4,1\n")), 1, 0);
  ASSERT_EQ(dataset->size(), 2);
  at::Tensor x, y;
  dataset->Batch({0, 1}, &x, &y);
  EXPECT_FLOAT_EQ(x[1][0].item<float>(), 3.0f);
  EXPECT_EQ(y[1].item<int64_t>(), 1);
}

TEST_F(DataFileTest, FractionalLabelsMakeARegression) {
  auto dataset = LoadDataset(Csv(Write("r.csv", "1,0.25\n2,0.5\n")), 1, 0);
  EXPECT_EQ(dataset->shape().task, Task::kRegression);
}

TEST_F(DataFileTest, BadCsvNamesThePathAndLine) {
  const std::string path = Write("bad.csv", "1,2,0\n3,oops,1\n");
  try {
    LoadDataset(Csv(path), 1, 0);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path + ":2"));
  }
  const std::string ragged = Write("ragged.csv", "1,2,0\n3,1\n");
  EXPECT_THROW(
      {
        try {
          LoadDataset(Csv(ragged), 1, 0);
        } catch (const UserError& e) {
          EXPECT_THAT(e.what(), HasSubstr(ragged + ":2"));
          throw;
        }
      },
      UserError);
  EXPECT_THROW(LoadDataset(Csv((dir_ / "missing.csv").string()), 1, 0), UserError);
}

// Found by the csv_dataset fuzz target (tests/fuzz/corpus/csv_dataset/ keeps both inputs): a
// label of 1e36 made a class count out of int64's range (undefined behaviour), and a number
// past float32's range became inf in the inputs.
TEST_F(DataFileTest, LabelsPastTheClassLimitAreRefusedNamingTheTask) {
  const std::string path = Write("big.csv", "1,2,1e36\n8,4,0\n");
  try {
    LoadDataset(Csv(path), 1, 0);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(e.field(), "dataset.csv.task");
    EXPECT_THAT(e.what(), HasSubstr("below 1048576"));
    EXPECT_THAT(e.what(), HasSubstr("column 3"));
  }
  v1::DatasetSpec regression = Csv(path);
  regression.mutable_csv()->set_task(v1::CsvDataset::REGRESSION);
  EXPECT_EQ(LoadDataset(regression, 1, 0)->shape().task, Task::kRegression);
  auto largest = LoadDataset(Csv(Write("largest.csv", "1,1048575\n2,0\n")), 1, 0);
  EXPECT_EQ(largest->shape().num_classes, 1048576);
}

TEST_F(DataFileTest, NumbersPastFloat32AreRefusedNamingTheLineAndColumn) {
  for (const char* row : {"1e39,4,1", "1,2,-3.5e38"}) {
    const std::string path = Write("huge.csv", "1,2,0\n" + std::string(row) + "\n");
    try {
      LoadDataset(Csv(path), 1, 0);
      FAIL() << "expected UserError for " << row;
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr(path + ":2: column "));
      EXPECT_THAT(e.what(), HasSubstr("outside float32's range"));
    }
  }
}

TEST_F(DataFileTest, TextIsWindowsOfNextCharacters) {
  v1::DatasetSpec spec;
  spec.mutable_text()->set_path(Write("t.txt", "abcdefghijklmnopqrstuvwxyz"));
  auto dataset = LoadDataset(spec, 1, 4);
  ASSERT_GT(dataset->size(), 0);
  at::Tensor x, y;
  dataset->Batch({0}, &x, &y);
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{1, 4}));
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 4}));
  // The targets are the inputs shifted by one character.
  for (int i = 0; i + 1 < 4; ++i) EXPECT_EQ(x[0][i + 1].item<int64_t>(), y[0][i].item<int64_t>());
}

TEST(SyntheticTest, SameSeedSameSamples) {
  v1::DatasetSpec spec;
  spec.mutable_synthetic()->set_num_samples(64);
  spec.mutable_synthetic()->set_num_features(5);
  spec.mutable_synthetic()->set_num_classes(3);
  auto a = LoadDataset(spec, 11, 0);
  auto b = LoadDataset(spec, 11, 0);
  auto c = LoadDataset(spec, 12, 0);
  at::Tensor xa, ya, xb, yb, xc, yc;
  a->Batch(Iota(64), &xa, &ya);
  b->Batch(Iota(64), &xb, &yb);
  c->Batch(Iota(64), &xc, &yc);
  EXPECT_TRUE(xa.equal(xb));
  EXPECT_TRUE(ya.equal(yb));
  EXPECT_FALSE(xa.equal(xc));
}

TEST_F(DataFileTest, BatchLoaderResumesAtStartBatchAndEnds) {
  auto dataset = LoadDataset(Csv(Write("n.csv", "0,0\n1,1\n2,0\n3,1\n4,0\n")), 1, 0);
  BatchLoader loader(*dataset, Iota(5), 2, /*drop_last=*/false, 2, /*start_batch=*/1);
  at::Tensor x, y;
  ASSERT_TRUE(loader.Next(&x, &y));
  EXPECT_FLOAT_EQ(x[0][0].item<float>(), 2.0f);
  ASSERT_TRUE(loader.Next(&x, &y));
  EXPECT_EQ(x.size(0), 1) << "the last, short batch is kept without drop_last";
  EXPECT_FALSE(loader.Next(&x, &y));
}

}  // namespace
}  // namespace gradhub::data
