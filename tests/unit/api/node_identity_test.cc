// Which node an agent's call may speak for (services/api/node_identity.h): one test per rule.
#include "services/api/node_identity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

const PeerCertificate kNoCertificate{};
const PeerCertificate kNodeA{.verified = true, .names = {"node-a"}};

TEST(NodeIdentityTest, ACertificateSpeaksForItsOwnNode) {
  EXPECT_TRUE(CheckNodeIdentity(kNodeA, /*require_certificate=*/false, "node-a").ok());
  EXPECT_TRUE(CheckNodeIdentity(kNodeA, /*require_certificate=*/true, "node-a").ok());
}

TEST(NodeIdentityTest, ACertificateOfOneNodeCannotSpeakForAnother) {
  for (const bool require : {false, true}) {
    const absl::Status status = CheckNodeIdentity(kNodeA, require, "node-b");
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("node-a"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("'node-b'"));
  }
  // Names are compared whole: neither a prefix nor a case variant of the node is the node.
  EXPECT_FALSE(CheckNodeIdentity(kNodeA, false, "node-").ok());
  EXPECT_FALSE(CheckNodeIdentity(kNodeA, false, "node-a2").ok());
  EXPECT_FALSE(CheckNodeIdentity(kNodeA, false, "NODE-A").ok());
  // A malformed node name (NodeId gives "") matches no certificate.
  EXPECT_FALSE(CheckNodeIdentity(kNodeA, false, "").ok());
}

TEST(NodeIdentityTest, ACertificateWithSeveralNamesSpeaksForEachOfThem) {
  const PeerCertificate both{.verified = true, .names = {"node-a", "node-b"}};
  EXPECT_TRUE(CheckNodeIdentity(both, false, "node-b").ok());
  EXPECT_FALSE(CheckNodeIdentity(both, false, "node-c").ok());
}

TEST(NodeIdentityTest, WithoutACertificateTheTokenAloneDecidesUnlessOneIsRequired) {
  EXPECT_TRUE(CheckNodeIdentity(kNoCertificate, /*require_certificate=*/false, "node-b").ok());
  const absl::Status status = CheckNodeIdentity(kNoCertificate, true, "node-b");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("--tls-require-client-cert"));
}

TEST(NodeIdentityTest, ACallNamingNoNodeNeedsOnlyACertificateWhereOneIsRequired) {
  EXPECT_TRUE(CheckNodeIdentity(kNodeA, true, std::nullopt).ok());
  EXPECT_TRUE(CheckNodeIdentity(kNoCertificate, false, std::nullopt).ok());
  EXPECT_EQ(CheckNodeIdentity(kNoCertificate, true, std::nullopt).code(),
            absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace gradhub::api
