// The two clients of CodeService (code.proto) against a real gradhub-checkpoint and
// gradhub-api on a real PostgreSQL, with a real tenant token and a real node token:
//   - the CLI: `gradhub code push|get` and `gradhub submit --code DIR` (or a `code:` directory in
//     the YAML), run as a user runs them;
//   - the agent's CodeCache (gpu_worker/agent/code_cache.h): download, verification, the cache
//     by digest across restarts, one download for concurrent fetches, eviction.
#include "gpu_worker/agent/code_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "gradhub/v1/code.grpc.pb.h"
#include "gradhub/v1/jobs.grpc.pb.h"
#include "services/common/sha256.h"
#include "tests/support/grpc_test_server.h"
#include "tests/support/local_cluster.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using agent::CodeCache;
using agent::CodeCacheOptions;
using ::testing::AllOf;
using testing::BinaryPath;
using ::testing::HasSubstr;
using testing::LocalCluster;
using ::testing::Not;
using testing::RunResult;
using testing::TempDir;

void WriteFile(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

// The digest a `code push` printed on stdout ("" if none).
std::string DigestIn(const std::string& out) {
  static const std::regex kDigest("sha256:[0-9a-f]{64}");
  std::smatch match;
  return std::regex_search(out, match, kDigest) ? match[0].str() : "";
}

// A script job's code: a training script, a folder the .gradhubignore drops and a file type it
// drops.
std::string MakeCodeDir(const std::string& root) {
  const std::string dir = root + "/code";
  WriteFile(dir + "/train.py", "print('hello from a script job')\n");
  WriteFile(dir + "/lib/model.py", "WIDTH = 4\n");
  WriteFile(dir + "/data/big.bin", std::string(1 << 20, 'x'));
  WriteFile(dir + "/lib/model.pyc", "compiled");
  WriteFile(dir + "/.gradhubignore", "# not code\ndata/\n*.pyc\n");
  return dir;
}

// One cluster for the binary: an api and a checkpoint store, no agents (nothing here runs).
class CodeClientsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new LocalCluster({.agents = {}, .checkpoint_service = true});
    ASSERT_TRUE(cluster_->Start());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  // `gradhub ARGS` as the tenant, nothing taken from the environment.
  RunResult Gradhub(std::vector<std::string> args) {
    args.insert(args.begin(),
                {BinaryPath("gradhub"), "--server", cluster_->api_address(), "--checkpoint-server",
                 cluster_->checkpoint_address(), "--token", cluster_->tenant_token()});
    std::map<std::string, std::string> env = {{"GRADHUB_CONFIG", dir_.path() + "/no-config"},
                                              {"TMPDIR", dir_.path()}};
    for (const char* name : {"GRADHUB_SERVER", "GRADHUB_CHECKPOINT_SERVER", "GRADHUB_TOKEN",
                             "GRADHUB_TLS_CA", "GRADHUB_OUTPUT", "GRADHUB_TIMEOUT"}) {
      env.emplace(name, "");
    }
    return testing::Run(std::move(args), env, std::chrono::seconds(120));
  }

  // `code push DIR`, checked to succeed; the digest.
  std::string Push(const std::string& dir) {
    const RunResult pushed = Gradhub({"code", "push", dir});
    EXPECT_EQ(pushed.exit_code, 0) << pushed.err;
    return DigestIn(pushed.out);
  }

  CodeCacheOptions NodeOptions() const {
    CodeCacheOptions options;
    options.token = cluster_->node_token();
    options.fetch_timeout = absl::Seconds(30);
    return options;
  }

  // The names in a tar, as GNU tar lists them.
  std::vector<std::string> TarNames(const std::string& tar) {
    const RunResult listed = testing::Run({"/usr/bin/tar", "-tf", tar});
    EXPECT_EQ(listed.exit_code, 0) << listed.err;
    std::vector<std::string> names;
    std::istringstream lines(listed.out);
    for (std::string line; std::getline(lines, line);) names.push_back(line);
    return names;
  }

  v1::Job GetJob(const std::string& name) {
    v1::GetJobRequest request;
    request.set_name(name);
    v1::Job job;
    const grpc::Status status =
        cluster_->jobs().GetJob(cluster_->TenantContext().get(), request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  static LocalCluster* cluster_;
  TempDir dir_;
};

LocalCluster* CodeClientsTest::cluster_ = nullptr;

// A CodeService whose first upload breaks after its first data message, and whose first
// download half way, with UNAVAILABLE as a reset connection does; the tries after succeed. It
// keeps what it was sent, checked against the header.
class BreakingOnceCodeService final : public v1::CodeService::Service {
 public:
  grpc::Status GetCode(grpc::ServerContext*, const v1::GetCodeRequest*, v1::CodeArchive*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "not here");
  }
  grpc::Status UploadCode(grpc::ServerContext*, grpc::ServerReader<v1::UploadCodeRequest>* reader,
                          v1::CodeArchive* archive) override {
    const bool breaks = ++uploads == 1;
    v1::UploadCodeRequest message;
    if (!reader->Read(&message) || !message.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no header");
    }
    const v1::UploadCodeHeader header = message.header();
    std::string received;
    while (reader->Read(&message)) {
      received += message.data();
      if (breaks) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset");
    }
    if (static_cast<int64_t>(received.size()) != header.size_bytes() ||
        Sha256Hex(received) != header.sha256()) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "not the header's bytes");
    }
    data = received;
    archive->set_digest("sha256:" + header.sha256());
    archive->set_size_bytes(header.size_bytes());
    return grpc::Status::OK;
  }
  grpc::Status DownloadCode(grpc::ServerContext*, const v1::DownloadCodeRequest* request,
                            grpc::ServerWriter<v1::DownloadCodeResponse>* writer) override {
    offsets.push_back(request->offset());
    const size_t stop = offsets.size() == 1 ? data.size() / 2 : data.size();
    constexpr size_t kChunk = 100000;
    v1::DownloadCodeResponse message;
    for (size_t offset = static_cast<size_t>(request->offset()); offset < stop; offset += kChunk) {
      message.set_data(data.substr(offset, std::min(kChunk, stop - offset)));
      writer->Write(message);
    }
    if (stop < data.size()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset");
    return grpc::Status::OK;
  }

  std::string data;  // the bytes the last whole upload sent, and every download serves
  int uploads = 0;
  std::vector<int64_t> offsets;  // of each DownloadCode
};

// ---------------------------------------------------------------------------------------------
// The CLI.

TEST_F(CodeClientsTest, PushUploadsOnceAndLeavesOutWhatGradhubignoreExcludes) {
  const std::string code = MakeCodeDir(dir_.path());
  const RunResult first = Gradhub({"code", "push", code});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string digest = DigestIn(first.out);
  ASSERT_FALSE(digest.empty()) << first.out;
  EXPECT_THAT(first.err, AllOf(HasSubstr("code: " + digest), HasSubstr("uploaded in")));

  const RunResult second = Gradhub({"code", "push", code});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(DigestIn(second.out), digest);
  EXPECT_THAT(second.err, HasSubstr("(already uploaded)"));

  // What was uploaded, as a node downloads it: the ignored files are not in it.
  CodeCache cache(dir_.path() + "/cache", NodeOptions());
  absl::StatusOr<std::string> tar = cache.Fetch(digest, cluster_->checkpoint_address());
  ASSERT_TRUE(tar.ok()) << tar.status();
  const std::vector<std::string> names = TarNames(*tar);
  EXPECT_THAT(names, ::testing::IsSupersetOf({"train.py", "lib/model.py", ".gradhubignore"}));
  for (const std::string& name : names) {
    EXPECT_THAT(name, AllOf(Not(HasSubstr("data")), Not(HasSubstr(".pyc"))));
  }
  // No temporary archive left behind ($TMPDIR is the test's directory).
  for (const auto& file : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_THAT(file.path().filename().string(), Not(HasSubstr("gradhub-code-")));
  }
}

TEST_F(CodeClientsTest, GetShowsTheArchive) {
  const std::string code = MakeCodeDir(dir_.path());
  const std::string digest = Push(code);
  ASSERT_FALSE(digest.empty());
  const RunResult got = Gradhub({"code", "get", digest});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_THAT(got.out, AllOf(HasSubstr("name: code/" + digest.substr(7)),
                             HasSubstr("digest: " + digest), HasSubstr("entries: ")));
  const RunResult json = Gradhub({"code", "get", digest, "--output", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"sizeBytes\""));

  const RunResult unknown = Gradhub({"code", "get", "sha256:" + std::string(64, '0')});
  EXPECT_EQ(unknown.exit_code, 3) << unknown.err;  // kNotFound
  const RunResult malformed = Gradhub({"code", "get", "train.py"});
  EXPECT_EQ(malformed.exit_code, 2) << malformed.err;
}

TEST_F(CodeClientsTest, SubmitWithCodeUploadsItAndPutsTheDigestInTheSpec) {
  const std::string code = MakeCodeDir(dir_.path());
  WriteFile(dir_.path() + "/job.yaml", "displayName: script\nscript: {entrypoint: train.py}\n");
  const RunResult first = Gradhub({"submit", "-f", dir_.path() + "/job.yaml", "--code", code});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string digest = DigestIn(first.err);
  ASSERT_FALSE(digest.empty()) << first.err;
  EXPECT_EQ(GetJob(first.out.substr(0, first.out.find('\n'))).spec().script().code(), digest);

  const RunResult second = Gradhub({"submit", "-f", dir_.path() + "/job.yaml", "--code", code});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.err, AllOf(HasSubstr("code: " + digest), HasSubstr("(already uploaded)")));
  EXPECT_EQ(GetJob(second.out.substr(0, second.out.find('\n'))).spec().script().code(), digest);
}

TEST_F(CodeClientsTest, ACodeDirectoryInTheYamlIsRelativeToTheYamlsFolder) {
  const std::string project = dir_.path() + "/project";
  MakeCodeDir(project);
  const std::string expected = Push(project + "/code");
  WriteFile(project + "/job.yaml",
            "displayName: script\nscript: {code: ./code, entrypoint: train.py}\n");
  // Run from elsewhere: the path is the YAML's, not the working directory's.
  const RunResult submitted = Gradhub({"submit", "-f", project + "/job.yaml"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  EXPECT_THAT(submitted.err, HasSubstr("code: " + expected));
  EXPECT_EQ(GetJob(submitted.out.substr(0, submitted.out.find('\n'))).spec().script().code(),
            expected);
}

TEST_F(CodeClientsTest, CodeFlagWinsOverTheYamlsAndSaysSo) {
  const std::string code = MakeCodeDir(dir_.path());
  WriteFile(dir_.path() + "/job.yaml",
            "displayName: script\nscript: {code: ./missing, entrypoint: train.py}\n");
  const RunResult submitted = Gradhub({"submit", "-f", dir_.path() + "/job.yaml", "--code", code});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  EXPECT_THAT(submitted.err, AllOf(HasSubstr("--code " + code +
                                             " replaces the spec's "
                                             "script.code (./missing)"),
                                   HasSubstr("code: sha256:")));
}

TEST_F(CodeClientsTest, CodeWithoutAScriptIsAUsageErrorNamingCode) {
  const std::string code = MakeCodeDir(dir_.path());
  WriteFile(dir_.path() + "/job.yaml",
            "model: {mlp: {layers: [4, 2]}}\n"
            "dataset: {synthetic: {numSamples: 64, numFeatures: 4, numClasses: 2}}\n"
            "optimizer: {sgd: {lr: 0.1}}\nbatchSizePerRank: 8\nmaxSteps: 5\n");
  const RunResult submitted = Gradhub({"submit", "-f", dir_.path() + "/job.yaml", "--code", code});
  EXPECT_EQ(submitted.exit_code, 2) << submitted.err;  // kUsage
  EXPECT_THAT(submitted.err, AllOf(HasSubstr("--code"), HasSubstr("script")));
  EXPECT_EQ(submitted.out, "");
}

TEST_F(CodeClientsTest, AFifoIsRefusedNamingTheEntry) {
  const std::string code = MakeCodeDir(dir_.path());
  ASSERT_EQ(mkfifo((code + "/lib/pipe").c_str(), 0600), 0);
  const RunResult pushed = Gradhub({"code", "push", code});
  EXPECT_EQ(pushed.exit_code, 4) << pushed.err;  // kInvalidArgument
  EXPECT_THAT(pushed.err, HasSubstr("lib/pipe"));
  EXPECT_EQ(pushed.out, "");
}

TEST_F(CodeClientsTest, ALinkOutOfTheTreeIsRefusedNamingTheEntry) {
  const std::string code = MakeCodeDir(dir_.path());
  std::filesystem::create_directory_symlink("/etc", code + "/lib/etc");
  WriteFile(dir_.path() + "/job.yaml", "displayName: script\nscript: {entrypoint: train.py}\n");
  const RunResult submitted = Gradhub({"submit", "-f", dir_.path() + "/job.yaml", "--code", code});
  EXPECT_EQ(submitted.exit_code, 4) << submitted.err;
  EXPECT_THAT(submitted.err, HasSubstr("lib/etc"));
  EXPECT_EQ(submitted.out, "");  // no job
}

TEST_F(CodeClientsTest, AMissingDirectoryIsNamed) {
  const RunResult pushed = Gradhub({"code", "push", dir_.path() + "/nowhere"});
  EXPECT_NE(pushed.exit_code, 0);
  EXPECT_THAT(pushed.err, HasSubstr("nowhere"));
}

TEST_F(CodeClientsTest, UploadOf64MiB) {
  const std::string code = dir_.path() + "/big";
  for (int i = 0; i < 16; ++i) {
    WriteFile(code + "/shard-" + std::to_string(i), RandomBytes(4 << 20, i));
  }
  const auto start = std::chrono::steady_clock::now();
  const RunResult pushed = Gradhub({"code", "push", code});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(pushed.exit_code, 0) << pushed.err;
  EXPECT_THAT(pushed.err, HasSubstr("uploaded in"));
  // For the record (the bench in tests/bench compares with dd): the whole command, packing
  // and hashing included, and the upload alone as the CLI reports it.
  std::cout << "code push of 64 MiB: " << seconds << " s in all; " << pushed.err;
}

TEST_F(CodeClientsTest, ABrokenUploadIsSentAgain) {
  BreakingOnceCodeService service;
  testing::TestGrpcServer server({&service}, {.max_message_bytes = (4 << 20) + (64 << 10)});
  const std::string code = dir_.path() + "/code";
  WriteFile(code + "/weights.bin", RandomBytes(6 << 20, 3));  // two upload messages
  RunResult pushed = Gradhub({"code", "push", code, "--checkpoint-server", server.address()});
  ASSERT_EQ(pushed.exit_code, 0) << pushed.err;
  EXPECT_THAT(pushed.err, AllOf(HasSubstr("UNAVAILABLE: connection reset"),
                                HasSubstr("sending it again"), HasSubstr("uploaded in")));
  EXPECT_EQ(service.uploads, 2);
  EXPECT_EQ(DigestIn(pushed.out), "sha256:" + Sha256Hex(service.data));
  EXPECT_GT(service.data.size(), size_t{6} << 20);
}

// ---------------------------------------------------------------------------------------------
// The agent's CodeCache.

TEST_F(CodeClientsTest, CacheResumesABrokenDownloadAtItsOffset) {
  BreakingOnceCodeService service;
  service.data = RandomBytes(1 << 20, 5);
  testing::TestGrpcServer server({&service});
  CodeCache cache(dir_.path() + "/cache", NodeOptions());
  absl::StatusOr<std::string> path =
      cache.Fetch("sha256:" + Sha256Hex(service.data), server.address());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(service.offsets, (std::vector<int64_t>{0, 1 << 19}));
  EXPECT_TRUE(ReadFile(*path) == service.data);
  EXPECT_EQ(cache.stats().bytes_downloaded, 1 << 20);
}

TEST_F(CodeClientsTest, CacheDownloadsVerifiesAndKeepsAnArchive) {
  const std::string digest = Push(MakeCodeDir(dir_.path()));
  ASSERT_FALSE(digest.empty());
  const std::string cache_dir = dir_.path() + "/cache";
  CodeCache cache(cache_dir, NodeOptions());
  ASSERT_TRUE(cache.status().ok()) << cache.status();
  absl::StatusOr<std::string> path = cache.Fetch(digest, cluster_->checkpoint_address());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, cache_dir + "/" + digest.substr(7) + ".tar");
  EXPECT_EQ("sha256:" + *Sha256OfFile(*path), digest);
  struct stat dir_info {};
  ASSERT_EQ(stat(cache_dir.c_str(), &dir_info), 0);
  EXPECT_EQ(dir_info.st_mode & 0777, 0700u);
  EXPECT_EQ(cache.stats().downloads, 1);
  struct stat first {};
  ASSERT_EQ(stat(path->c_str(), &first), 0);

  // Again: from the cache, not from the server.
  absl::StatusOr<std::string> again = cache.Fetch(digest, cluster_->checkpoint_address());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(cache.stats().downloads, 1);
  EXPECT_EQ(cache.stats().bytes_downloaded, first.st_size);
  struct stat second {};
  ASSERT_EQ(stat(again->c_str(), &second), 0);
  EXPECT_EQ(second.st_ino, first.st_ino);

  // A restarted agent hashes what it finds and, when it matches, downloads nothing.
  CodeCache restarted(cache_dir, NodeOptions());
  ASSERT_TRUE(restarted.Fetch(digest, cluster_->checkpoint_address()).ok());
  EXPECT_EQ(restarted.stats().downloads, 0);
  EXPECT_EQ(restarted.stats().rejected, 0);
}

TEST_F(CodeClientsTest, CacheFetchesAgainACachedFileThatChangedWhileTheAgentWasDown) {
  const std::string digest = Push(MakeCodeDir(dir_.path()));
  const std::string cache_dir = dir_.path() + "/cache";
  std::string path;
  {
    CodeCache cache(cache_dir, NodeOptions());
    absl::StatusOr<std::string> fetched = cache.Fetch(digest, cluster_->checkpoint_address());
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    path = *fetched;
  }
  std::string bytes = ReadFile(path);
  bytes[bytes.size() / 3] ^= 0x01;
  WriteFile(path, bytes);
  WriteFile(path + ".part", "half a download of the last agent");

  CodeCache restarted(cache_dir, NodeOptions());
  EXPECT_FALSE(std::filesystem::exists(path + ".part"));
  absl::StatusOr<std::string> fetched = restarted.Fetch(digest, cluster_->checkpoint_address());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(restarted.stats().rejected, 1);
  EXPECT_EQ(restarted.stats().downloads, 1);
  EXPECT_EQ("sha256:" + *Sha256OfFile(*fetched), digest);
}

TEST_F(CodeClientsTest, ConcurrentFetchesOfOneDigestDownloadOnce) {
  const std::string digest = Push(MakeCodeDir(dir_.path()));
  CodeCache cache(dir_.path() + "/cache", NodeOptions());
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(8);
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = cache.Fetch(digest, cluster_->checkpoint_address()).status(); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& result : results) EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(cache.stats().downloads, 1);
}

TEST_F(CodeClientsTest, CacheEvictsTheLeastRecentlyUsedArchiveNotInUse) {
  std::vector<std::string> digests;
  for (int i = 0; i < 3; ++i) {
    const std::string code = dir_.path() + "/code-" + std::to_string(i);
    WriteFile(code + "/weights.bin", RandomBytes(1 << 20, 100 + i));
    digests.push_back(Push(code));
  }
  CodeCacheOptions options = NodeOptions();
  options.max_bytes = (2 << 20) + (64 << 10);  // two archives of a bit over 1 MiB, not three
  CodeCache cache(dir_.path() + "/cache", options);
  absl::StatusOr<CodeCache::Lease> held = cache.Acquire(digests[0], cluster_->checkpoint_address());
  ASSERT_TRUE(held.ok()) << held.status();
  absl::StatusOr<std::string> second = cache.Fetch(digests[1], cluster_->checkpoint_address());
  ASSERT_TRUE(second.ok()) << second.status();
  // Over the budget with the third: the first is the oldest but held, so the second goes.
  absl::StatusOr<std::string> third = cache.Fetch(digests[2], cluster_->checkpoint_address());
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(std::filesystem::exists(held->path()));
  EXPECT_FALSE(std::filesystem::exists(*second));
  EXPECT_TRUE(std::filesystem::exists(*third));
  EXPECT_EQ(cache.stats().evicted, 1);
}

TEST_F(CodeClientsTest, CacheRefusesUnknownAndMalformedDigestsKeepingNothing) {
  const std::string cache_dir = dir_.path() + "/cache";
  CodeCache cache(cache_dir, NodeOptions());
  absl::StatusOr<std::string> unknown =
      cache.Fetch("sha256:" + std::string(64, 'a'), cluster_->checkpoint_address());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  absl::StatusOr<std::string> malformed = cache.Fetch("sha256:xyz", cluster_->checkpoint_address());
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::is_empty(cache_dir));
}

TEST_F(CodeClientsTest, CacheRefusesBytesThatDoNotMatchTheDigest) {
  // The store's blob changed on its disk: the node must not keep or use those bytes.
  const std::string code = dir_.path() + "/corrupt";
  WriteFile(code + "/weights.bin", RandomBytes(1 << 20, 7));
  const std::string digest = Push(code);
  ASSERT_FALSE(digest.empty());
  std::string blob;
  for (const auto& file :
       std::filesystem::recursive_directory_iterator(cluster_->checkpoint_data_dir())) {
    if (file.is_regular_file() &&
        file.path().string().find(digest.substr(7)) != std::string::npos) {
      blob = file.path().string();
    }
  }
  ASSERT_FALSE(blob.empty()) << "no blob named after " << digest;
  std::string bytes = ReadFile(blob);
  bytes[bytes.size() / 2] ^= 0x01;
  WriteFile(blob, bytes);

  const std::string cache_dir = dir_.path() + "/cache";
  CodeCache cache(cache_dir, NodeOptions());
  absl::StatusOr<std::string> fetched = cache.Fetch(digest, cluster_->checkpoint_address());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kDataLoss) << fetched.status();
  EXPECT_TRUE(std::filesystem::is_empty(cache_dir));
  EXPECT_EQ(cache.stats().rejected, 1);
}

}  // namespace
}  // namespace gradhub
