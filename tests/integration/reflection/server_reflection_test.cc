// gRPC server reflection on every gradhub server, as grpcurl, Postman or Evans use it: each
// binary runs as a real process on a real PostgreSQL, and a client that has no gradhub proto
// file lists its services and resolves each one's methods from the descriptors the server
// sends (with every imported file asked for by name).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server_reflection.grpc.pb.h"
#include "tests/support/postgres_server.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

namespace reflection = ::grpc::reflection::v1alpha;
using testing::BinaryPath;
using testing::Subprocess;

constexpr char kReflectionService[] = "grpc.reflection.v1alpha.ServerReflection";

// A server binary with `flags`; its gRPC address once it printed "serving gRPC on port N".
class ServerProcess {
 public:
  ServerProcess(const std::string& binary, std::vector<std::string> flags) {
    flags.insert(flags.begin(), BinaryPath(binary));
    process_ = std::make_unique<Subprocess>(std::move(flags));
    static const std::regex kServing("serving gRPC on port ([0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline && process_->running()) {
      std::smatch match;
      const std::string out = process_->out();
      if (std::regex_search(out, match, kServing)) {
        address_ = "127.0.0.1:" + match[1].str();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << binary << " did not start:\n" << process_->err();
  }

  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<Subprocess> process_;
  std::string address_;
};

// What grpcurl does: ask for the services, then for the file that defines a symbol and for
// every file it imports, and build descriptors from them. Nothing of gradhub compiled in.
class ReflectionClient {
 public:
  explicit ReflectionClient(const std::string& address)
      : stub_(reflection::ServerReflection::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        pool_(&database_) {}

  std::set<std::string> ListServices() {
    reflection::ServerReflectionRequest request;
    request.set_list_services("*");
    const reflection::ServerReflectionResponse response = Ask(request);
    std::set<std::string> names;
    for (const auto& service : response.list_services_response().service()) {
      names.insert(service.name());
    }
    return names;
  }

  // The service as the server describes it; null (with a failure) when it cannot be resolved.
  const google::protobuf::ServiceDescriptor* FindService(const std::string& name) {
    reflection::ServerReflectionRequest request;
    request.set_file_containing_symbol(name);
    AddFiles(Ask(request));
    const google::protobuf::ServiceDescriptor* service = pool_.FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name << " does not resolve from the descriptors served";
    return service;
  }

 private:
  reflection::ServerReflectionResponse Ask(const reflection::ServerReflectionRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub_->ServerReflectionInfo(&context);
    reflection::ServerReflectionResponse response;
    EXPECT_TRUE(stream->Write(request));
    stream->WritesDone();
    EXPECT_TRUE(stream->Read(&response)) << "no answer to " << request.ShortDebugString();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(response.has_error_response()) << response.error_response().error_message();
    return response;
  }

  // Adds the files of `response`, then asks for each import not known yet, until none is left.
  void AddFiles(const reflection::ServerReflectionResponse& response) {
    std::vector<std::string> missing;
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(bytes));
      if (!known_.insert(file.name()).second) continue;
      for (const std::string& dependency : file.dependency()) missing.push_back(dependency);
      ASSERT_TRUE(database_.Add(file)) << file.name();
    }
    for (const std::string& name : missing) {
      if (known_.count(name) != 0) continue;
      reflection::ServerReflectionRequest request;
      request.set_file_by_filename(name);
      AddFiles(Ask(request));
    }
  }

  std::unique_ptr<reflection::ServerReflection::Stub> stub_;
  google::protobuf::SimpleDescriptorDatabase database_;
  google::protobuf::DescriptorPool pool_;
  std::set<std::string> known_;
};

// Each of `services` is listed and resolves with `method` among its methods.
void ExpectDiscoverable(const std::string& address,
                        const std::vector<std::pair<std::string, std::string>>& services) {
  ReflectionClient client(address);
  const std::set<std::string> listed = client.ListServices();
  EXPECT_EQ(listed.count(kReflectionService), 1u);
  for (const auto& [service, method] : services) {
    EXPECT_EQ(listed.count(service), 1u) << service << " is not listed";
    const google::protobuf::ServiceDescriptor* descriptor = client.FindService(service);
    if (descriptor == nullptr) continue;
    EXPECT_NE(descriptor->FindMethodByName(method), nullptr) << service << "." << method;
  }
}

class ServerReflectionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    url_ = new std::string(testing::PostgresServer::Shared().CreateDatabase());
  }
  static void TearDownTestSuite() { delete url_; }

  // Migrated by the api; the metrics server reads the api's tables and does not migrate.
  static ServerProcess StartApi() {
    return ServerProcess("gradhub-api", {"--database-url", *url_, "--grpc-address", "127.0.0.1:0",
                                         "--http-host", "127.0.0.1", "--http-port", "0", "serve"});
  }

  static std::string* url_;
};

std::string* ServerReflectionTest::url_ = nullptr;

TEST_F(ServerReflectionTest, ApiListsEveryServiceItServes) {
  const ServerProcess api = StartApi();
  ASSERT_FALSE(api.address().empty());
  ExpectDiscoverable(api.address(), {{"gradhub.v1.JobService", "CreateJob"},
                                     {"gradhub.v1.NodeService", "Heartbeat"},
                                     {"gradhub.v1.StoreService", "Wait"},
                                     {"gradhub.v1.AdminService", "CreateTenant"}});
}

TEST_F(ServerReflectionTest, CheckpointStoreListsCheckpointService) {
  const ServerProcess api = StartApi();  // the jobs tables the store refers to
  ASSERT_FALSE(api.address().empty());
  const testing::TempDir data;
  const ServerProcess checkpoint(
      "gradhub-checkpoint",
      {"--database-url", *url_, "--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-host",
       "127.0.0.1", "--http-port", "0", "--data-dir", data.path(), "serve"});
  ASSERT_FALSE(checkpoint.address().empty());
  ExpectDiscoverable(checkpoint.address(), {{"gradhub.v1.CheckpointService", "StartUpload"}});
}

TEST_F(ServerReflectionTest, MetricsListsTelemetryService) {
  const ServerProcess api = StartApi();
  ASSERT_FALSE(api.address().empty());
  const ServerProcess metrics("gradhub-metrics", {"--database-url", *url_, "--host", "127.0.0.1",
                                                  "--grpc-port", "0", "--http-port", "0"});
  ASSERT_FALSE(metrics.address().empty());
  ExpectDiscoverable(metrics.address(), {{"gradhub.v1.TelemetryService", "ReportTelemetry"}});
}

}  // namespace
}  // namespace gradhub
