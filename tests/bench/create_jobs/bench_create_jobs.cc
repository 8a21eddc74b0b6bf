// bench_create_jobs: CreateJob load against a running gradhub-api (see run.sh beside it).
//
// Two modes, chosen by --rate:
//   --rate 0  closed loop: every client issues CreateJob back to back, as fast as the server
//             answers; the figure is the sustained rate.
//   --rate R  open loop: a fixed timetable of R requests/s, request k due at start + k/R and
//             sent by client k % clients. Latency is measured from the *scheduled* send time,
//             not the actual one, so a slow answer that makes a client late counts against
//             every request it delays (no coordinated omission, as in wrk2). A client that is
//             late sends at once, never skips a slot, so the offered load stays R as long as
//             fewer than `clients` calls are outstanding.
//
// Each client is a thread making blocking calls. Each has its own channel by default
// (--channels = --clients): one HTTP/2 connection is one TCP stream and one server-side
// transport, which serialise framing and can become the bottleneck before the server does; 32
// users submitting jobs are 32 connections anyway. --channels 1 measures the shared-channel
// shape. Channels get distinct arguments and a local subchannel pool, because gRPC otherwise
// shares one connection between channels with equal arguments to the same target.
//
// Only requests that complete (closed) or are due (open) after --warmup seconds count. Every
// failed call is counted by status code and printed with the first message of its code;
// latency percentiles are over the successful calls; ok_per_s counts the successful calls
// that completed inside the measured window. Output: a header line, one data line
// (the fields run.sh reads), then one "error" line per status code seen.
//
// --trace FILE writes every counted call as "<ms> <latency ms> <status code>", <ms> being when
// it was due (open loop) or sent (closed loop) from the start of the measured window, in that
// order. Percentiles say how slow the tail is; the trace says when: a tail made of stalls that
// recur at a fixed period points at a timer somewhere, as the 100 ms every 1.1 s of gRPC's
// callback threads did (services/common/async_grpc_service.h).
//
// --acked FILE writes the name of every job whose CreateJob was answered OK (all of them, the
// warmup's too), one per line: tests/bench/control_plane/failover.sh checks that each is in the
// database after the replicas it was created through were killed.
//
// --serve-echo makes this program the server instead: a JobService whose CreateJob answers at
// once with a Job named jobs/echo-N holding the request's spec, served as gradhub-api serves
// (StartGrpcServer's defaults), on --server's port (0: a free one, printed as "serving gRPC on
// port N"), until SIGTERM or SIGINT. The same closed loop against it is what the call costs
// with no token check, no validation and no database: gRPC's own share of a CreateJob.
#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gradhub/v1/jobs.grpc.pb.h"
#include "services/common/abseil_mode.h"
#include "services/common/flags.h"
#include "services/common/grpc_server.h"
#include "tests/support/job_specs.h"

namespace {

using Clock = std::chrono::steady_clock;
using gradhub::v1::CreateJobRequest;
using gradhub::v1::Job;
using gradhub::v1::JobService;

constexpr auto kCallDeadline = std::chrono::seconds(10);
// Open loop: how long past the window a client may go on working off its backlog. Slots still
// unsent then are counted as errors (kNotSent) rather than left out, and keep a server that
// cannot keep up from stretching the run without bound.
constexpr auto kOpenLoopDrain = std::chrono::seconds(5);

struct Options {
  std::string server = "127.0.0.1:7070";
  std::string token;
  int64_t clients = 32;
  int64_t channels = 0;  // 0 = one per client
  int64_t seconds = 20;
  int64_t warmup = 3;
  int64_t rate = 0;  // requests/s; 0 = closed loop
  std::string label;
  std::string trace;  // file for the per-call trace; "" = none
  std::string acked;  // file for the names of the jobs created OK; "" = none
  // KEY=VALUE: every job asks for a node label no node has, and stays PENDING (the scheduling
  // bench's backlog); "" = the minimal spec as is.
  std::string node_selector;
  bool serve_echo = false;  // serve the echo JobService instead of calling one
};

// What one client saw in the measured window. Owned by its thread until the join.
struct ClientStats {
  std::vector<int64_t> latency_ns;  // successful calls only
  struct Traced {
    Clock::time_point start;  // due (open loop) or sent (closed loop)
    Clock::duration latency;
    int code;
  };
  bool tracing = false;           // --trace given
  std::vector<Traced> trace;      // every counted call, when tracing
  std::map<int, int64_t> errors;  // grpc::StatusCode (or kBadResponse) -> count
  std::map<int, std::string> first_message;
  std::vector<std::string> acked;  // names of the jobs created OK, when --acked is given
  int64_t requests = 0;
  // Successful calls that completed inside the measured window: the served rate. In the open
  // loop it falls below --rate when the server cannot keep up, while the due slots still all
  // count (late) in latency_ns.
  int64_t ok_in_window = 0;
};

// An OK status with a Job that has no name: the server claimed success without creating one.
constexpr int kBadResponse = 1000;
// Open loop: a slot due in the window that was never sent, the client being too far behind.
constexpr int kNotSent = 1001;

std::string CodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code == kBadResponse) return "OK_WITHOUT_JOB_NAME";
  if (code == kNotSent) return "NOT_SENT_CLIENT_BEHIND_SCHEDULE";
  if (code >= 0 && code < static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return kNames[code];
  return "CODE_" + std::to_string(code);
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& server, int index) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("gradhub.bench.channel", index);  // distinct arguments: never a shared connection
  return grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args);
}

class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, const Options& options, std::string id_prefix)
      : stub_(JobService::NewStub(std::move(channel))),
        options_(options),
        id_prefix_(std::move(id_prefix)) {
    request_.mutable_spec()->CopyFrom(gradhub::testing::MinimalJobSpec());
    // A dataset that needs no node's data root: the spec is valid whatever nodes are
    // registered (a CSV path is refused once nodes without it are).
    gradhub::v1::SyntheticDataset* synthetic =
        request_.mutable_spec()->mutable_dataset()->mutable_synthetic();
    synthetic->set_num_samples(1024);
    synthetic->set_num_features(64);
    synthetic->set_num_classes(10);
    request_.mutable_spec()->set_display_name("bench-create-jobs");
    if (const size_t eq = options.node_selector.find('='); eq != std::string::npos) {
      (*request_.mutable_spec()->mutable_node_selector())[options.node_selector.substr(0, eq)] =
          options.node_selector.substr(eq + 1);
    }
  }

  // One CreateJob with a request_id never used before. Returns the status code (kBadResponse
  // for an OK without a job) and fills *message for failures; with --acked, records the name.
  int Call(std::string* message, ClientStats* stats) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + options_.token);
    context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    request_.set_request_id(id_prefix_ + std::to_string(sequence_++));
    Job job;
    const grpc::Status status = stub_->CreateJob(&context, request_, &job);
    if (!status.ok()) {
      *message = status.error_message();
      return status.error_code();
    }
    if (job.name().empty()) {
      *message = "CreateJob returned OK and a Job without a name";
      return kBadResponse;
    }
    if (!options_.acked.empty()) stats->acked.push_back(job.name());
    return 0;
  }

 private:
  std::unique_ptr<JobService::Stub> stub_;
  const Options& options_;
  const std::string id_prefix_;
  CreateJobRequest request_;
  int64_t sequence_ = 0;
};

void Record(ClientStats* stats, int code, const std::string& message, Clock::time_point start,
            Clock::duration latency, bool done_in_window) {
  ++stats->requests;
  if (stats->tracing) stats->trace.push_back({start, latency, code});
  if (code == 0) {
    if (done_in_window) ++stats->ok_in_window;
    stats->latency_ns.push_back(
        std::chrono::duration_cast<std::chrono::nanoseconds>(latency).count());
    return;
  }
  if (stats->errors[code]++ == 0) stats->first_message[code] = message;
}

// Closed loop: back to back until `end`; a call counts if it completes inside [measure, end].
void RunClosed(Client* client, Clock::time_point measure, Clock::time_point end,
               ClientStats* stats) {
  std::string message;
  while (true) {
    const Clock::time_point sent = Clock::now();
    if (sent >= end) break;
    const int code = client->Call(&message, stats);
    const Clock::time_point done = Clock::now();
    if (done >= measure && done <= end) Record(stats, code, message, sent, done - sent, true);
  }
}

// Open loop: this client's slots are k = index, index + clients, ... of the global timetable
// start + k / rate; a slot counts if it is due inside [measure, end).
void RunOpen(Client* client, int index, const Options& options, Clock::time_point start,
             Clock::time_point measure, Clock::time_point end, ClientStats* stats) {
  std::string message;
  const double interval_ns = 1e9 / static_cast<double>(options.rate);
  for (int64_t k = index;; k += options.clients) {
    const Clock::time_point due =
        start +
        std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(k) * interval_ns));
    if (due >= end) break;
    if (Clock::now() > end + kOpenLoopDrain) {
      if (due >= measure)
        Record(stats, kNotSent, "more than 5 s behind the timetable", due, {}, false);
      continue;
    }
    std::this_thread::sleep_until(due);  // returns at once when this client is late
    const int code = client->Call(&message, stats);
    const Clock::time_point done = Clock::now();
    if (due >= measure) Record(stats, code, message, due, done - due, done <= end);
  }
}

bool WriteTrace(const std::string& path, const std::vector<ClientStats>& stats,
                Clock::time_point measure) {
  std::vector<ClientStats::Traced> calls;
  for (const ClientStats& s : stats) calls.insert(calls.end(), s.trace.begin(), s.trace.end());
  std::sort(calls.begin(), calls.end(),
            [](const auto& a, const auto& b) { return a.start < b.start; });
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return false;
  using Ms = std::chrono::duration<double, std::milli>;
  for (const ClientStats::Traced& call : calls) {
    std::fprintf(file, "%.3f %.3f %d\n", Ms(call.start - measure).count(), Ms(call.latency).count(),
                 call.code);
  }
  return std::fclose(file) == 0;
}

bool WriteAcked(const std::string& path, const std::vector<ClientStats>& stats) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return false;
  for (const ClientStats& s : stats) {
    for (const std::string& name : s.acked) std::fprintf(file, "%s\n", name.c_str());
  }
  return std::fclose(file) == 0;
}

double Percentile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i =
      std::min(sorted.size() - 1, static_cast<size_t>(p * static_cast<double>(sorted.size())));
  return static_cast<double>(sorted[i]) / 1e6;
}

}  // namespace

// CreateJob with nothing behind it (--serve-echo).
class EchoJobService final : public JobService::Service {
 public:
  grpc::Status CreateJob(grpc::ServerContext*, const CreateJobRequest* request, Job* job) override {
    job->set_name("jobs/echo-" + std::to_string(created_.fetch_add(1)));
    *job->mutable_spec() = request->spec();
    return grpc::Status::OK;
  }

 private:
  std::atomic<int64_t> created_{0};
};

int ServeEcho(const std::string& address) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before gRPC's threads start: they inherit it
  EchoJobService service;
  gradhub::GrpcServerOptions options;
  options.address = address;
  options.credentials = grpc::InsecureServerCredentials();
  auto server = gradhub::StartGrpcServer(
      options, [&service](grpc::ServerBuilder& builder) { builder.RegisterService(&service); });
  if (!server.ok()) {
    std::cerr << "bench_create_jobs: " << server.status().message() << "\n";
    return 1;
  }
  std::printf("serving gRPC on port %d\n", (*server)->port());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop, &signal);
  (*server)->Shutdown(absl::Seconds(1));
  return 0;
}

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  Options options;
  gradhub::Flags flags("bench_create_jobs",
                       "CreateJob load against gradhub-api: closed loop (--rate 0) or a fixed "
                       "rate with latency from the scheduled send time.");
  flags.String("server", "GRADHUB_SERVER", &options.server, "gradhub-api gRPC host:port")
      .String("token", "GRADHUB_TOKEN", &options.token, "tenant bearer token")
      .Int("clients", "", &options.clients, "concurrent clients (threads, one call in flight each)")
      .Int("channels", "", &options.channels,
           "gRPC channels the clients share round-robin; 0 = one per client")
      .Int("seconds", "", &options.seconds, "measured seconds, after the warmup")
      .Int("warmup", "", &options.warmup, "seconds run first and not counted")
      .Int("rate", "", &options.rate, "requests/s on a fixed timetable; 0 = closed loop")
      .String("label", "", &options.label,
              "first column of the data line; default closed or rate-R")
      .String("trace", "", &options.trace,
              "write every counted call to this file: ms from the window's start, latency ms, "
              "status code")
      .String("acked", "", &options.acked,
              "write the name of every job created OK (warmup included) to this file")
      .String("node-selector", "", &options.node_selector,
              "KEY=VALUE added to every job's nodeSelector (a label no node has keeps the jobs "
              "PENDING)")
      .Bool("serve-echo", "", &options.serve_echo,
            "serve a CreateJob that answers at once on --server's address, instead of calling");
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::cerr << "bench_create_jobs: " << parsed.status().message() << "\n";
    return 2;
  }
  if (parsed->help) {
    std::cout << flags.Usage();
    return 0;
  }
  if (options.serve_echo) return ServeEcho(options.server);
  if (options.token.empty() || options.clients < 1 || options.seconds < 1 || options.warmup < 0 ||
      options.rate < 0 || options.channels < 0) {
    std::cerr << "bench_create_jobs: needs --token (or GRADHUB_TOKEN), --clients >= 1, "
                 "--seconds >= 1, --warmup >= 0, --rate >= 0, --channels >= 0\n";
    return 2;
  }
  const int clients = static_cast<int>(options.clients);
  const int channels = options.channels == 0 ? clients : static_cast<int>(options.channels);
  if (options.label.empty())
    options.label = options.rate == 0 ? "closed" : "rate-" + std::to_string(options.rate);

  // request_ids unique across runs against the same database: a reused one would take the
  // dedup path (a SELECT, no insert) and flatter the figure.
  std::random_device entropy;
  char run_id[32];
  std::snprintf(run_id, sizeof run_id, "%08x%08x", entropy(), entropy());

  std::vector<std::shared_ptr<grpc::Channel>> pool;
  for (int i = 0; i < channels; ++i) {
    pool.push_back(NewChannel(options.server, i));
    if (!pool.back()->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::seconds(5))) {
      std::cerr << "bench_create_jobs: cannot connect to " << options.server << "\n";
      return 1;
    }
  }
  std::vector<std::unique_ptr<Client>> client_objects;
  for (int i = 0; i < clients; ++i) {
    client_objects.push_back(
        std::make_unique<Client>(pool[i % channels], options,
                                 std::string("bench-") + run_id + "-" + std::to_string(i) + "-"));
  }

  const Clock::time_point start = Clock::now() + std::chrono::milliseconds(50);
  const Clock::time_point measure = start + std::chrono::seconds(options.warmup);
  const Clock::time_point end = measure + std::chrono::seconds(options.seconds);
  std::vector<ClientStats> stats(clients);
  for (ClientStats& s : stats) s.tracing = !options.trace.empty();
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      if (options.rate == 0) {
        std::this_thread::sleep_until(start);
        RunClosed(client_objects[i].get(), measure, end, &stats[i]);
      } else {
        RunOpen(client_objects[i].get(), i, options, start, measure, end, &stats[i]);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Open loop: calls due before `end` may finish after it; the window is still the timetable's.
  const double window_s = static_cast<double>(options.seconds);

  ClientStats total;
  for (ClientStats& s : stats) {
    total.requests += s.requests;
    total.ok_in_window += s.ok_in_window;
    total.latency_ns.insert(total.latency_ns.end(), s.latency_ns.begin(), s.latency_ns.end());
    for (const auto& [code, n] : s.errors) {
      if (total.errors[code] == 0) total.first_message[code] = s.first_message[code];
      total.errors[code] += n;
    }
  }
  std::sort(total.latency_ns.begin(), total.latency_ns.end());
  if (!options.trace.empty() && !WriteTrace(options.trace, stats, measure)) {
    std::cerr << "bench_create_jobs: cannot write " << options.trace << "\n";
    return 1;
  }
  if (!options.acked.empty() && !WriteAcked(options.acked, stats)) {
    std::cerr << "bench_create_jobs: cannot write " << options.acked << "\n";
    return 1;
  }
  int64_t errors = 0;
  for (const auto& [code, n] : total.errors) errors += n;
  const int64_t ok = static_cast<int64_t>(total.latency_ns.size());

  std::printf("%-10s %7s %8s %7s %9s %9s %7s %10s %8s %8s %8s %8s\n", "mode", "clients", "channels",
              "seconds", "requests", "ok", "errors", "ok_per_s", "p50_ms", "p90_ms", "p99_ms",
              "max_ms");
  std::printf("%-10s %7d %8d %7" PRId64 " %9" PRId64 " %9" PRId64 " %7" PRId64
              " %10.1f %8.2f %8.2f %8.2f %8.2f\n",
              options.label.c_str(), clients, channels, options.seconds, total.requests, ok, errors,
              static_cast<double>(total.ok_in_window) / window_s,
              Percentile(total.latency_ns, 0.50), Percentile(total.latency_ns, 0.90),
              Percentile(total.latency_ns, 0.99),
              total.latency_ns.empty() ? 0.0 : static_cast<double>(total.latency_ns.back()) / 1e6);
  for (const auto& [code, n] : total.errors) {
    std::printf("error %s %" PRId64 " first: %s\n", CodeName(code).c_str(), n,
                total.first_message[code].c_str());
  }
  std::fflush(stdout);
  return 0;
}
