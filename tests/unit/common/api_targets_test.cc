// --server and GRADHUB_STORE as channel targets (services/common/api_targets.h): rules 1-3 and
// the lists refused, each naming its flag. Names resolved are this machine's (localhost).
#include "services/common/api_targets.h"

#include <gtest/gtest.h>

namespace gradhub {
namespace {

TEST(ApiTargetsTest, OneAddressIsADnsTargetThatGrpcResolves) {
  absl::StatusOr<ApiTarget> target = ParseApiTarget("--server", "api.example:7070");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->target, "dns:///api.example:7070");  // not resolved here
  EXPECT_EQ(target->tls_name, "");
  EXPECT_EQ(target->hosts, std::vector<std::string>{"api.example"});
  EXPECT_EQ(ParseApiTarget("--server", "[::1]:7070")->target, "dns:///[::1]:7070");
}

TEST(ApiTargetsTest, ATargetWithASchemeIsAsGiven) {
  for (const char* given : {"ipv4:10.0.0.1:7070,10.0.0.2:7070", "dns:///api:7070",
                            "unix:/run/gradhub.sock", "ipv6:[::1]:7070"}) {
    absl::StatusOr<ApiTarget> target = ParseApiTarget("--server", given);
    ASSERT_TRUE(target.ok()) << given << ": " << target.status();
    EXPECT_EQ(target->target, given);
  }
  EXPECT_EQ(ParseApiTarget("--server", "ipv4:10.0.0.1:7070,10.0.0.2:7070")->hosts.front(),
            "10.0.0.1");
}

TEST(ApiTargetsTest, AListIsResolvedIntoOneAddressListCheckedAgainstTheFirstName) {
  absl::StatusOr<ApiTarget> v4 = ParseApiTarget("--server", "127.0.0.1:7070,127.0.0.2:7071");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->target, "ipv4:127.0.0.1:7070,127.0.0.2:7071");
  EXPECT_EQ(v4->tls_name, "127.0.0.1");
  absl::StatusOr<ApiTarget> v6 = ParseApiTarget("--server", "[::1]:7070,[::1]:7071");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->target, "ipv6:[::1]:7070,[::1]:7071");
  EXPECT_EQ(v6->tls_name, "::1");
  // Mixed families: IPv4 mapped into IPv6, in the entries' order.
  absl::StatusOr<ApiTarget> mixed = ParseApiTarget("--server", "127.0.0.1:7070,[::1]:7071");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->target, "ipv6:[::ffff:127.0.0.1]:7070,[::1]:7071");
  // A name: every address it has; TLS checks the name as given.
  absl::StatusOr<ApiTarget> named = ParseApiTarget("--server", "localhost:7070,127.0.0.1:7071");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tls_name, "localhost");
  EXPECT_TRUE(named->target.rfind("ipv", 0) == 0) << named->target;
  EXPECT_NE(named->target.find("7071"), std::string::npos) << named->target;
  EXPECT_EQ(named->hosts, (std::vector<std::string>{"localhost", "127.0.0.1"}));
}

TEST(ApiTargetsTest, BadListsAreRefusedNamingTheFlag) {
  for (const char* bad : {"", "a:7070,,b:7070", "a:7070,", ",a:7070", "api", "a:7070,b", "a:0",
                          "a:70000", "a:x", ":7070", "::1:7070", "[::1]", "[::1:7070"}) {
    absl::StatusOr<ApiTarget> target = ParseApiTarget("--server", bad);
    ASSERT_FALSE(target.ok()) << "'" << bad << "' -> " << target->target;
    EXPECT_EQ(target.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(target.status().message().rfind("--server: ", 0), 0u) << target.status();
  }
  absl::StatusOr<ApiTarget> store = ParseApiTarget("GRADHUB_STORE", "a:1,,b:2");
  EXPECT_EQ(store.status().message().rfind("GRADHUB_STORE: ", 0), 0u) << store.status();
}

TEST(ApiTargetsTest, ANameThatDoesNotResolveIsUnavailableNamingTheFlag) {
  absl::StatusOr<ApiTarget> target =
      ParseApiTarget("--server", "127.0.0.1:7070,no-such-host.invalid:7070");
  EXPECT_EQ(target.status().code(), absl::StatusCode::kUnavailable) << target.status();
  EXPECT_NE(target.status().message().find("--server"), std::string::npos);
  EXPECT_NE(target.status().message().find("no-such-host.invalid"), std::string::npos);
}

TEST(ApiTargetsTest, FirstApiHostOfEveryForm) {
  EXPECT_EQ(FirstApiHost("a.example:7070,b.example:7070"), "a.example");
  EXPECT_EQ(FirstApiHost("[::1]:7070,[::2]:7070"), "::1");
  EXPECT_EQ(FirstApiHost("ipv4:10.0.0.1:7070,10.0.0.2:7070"), "10.0.0.1");
  EXPECT_EQ(FirstApiHost("dns:///api:7070"), "api");
  EXPECT_EQ(FirstApiHost("unix:/run/gradhub.sock"), "");
}

}  // namespace
}  // namespace gradhub
