// Agents' client certificates end to end: NodeService on a real TLS gRPC server on loopback
// (the cluster CA's server certificate, --tls-client-ca), a real PostgreSQL behind NodeManager,
// and agents' channels presenting the node certificates of `gradhub cluster certs`. A node's
// certificate registers and heartbeats as that node only; a missing certificate is refused
// where one is required; plaintext and a foreign CA never get past the handshake.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "services/api/node_service.h"
#include "services/common/grpc_credentials.h"
#include "services/common/tls/cluster_ca.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::api {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// What an agent's channel presents: a CA to trust (none = plaintext) and its certificate.
struct AgentTls {
  std::string ca, cert, key;
};

class NodeTlsTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    char pattern[] = "/tmp/gradhub-node-tls-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    auto certs = tls::MakeClusterCerts({.out_dir = dir_ + "/tls", .nodes = {"node-a", "node-b"}});
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
    // Another cluster's CA, which issued a certificate for a node of the same name.
    auto foreign = tls::MakeClusterCerts({.out_dir = dir_ + "/foreign", .nodes = {"node-a"}});
    ASSERT_TRUE(foreign.ok()) << foreign.status();
    foreign_ = *foreign;
    pool_ = MakePool(4);
    auth_ = std::make_unique<Authenticator>(pool_.get(), "admin-secret");
    nodes_ = std::make_unique<NodeManager>(pool_.get(), NodeManagerOptions{});
    node_token_ = auth_->CreateNodeToken("")->secret;
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    fs::remove_all(dir_);
  }

  // Serves NodeService over TLS with the cluster's server certificate, asking for client
  // certificates of the cluster's CA.
  void Serve(bool require_client_certificate) {
    service_ = std::make_unique<NodeService>(
        nodes_.get(), auth_.get(), std::function<void()>{}, nullptr,
        NodeServiceOptions{.require_client_certificate = require_client_certificate});
    auto credentials = ServerCredentials(certs_.server_cert, certs_.server_key, certs_.ca_cert);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  AgentTls Node(const std::string& node) const {
    return {certs_.ca_cert, certs_.nodes.at(node).cert, certs_.nodes.at(node).key};
  }

  std::unique_ptr<v1::NodeService::Stub> Agent(const AgentTls& tls) const {
    auto credentials = ClientCredentials(tls.ca, tls.cert, tls.key);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return v1::NodeService::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), *credentials));
  }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token) const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  grpc::Status Register(v1::NodeService::Stub& stub, const std::string& node,
                        std::string* session = nullptr, const std::string& token = "") const {
    v1::RegisterNodeRequest request;
    request.mutable_node()->set_name("nodes/" + node);
    request.mutable_node()->set_slots(1);
    v1::RegisterNodeResponse response;
    grpc::Status status =
        stub.RegisterNode(Context(token.empty() ? node_token_ : token).get(), request, &response);
    if (session != nullptr) *session = response.session_id();
    return status;
  }

  grpc::Status Heartbeat(v1::NodeService::Stub& stub, const std::string& node,
                         const std::string& session) const {
    v1::HeartbeatRequest request;
    request.set_node("nodes/" + node);
    request.set_session_id(session);
    request.set_seq(1);
    v1::HeartbeatResponse response;
    return stub.Heartbeat(Context(node_token_).get(), request, &response);
  }

  std::string dir_;
  tls::ClusterCertFiles certs_, foreign_;
  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<NodeManager> nodes_;
  std::string node_token_;
  std::unique_ptr<NodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(NodeTlsTest, ANodesCertificateRegistersAndHeartbeatsAsThatNodeOnly) {
  Serve(/*require_client_certificate=*/true);
  auto a = Agent(Node("node-a"));
  std::string session_a;
  ASSERT_TRUE(Register(*a, "node-a", &session_a).ok());
  EXPECT_TRUE(Heartbeat(*a, "node-a", session_a).ok());

  // Node b registered with its own certificate; node a's certificate cannot act for it.
  auto b = Agent(Node("node-b"));
  std::string session_b;
  ASSERT_TRUE(Register(*b, "node-b", &session_b).ok());
  const grpc::Status as_b = Register(*a, "node-b");
  EXPECT_EQ(as_b.error_code(), grpc::StatusCode::PERMISSION_DENIED) << as_b.error_message();
  EXPECT_THAT(as_b.error_message(), HasSubstr("'node-b'"));
  EXPECT_EQ(Heartbeat(*a, "node-b", session_b).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::IssueRankCredentialRequest credential;
  credential.set_node("nodes/node-b");
  v1::IssueRankCredentialResponse issued;
  EXPECT_EQ(a->IssueRankCredential(Context(node_token_).get(), credential, &issued).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::WatchAssignmentsRequest watch;
  watch.set_node("nodes/node-b");
  watch.set_session_id(session_b);
  auto context = Context(node_token_);
  auto stream = a->WatchAssignments(context.get(), watch);
  v1::WatchAssignmentsResponse desired;
  EXPECT_FALSE(stream->Read(&desired));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Node b's session is untouched: its own heartbeat still succeeds.
  EXPECT_TRUE(Heartbeat(*b, "node-b", session_b).ok());
}

TEST_F(NodeTlsTest, ACertificateIsRequiredWhereTheServerSaysSoAndTheNodeTokenStill) {
  Serve(/*require_client_certificate=*/true);
  auto anonymous = Agent({certs_.ca_cert, "", ""});
  const grpc::Status without = Register(*anonymous, "node-a");
  EXPECT_EQ(without.error_code(), grpc::StatusCode::UNAUTHENTICATED) << without.error_message();
  EXPECT_THAT(without.error_message(), HasSubstr("client certificate"));
  // The certificate does not replace the node token.
  auto a = Agent(Node("node-a"));
  EXPECT_EQ(Register(*a, "node-a", nullptr, "ghk_not_a_token").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(NodeTlsTest, WithoutTheRequirementAPresentedCertificateStillBindsItsNode) {
  Serve(/*require_client_certificate=*/false);
  auto anonymous = Agent({certs_.ca_cert, "", ""});
  EXPECT_TRUE(Register(*anonymous, "node-b").ok()) << "the node token alone, as before";
  auto a = Agent(Node("node-a"));
  EXPECT_TRUE(Register(*a, "node-a").ok());
  EXPECT_EQ(Register(*a, "node-b").error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(NodeTlsTest, PlaintextAndForeignCertificatesNeverGetPastTheHandshake) {
  Serve(/*require_client_certificate=*/false);
  auto plaintext = Agent({"", "", ""});
  EXPECT_EQ(Register(*plaintext, "node-a").error_code(), grpc::StatusCode::UNAVAILABLE);
  // A certificate of node-a from another CA: refused by the TLS handshake itself.
  auto foreign =
      Agent({certs_.ca_cert, foreign_.nodes.at("node-a").cert, foreign_.nodes.at("node-a").key});
  EXPECT_EQ(Register(*foreign, "node-a").error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA does not accept the server.
  auto distrustful = Agent({foreign_.ca_cert, "", ""});
  EXPECT_EQ(Register(*distrustful, "node-a").error_code(), grpc::StatusCode::UNAVAILABLE);
  // The server's own certificate is for serving (serverAuth only), not for acting as a node:
  // OpenSSL's purpose check fails the handshake.
  auto server_as_client = Agent({certs_.ca_cert, certs_.server_cert, certs_.server_key});
  EXPECT_EQ(Register(*server_as_client, "localhost").error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(ClientCredentialsTest, ACertificateNeedsItsKeyAndTls) {
  EXPECT_EQ(ClientCredentials("", "cert.pem", "key.pem").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClientCredentials("ca.pem", "cert.pem", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ServerCredentials("", "", "ca.pem").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ServerCredentials("/nonexistent/cert.pem", "/nonexistent/key.pem", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradhub::api
