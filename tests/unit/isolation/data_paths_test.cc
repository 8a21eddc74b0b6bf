// The pure path rules of services/common/contract/data_paths.h: one test per rule.
#include "services/common/contract/data_paths.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gradhub {
namespace {

using ::testing::HasSubstr;

TEST(DataPathsTest, CleanPathsAreAbsoluteWithoutDotComponents) {
  EXPECT_TRUE(IsCleanPath("/"));
  EXPECT_TRUE(IsCleanPath("/data/digits.csv.gz"));
  EXPECT_TRUE(IsCleanPath("/data/..hidden/x"));  // a name that starts with dots is a name
  EXPECT_FALSE(IsCleanPath(""));
  EXPECT_FALSE(IsCleanPath("data/x"));
  EXPECT_FALSE(IsCleanPath("/data/../etc/shadow"));
  EXPECT_FALSE(IsCleanPath("/data/./x"));
  EXPECT_FALSE(IsCleanPath("/data//x"));
  EXPECT_FALSE(IsCleanPath("/data/"));
  EXPECT_FALSE(IsCleanPath("/.."));
  EXPECT_FALSE(IsCleanPath(std::string("/data/x\0y", 9)));
  EXPECT_FALSE(IsCleanPath("/" + std::string(kMaxSpecPathBytes, 'a')));
}

TEST(DataPathsTest, UnderRootOnlyOnAComponentBoundary) {
  EXPECT_TRUE(IsUnderRoot("/data/x", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data/a/b/c", "/data"));
  EXPECT_FALSE(IsUnderRoot("/database/x", "/data"));
  EXPECT_FALSE(IsUnderRoot("/dat", "/data"));
  EXPECT_FALSE(IsUnderRoot("/etc/shadow", "/data"));
  EXPECT_TRUE(IsUnderRoot("/etc/shadow", "/"));  // an operator's choice, refused elsewhere
}

TEST(DataPathsTest, UncleanPathsAndRootsAreNeverUnder) {
  EXPECT_FALSE(IsUnderRoot("/data/../etc/shadow", "/data"));
  EXPECT_FALSE(IsUnderRoot("/data/x", "/data/"));
  EXPECT_FALSE(IsUnderRoot("/data/x", "data"));
}

TEST(DataPathsTest, AnyRootOfSeveral) {
  const std::vector<std::string> roots = {"/a", "/srv/data"};
  EXPECT_TRUE(IsUnderAnyRoot("/srv/data/x", roots));
  EXPECT_TRUE(IsUnderAnyRoot("/a/y", roots));
  EXPECT_FALSE(IsUnderAnyRoot("/srv/other", roots));
  EXPECT_FALSE(IsUnderAnyRoot("/a/y", {}));
}

TEST(DataPathsTest, SpecPathsListsEveryPathFieldByItsJsonName) {
  v1::JobSpec spec;
  spec.mutable_dataset()->mutable_idx()->set_images_path("/d/images");
  spec.mutable_dataset()->mutable_idx()->set_labels_path("/d/labels");
  spec.mutable_model()->mutable_torchscript()->set_path("/m/model.pt");
  const std::vector<SpecPath> paths = SpecPaths(spec);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0].field, "dataset.idx.imagesPath");
  EXPECT_EQ(paths[1].field, "dataset.idx.labelsPath");
  EXPECT_EQ(paths[2].field, "model.torchscript.path");
  spec.mutable_dataset()->mutable_csv()->set_path("/d/x.csv");
  EXPECT_EQ(SpecPaths(spec)[0].field, "dataset.csv.path");
  spec.mutable_dataset()->mutable_text()->set_path("/d/x.txt");
  EXPECT_EQ(SpecPaths(spec)[0].field, "dataset.text.path");
}

TEST(DataPathsTest, SyntheticDataAndBuiltInModelsNameNoPath) {
  v1::JobSpec spec;
  spec.mutable_dataset()->mutable_synthetic()->set_num_samples(10);
  spec.mutable_model()->mutable_mlp()->add_layers(4);
  EXPECT_TRUE(SpecPaths(spec).empty());
  EXPECT_TRUE(RootsServeSpec({}, spec));
}

TEST(DataPathsTest, ProblemsNameTheFieldAndTheAllowedRoots) {
  const std::string outside = PathProblem({"dataset.csv.path", "/etc/shadow"}, {"/data", "/srv"});
  EXPECT_THAT(outside, HasSubstr("dataset.csv.path"));
  EXPECT_THAT(outside, HasSubstr("/data, /srv"));
  const std::string escape = PathProblem({"dataset.text.path", "/data/../etc/shadow"}, {"/data"});
  EXPECT_THAT(escape, HasSubstr("dataset.text.path"));
  EXPECT_THAT(escape, HasSubstr(".."));
  EXPECT_THAT(PathProblem({"dataset.csv.path", "/x"}, {}), HasSubstr("allowed: none"));
  EXPECT_EQ(PathProblem({"dataset.csv.path", "/data/x"}, {"/data"}), "");
}

TEST(DataPathsTest, RootsServeASpecOnlyWhenEveryPathIsUnderThem) {
  v1::JobSpec spec;
  spec.mutable_dataset()->mutable_csv()->set_path("/data/x.csv");
  spec.mutable_model()->mutable_torchscript()->set_path("/models/m.pt");
  EXPECT_FALSE(RootsServeSpec({"/data"}, spec));
  EXPECT_TRUE(RootsServeSpec({"/data", "/models"}, spec));
}

TEST(DataPathsTest, RootListsRoundTripThroughTheEnvironmentForm) {
  EXPECT_EQ(JoinRootList({"/a", "/b c"}), "/a:/b c");
  EXPECT_EQ(SplitRootList("/a:/b c"), (std::vector<std::string>{"/a", "/b c"}));
  EXPECT_TRUE(SplitRootList("").empty());
  EXPECT_EQ(JoinRootList({}), ":");  // set, and empty: nothing is allowed
  EXPECT_TRUE(SplitRootList(":").empty());
  EXPECT_EQ(SplitRootList("/a::/b:"), (std::vector<std::string>{"/a", "/b"}));
}

}  // namespace
}  // namespace gradhub
