// The cluster CA (services/common/tls/cluster_ca.h), checked with OpenSSL itself: the chain
// verifies for the purpose each certificate is for and not for the other, the server's names
// are those asked for, a node's certificate names its node, keys are private, and a second run
// keeps the CA while it issues new leaves.
#include "services/common/tls/cluster_ca.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace gradhub::tls {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct FreeCert {
  void operator()(X509* cert) const { X509_free(cert); }
};
using Cert = std::unique_ptr<X509, FreeCert>;

Cert ReadCert(const std::string& path) {
  FILE* file = fopen(path.c_str(), "r");
  if (file == nullptr) return nullptr;
  Cert cert(PEM_read_X509(file, nullptr, nullptr, nullptr));
  fclose(file);
  return cert;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int Mode(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 ? static_cast<int>(info.st_mode & 0777) : -1;
}

// X509_verify_cert of `leaf` against `ca` for `purpose` (X509_PURPOSE_SSL_SERVER or _CLIENT);
// the error string when it fails, "" when it verifies.
std::string Verify(X509* ca, X509* leaf, int purpose) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* context = X509_STORE_CTX_new();
  X509_STORE_CTX_init(context, store, leaf, nullptr);
  X509_STORE_CTX_set_purpose(context, purpose);
  const int ok = X509_verify_cert(context);
  std::string error =
      ok == 1 ? "" : X509_verify_cert_error_string(X509_STORE_CTX_get_error(context));
  X509_STORE_CTX_free(context);
  X509_STORE_free(store);
  return error;
}

std::string CommonName(X509* cert) {
  char name[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, name, sizeof(name));
  return name;
}

class ClusterCaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gradhub-cluster-ca-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  ClusterCertFiles Make(const ClusterCertsOptions& options) {
    absl::StatusOr<ClusterCertFiles> files = MakeClusterCerts(options);
    EXPECT_TRUE(files.ok()) << files.status();
    return files.ok() ? *files : ClusterCertFiles{};
  }

  std::string dir_;
};

TEST_F(ClusterCaTest, TheServerCertificateChainsToTheCaForItsHostsAndServingOnly) {
  const ClusterCertFiles files = Make(
      {.out_dir = dir_ + "/tls", .hosts = {"gradhub-api", "gradhub-api.gradhub.svc", "10.1.2.3"}});
  EXPECT_TRUE(files.made_ca);
  Cert ca = ReadCert(files.ca_cert), server = ReadCert(files.server_cert);
  ASSERT_NE(ca, nullptr);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Verify(ca.get(), server.get(), X509_PURPOSE_SSL_SERVER), "");
  // A server certificate cannot pass as an agent's client certificate.
  EXPECT_NE(Verify(ca.get(), server.get(), X509_PURPOSE_SSL_CLIENT), "");
  for (const char* host : {"localhost", "gradhub-api", "gradhub-api.gradhub.svc"}) {
    EXPECT_EQ(X509_check_host(server.get(), host, 0, 0, nullptr), 1) << host;
  }
  for (const char* ip : {"127.0.0.1", "::1", "10.1.2.3"}) {
    EXPECT_EQ(X509_check_ip_asc(server.get(), ip, 0), 1) << ip;
  }
  EXPECT_NE(X509_check_host(server.get(), "gradhub-checkpoint", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_ip_asc(server.get(), "10.1.2.4", 0), 1);
  // The CA is a CA; the leaf is not, and cannot sign.
  EXPECT_EQ(X509_check_ca(ca.get()), 1);
  EXPECT_EQ(X509_check_ca(server.get()), 0);
}

TEST_F(ClusterCaTest, ANodeCertificateNamesItsNodeAndIsForClientsOnly) {
  const ClusterCertFiles files = Make({.out_dir = dir_, .nodes = {"node-a", "gpu.7"}});
  ASSERT_EQ(files.nodes.size(), 2u);
  Cert ca = ReadCert(files.ca_cert);
  for (const char* node : {"node-a", "gpu.7"}) {
    Cert cert = ReadCert(files.nodes.at(node).cert);
    ASSERT_NE(cert, nullptr) << node;
    EXPECT_EQ(files.nodes.at(node).cert, NodeCertFiles(dir_, node).cert);
    EXPECT_EQ(Verify(ca.get(), cert.get(), X509_PURPOSE_SSL_CLIENT), "") << node;
    EXPECT_NE(Verify(ca.get(), cert.get(), X509_PURPOSE_SSL_SERVER), "") << node;
    EXPECT_EQ(CommonName(cert.get()), node);
    EXPECT_EQ(X509_check_host(cert.get(), node, 0, 0, nullptr), 1) << node;
  }
  Cert a = ReadCert(files.nodes.at("node-a").cert);
  EXPECT_NE(X509_check_host(a.get(), "gpu.7", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_host(a.get(), "localhost", 0, 0, nullptr), 1);
}

TEST_F(ClusterCaTest, KeysArePrivateAndCertificatesReadable) {
  const ClusterCertFiles files = Make({.out_dir = dir_, .nodes = {"node-a"}});
  for (const std::string& key : {files.ca_key, files.server_key, files.nodes.at("node-a").key}) {
    EXPECT_EQ(Mode(key), 0600) << key;
    EXPECT_THAT(ReadText(key), HasSubstr("-----BEGIN PRIVATE KEY-----")) << key;
  }
  for (const std::string& cert :
       {files.ca_cert, files.server_cert, files.nodes.at("node-a").cert}) {
    EXPECT_EQ(Mode(cert), 0644) << cert;
  }
  // No temporary file is left behind.
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().extension(), ".pem") << entry.path();
  }
}

TEST_F(ClusterCaTest, ASecondRunKeepsTheCaAndIssuesNewLeavesThatStillVerify) {
  const ClusterCertFiles first = Make({.out_dir = dir_, .nodes = {"node-a"}});
  const std::string ca_pem = ReadText(first.ca_cert), ca_key = ReadText(first.ca_key);
  const std::string server_pem = ReadText(first.server_cert);
  const ClusterCertFiles second = Make({.out_dir = dir_, .hosts = {"api"}, .nodes = {"node-a"}});
  EXPECT_FALSE(second.made_ca);
  EXPECT_EQ(ReadText(second.ca_cert), ca_pem);
  EXPECT_EQ(ReadText(second.ca_key), ca_key);
  EXPECT_NE(ReadText(second.server_cert), server_pem);
  Cert ca = ReadCert(second.ca_cert), server = ReadCert(second.server_cert);
  EXPECT_EQ(Verify(ca.get(), server.get(), X509_PURPOSE_SSL_SERVER), "");
  EXPECT_EQ(X509_check_host(server.get(), "api", 0, 0, nullptr), 1);
}

TEST_F(ClusterCaTest, TheCaKeyMayLiveApartFromWhatServersMount) {
  const ClusterCertFiles files = Make({.out_dir = dir_ + "/tls", .ca_dir = dir_ + "/ca"});
  EXPECT_EQ(files.ca_key, dir_ + "/ca/ca-key.pem");
  EXPECT_FALSE(fs::exists(dir_ + "/tls/ca-key.pem"));
  EXPECT_EQ(Mode(dir_ + "/ca"), 0700);
  EXPECT_EQ(Mode(dir_ + "/tls"), 0755);
  EXPECT_EQ(ReadText(dir_ + "/tls/ca.pem"), ReadText(dir_ + "/ca/ca.pem"));
  Cert ca = ReadCert(files.ca_cert), server = ReadCert(files.server_cert);
  EXPECT_EQ(Verify(ca.get(), server.get(), X509_PURPOSE_SSL_SERVER), "");
  // Again, into a fresh output directory: the same CA.
  const ClusterCertFiles again = Make({.out_dir = dir_ + "/tls2", .ca_dir = dir_ + "/ca"});
  EXPECT_FALSE(again.made_ca);
  EXPECT_EQ(ReadText(again.ca_cert), ReadText(files.ca_cert));
}

TEST_F(ClusterCaTest, NamesThatCannotBeInACertificateAreRefusedBeforeAnythingIsWritten) {
  for (const ClusterCertsOptions& bad :
       {ClusterCertsOptions{.out_dir = dir_ + "/x", .hosts = {"a,DNS:evil"}},
        ClusterCertsOptions{.out_dir = dir_ + "/x", .hosts = {"has space"}},
        ClusterCertsOptions{.out_dir = dir_ + "/x", .nodes = {"-a"}},
        ClusterCertsOptions{.out_dir = dir_ + "/x", .nodes = {"a/b"}}}) {
    absl::StatusOr<ClusterCertFiles> files = MakeClusterCerts(bad);
    EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << files.status();
    EXPECT_THAT(std::string(files.status().message()),
                HasSubstr(bad.hosts.empty() ? "--nodes" : "--hosts"));
    EXPECT_FALSE(fs::exists(dir_ + "/x"));
  }
}

TEST_F(ClusterCaTest, AKeptCaWhoseKeyDoesNotMatchIsRefused) {
  Make({.out_dir = dir_ + "/one"});
  Make({.out_dir = dir_ + "/two"});
  fs::copy_file(dir_ + "/two/ca-key.pem", dir_ + "/one/ca-key.pem",
                fs::copy_options::overwrite_existing);
  absl::StatusOr<ClusterCertFiles> files = MakeClusterCerts({.out_dir = dir_ + "/one"});
  EXPECT_EQ(files.status().code(), absl::StatusCode::kFailedPrecondition) << files.status();
  EXPECT_THAT(std::string(files.status().message()), HasSubstr("do not match"));
  // Only half of a CA is refused too, rather than replaced under clients that trust it.
  fs::remove(dir_ + "/two/ca-key.pem");
  files = MakeClusterCerts({.out_dir = dir_ + "/two"});
  EXPECT_EQ(files.status().code(), absl::StatusCode::kFailedPrecondition) << files.status();
}

}  // namespace
}  // namespace gradhub::tls
