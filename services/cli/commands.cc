#include "services/cli/commands.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "services/cli/audit_commands.h"
#include "services/cli/checkpoint_commands.h"
#include "services/cli/cluster_commands.h"
#include "services/cli/code_commands.h"
#include "services/cli/job_layout.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/job_states.h"
#include "services/common/contract/user_error.h"

namespace gradhub::cli {
namespace {

// A random UUID (version 4): the default CreateJob request_id, so that one invocation is one
// job even if gRPC retries the call underneath.
std::string RandomRequestId() {
  std::random_device device;
  std::mt19937_64 random((static_cast<uint64_t>(device()) << 32) ^ device());
  uint64_t high = random(), low = random();
  high = (high & ~0xf000ull) | 0x4000ull;      // version 4
  low = (low & ~(3ull << 62)) | (2ull << 62);  // RFC 4122 variant
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", high >> 32, (high >> 16) & 0xffff,
                         high & 0xffff, low >> 48, low & 0xffffffffffffull);
}

// `nodes/<node>` or the bare node name.
std::string NodeName(const std::string& arg) {
  if (arg.empty()) return "";
  if (arg.rfind("nodes/", 0) == 0) return arg.size() > 6 ? arg : "";
  return arg.find('/') == std::string::npos ? "nodes/" + arg : "";
}

// `tenants/<id>` or the bare id.
std::string TenantName(const std::string& arg) {
  if (arg.empty()) return "";
  if (arg.rfind("tenants/", 0) == 0) return arg.size() > 8 ? arg : "";
  return arg.find('/') == std::string::npos ? "tenants/" + arg : "";
}

int ExitCodeForJob(v1::Job::State state) {
  switch (state) {
    case v1::Job::SUCCEEDED:
      return kOk;
    case v1::Job::FAILED:
      return kJobFailed;
    case v1::Job::CANCELLED:
      return kJobCancelled;
    default:
      return kInternal;
  }
}

// Page sizes arrive as int64 flags; the requests take int32. 0 = the server's default.
bool CheckPageSize(Invocation& inv, int64_t page_size) {
  if (page_size < 0 || page_size > std::numeric_limits<int32_t>::max()) {
    inv.UsageError(absl::StrCat("--page-size: ", page_size, " is not between 0 and 2^31-1"));
    return false;
  }
  return true;
}

// One page, or with `all` every page, of a List* call: each page's items are appended to
// *merged, whose next_page_token ends as that of the last page read. `items` picks the
// repeated field (jobs, nodes, ...) out of a response.
template <typename Request, typename Response, typename Call, typename Items>
grpc::Status Pages(Request request, bool all, Call call, Items items, Response* merged) {
  while (true) {
    Response page;
    grpc::Status status = call(request, &page);
    if (!status.ok()) return status;
    for (auto& item : *items(page)) *items(*merged)->Add() = std::move(item);
    merged->set_next_page_token(page.next_page_token());
    if (!all || page.next_page_token().empty()) return grpc::Status::OK;
    if (page.next_page_token() == request.page_token()) {
      // A server that hands back the token it was given would keep us here forever.
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "the server returned the same page token twice");
    }
    request.set_page_token(page.next_page_token());
  }
}

// For text output of a partial list: how to get the rest (on stderr, so stdout stays the list).
void MoreHint(Invocation& inv, const std::string& next_page_token) {
  if (next_page_token.empty()) return;
  inv.err() << "(more results: add --all, or --page-token " << next_page_token << ")\n";
}

template <typename T, typename Items>
std::vector<const T*> Pointers(const Items& items) {
  std::vector<const T*> out;
  for (const T& item : items) out.push_back(&item);
  return out;
}

// A pretty-printed JSON document (ToJson) nested `spaces` deeper: every line but the first
// indented, the trailing newline dropped.
std::string Indent(const std::string& json, int spaces) {
  std::string out;
  for (char c : absl::StripSuffix(json, "\n")) {
    out += c;
    if (c == '\n') out.append(spaces, ' ');
  }
  return out;
}

// Follows a job until it reaches a terminal state, printing every update: a redrawn bar on a
// terminal, one line per update elsewhere, one JSON document per line with --output json.
// The server's stream starts with the job as it is and ends after the terminal state; when it
// ends early (the server restarted) we reconnect, which is safe by the WatchJob contract
// because the first message resynchronizes.
int WatchUntilDone(Invocation& inv, const std::string& name) {
  constexpr int kMaxReconnects = 5;
  constexpr absl::Duration kReconnectDelay = absl::Seconds(1);
  const bool redraw = inv.out_is_terminal() && inv.format() == Format::kText;
  int reconnects = 0;
  std::string last_line;
  v1::Job last;
  bool seen = false;
  while (true) {
    std::unique_ptr<grpc::ClientContext> context = inv.client().StreamContext();
    v1::WatchJobRequest request;
    request.set_name(name);
    std::unique_ptr<grpc::ClientReaderInterface<v1::Job>> reader =
        inv.client().jobs().WatchJob(context.get(), request);
    v1::Job job;
    bool progressed = false;
    while (reader->Read(&job)) {
      progressed = true;
      seen = true;
      last = job;
      if (inv.format() == Format::kJson) {
        inv.out() << ToJson(job, /*pretty=*/false) << std::flush;
      } else if (redraw) {
        // \r and "erase to end of line": the bar replaces itself instead of scrolling.
        inv.out() << "\r" << ProgressBar(job) << "\x1b[K" << std::flush;
      } else if (std::string line = ProgressLine(job); line != last_line) {
        // A reconnect repeats the current version; a log should not show it twice.
        inv.out() << line << std::endl;
        last_line = std::move(line);
      }
      if (IsTerminal(job.state())) break;
    }
    if (seen && IsTerminal(last.state())) {
      context->TryCancel();  // the stream should end by itself now; do not wait for it
      reader->Finish();
      break;
    }
    const grpc::Status status = reader->Finish();
    if (progressed) reconnects = 0;
    const bool retry =
        status.ok() || (seen && status.error_code() == grpc::StatusCode::UNAVAILABLE);
    if (!retry || ++reconnects > kMaxReconnects) {
      if (redraw && seen) inv.out() << "\n";
      return status.ok() ? inv.Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                 "the watch stream kept ending early"))
                         : inv.Fail(status);
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(kReconnectDelay));
  }
  if (redraw) inv.out() << "\n";
  if (last.state() != v1::Job::SUCCEEDED && !last.state_reason().empty()) {
    inv.err() << "gradhub: " << last.name() << " " << v1::Job::State_Name(last.state()) << ": "
              << last.state_reason() << "\n";
  }
  return ExitCodeForJob(last.state());
}

// ---------------------------------------------------------------------------------------------
// Jobs.

// A relative path in a spec names a file beside the spec (as docker-compose resolves its
// paths), so that an example and its data move together; the nodes are handed absolute
// paths, since their working directory is not ours.
void ResolveSpecPaths(const std::string& spec_file, v1::JobSpec* spec) {
  const std::filesystem::path base =
      std::filesystem::absolute(std::filesystem::path(spec_file)).parent_path();
  auto resolve = [&](std::string* path) {
    if (path->empty() || std::filesystem::path(*path).is_absolute()) return;
    *path = (base / *path).lexically_normal().string();
  };
  // mutable_dataset() would give a script job, which has none, an empty dataset.
  if (spec->has_dataset()) {
    v1::DatasetSpec* dataset = spec->mutable_dataset();
    if (dataset->has_csv()) resolve(dataset->mutable_csv()->mutable_path());
    if (dataset->has_idx()) {
      resolve(dataset->mutable_idx()->mutable_images_path());
      resolve(dataset->mutable_idx()->mutable_labels_path());
    }
    if (dataset->has_text()) resolve(dataset->mutable_text()->mutable_path());
  }
  if (spec->model().has_torchscript()) {
    resolve(spec->mutable_model()->mutable_torchscript()->mutable_path());
  }
}

int Submit(Invocation& inv) {
  std::string file, request_id;
  bool watch = false;
  CodeFlags code;
  inv.ShortFlag("-f", "--file");
  code.Register(inv, /*with_dir=*/true);
  inv.flags()
      .String("file", "", &file,
              "-f: the job spec, YAML or JSON in the proto3 JSON mapping; - = stdin")
      .String("request-id", "", &request_id,
              "Idempotency key: resubmitting with the same one returns the same job; empty = a "
              "random one for this invocation")
      .Bool("watch", "", &watch,
            "Follow the job after submitting it, as `gradhub watch` (and exit as it does)");
  if (!inv.Parse(0, 0)) return inv.exit_code();
  if (file.empty()) return inv.UsageError("submit needs -f FILE");

  v1::CreateJobRequest request;
  try {
    *request.mutable_spec() = LoadJobSpec(file == "-" ? "/dev/stdin" : file);
    ResolveSpecPaths(file, request.mutable_spec());
  } catch (const UserError& error) {
    // Refused before anything is sent; the message names the field (or the line).
    return inv.Fail(kInvalidArgument, "INVALID_ARGUMENT", error.what());
  }
  if (const int exit = PushSpecCode(inv, code, file, request.mutable_spec()); exit != kOk) {
    return exit;
  }
  request.set_request_id(request_id.empty() ? RandomRequestId() : request_id);
  v1::Job job;
  grpc::Status status =
      inv.client().jobs().CreateJob(inv.client().UnaryContext().get(), request, &job);
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    // With --watch the updates follow as one document per line; without, the one Job.
    inv.out() << ToJson(job, /*pretty=*/!watch) << std::flush;
  } else {
    inv.out() << job.name() << std::endl;
  }
  return watch ? WatchUntilDone(inv, job.name()) : kOk;
}

// The single positional JOB of most job commands, or "" after reporting a usage error.
std::string JobArg(Invocation& inv) {
  std::string name = JobName(inv.positional()[0]);
  if (name.empty())
    inv.UsageError("JOB must be jobs/<id> or <id>, not '" + inv.positional()[0] + "'");
  return name;
}

int Get(Invocation& inv) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string name = JobArg(inv);
  if (name.empty()) return inv.exit_code();
  v1::GetJobRequest request;
  request.set_name(name);
  v1::Job job;
  grpc::Status status =
      inv.client().jobs().GetJob(inv.client().UnaryContext().get(), request, &job);
  if (!status.ok()) return inv.Fail(status);
  inv.out() << (inv.format() == Format::kJson ? ToJson(job) : JobSummary(job));
  return kOk;
}

int List(Invocation& inv) {
  std::string state, page_token;
  std::vector<std::string> labels;
  int64_t page_size = 0;
  bool all = false;
  inv.flags()
      .String("state", "", &state, "Only jobs in this state (PENDING, RUNNING, FAILED, ...)")
      .Int("page-size", "", &page_size, "Jobs per call; 0 = the server's default (50)")
      .Bool("all", "", &all, "Every page, not only the first")
      .String("page-token", "", &page_token, "Continue after the page that returned this token");
  inv.RepeatedFlag("label", &labels, "Only jobs with this label, KEY=VALUE");
  if (!inv.Parse(0, 0) || !CheckPageSize(inv, page_size)) return inv.exit_code();
  absl::StatusOr<std::string> filter =
      BuildFilter({{"state", absl::AsciiStrToUpper(state)}}, labels);
  if (!filter.ok()) return inv.UsageError(std::string(filter.status().message()));

  v1::ListJobsRequest request;
  request.set_page_size(static_cast<int32_t>(page_size));
  request.set_page_token(page_token);
  request.set_filter(*filter);
  v1::ListJobsResponse jobs;
  grpc::Status status = Pages(
      request, all,
      [&](const v1::ListJobsRequest& page_request, v1::ListJobsResponse* page) {
        return inv.client().jobs().ListJobs(inv.client().UnaryContext().get(), page_request, page);
      },
      [](v1::ListJobsResponse& r) { return r.mutable_jobs(); }, &jobs);
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(jobs);
  } else {
    inv.out() << JobsTable(Pointers<v1::Job>(jobs.jobs()));
    MoreHint(inv, jobs.next_page_token());
  }
  return kOk;
}

int Describe(Invocation& inv) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string name = JobArg(inv);
  if (name.empty()) return inv.exit_code();
  v1::GetJobRequest get;
  get.set_name(name);
  v1::Job job;
  grpc::Status status = inv.client().jobs().GetJob(inv.client().UnaryContext().get(), get, &job);
  if (!status.ok()) return inv.Fail(status);
  v1::ListJobEventsRequest request;
  request.set_parent(name);
  v1::ListJobEventsResponse events;
  status = Pages(
      request, /*all=*/true,
      [&](const v1::ListJobEventsRequest& page_request, v1::ListJobEventsResponse* page) {
        return inv.client().jobs().ListJobEvents(inv.client().UnaryContext().get(), page_request,
                                                 page);
      },
      [](v1::ListJobEventsResponse& r) { return r.mutable_events(); }, &events);
  if (!status.ok()) return inv.Fail(status);

  const v1::JobEvent* checkpoint = LatestCheckpoint(Pointers<v1::JobEvent>(events.events()));
  if (inv.format() == Format::kJson) {
    // One document, {"job": Job, "events": [JobEvent, ...]}, indented as protobuf indents,
    // with "latestCheckpoint": its CHECKPOINT_COMMITTED event when there is one.
    std::vector<std::string> items;
    for (const v1::JobEvent& event : events.events()) items.push_back(Indent(ToJson(event), 2));
    inv.out() << "{\n \"job\": " << Indent(ToJson(job), 1) << ",\n \"events\": ["
              << (items.empty() ? "]" : "\n  " + absl::StrJoin(items, ",\n  ") + "\n ]")
              << (checkpoint == nullptr
                      ? ""
                      : ",\n \"latestCheckpoint\": " + Indent(ToJson(*checkpoint), 1))
              << "\n}\n";
    return kOk;
  }
  std::string events_text;
  for (absl::string_view line : absl::StrSplit(EventsTable(Pointers<v1::JobEvent>(events.events())),
                                               '\n', absl::SkipEmpty())) {
    absl::StrAppend(&events_text, "  ", line, "\n");
  }
  inv.out() << JobSummary(job, CheckpointSummary(checkpoint)) << "spec:\n"
            << ToYaml(job.spec(), 2) << PipelineLayout(job, Pointers<v1::JobEvent>(events.events()))
            << "events:\n"
            << events_text;
  return kOk;
}

int Cancel(Invocation& inv) {
  std::string reason;
  inv.flags().String("reason", "", &reason, "Recorded in the job's events and state reason");
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string name = JobArg(inv);
  if (name.empty()) return inv.exit_code();
  v1::CancelJobRequest request;
  request.set_name(name);
  request.set_reason(reason);
  v1::Job job;
  grpc::Status status =
      inv.client().jobs().CancelJob(inv.client().UnaryContext().get(), request, &job);
  if (!status.ok()) return inv.Fail(status);
  // A job with ranks is CANCELLING until its agents report every rank gone, then CANCELLED
  // (`watch` follows it there).
  inv.out() << (inv.format() == Format::kJson
                    ? ToJson(job)
                    : absl::StrCat(job.name(), " ", v1::Job::State_Name(job.state()), "\n"));
  return kOk;
}

int Watch(Invocation& inv) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string name = JobArg(inv);
  if (name.empty()) return inv.exit_code();
  return WatchUntilDone(inv, name);
}

int Logs(Invocation& inv) {
  bool follow = false;
  int64_t rank = -1, attempt = 0;
  inv.ShortFlag("-f", "--follow");
  inv.flags()
      .Bool("follow", "", &follow, "-f: keep printing new lines until the attempt has ended")
      .Int("rank", "", &rank, "Only this rank; -1 = all ranks")
      .Int("attempt", "", &attempt, "Attempt number (1 = the first); 0 = the latest");
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string name = JobArg(inv);
  if (name.empty()) return inv.exit_code();
  if (rank < -1 || rank > std::numeric_limits<int32_t>::max()) {
    return inv.UsageError("--rank: must be -1 (all) or a rank");
  }
  if (attempt < 0 || attempt > std::numeric_limits<int32_t>::max()) {
    return inv.UsageError("--attempt: must be 0 (latest) or an attempt number");
  }
  v1::GetJobLogsRequest request;
  request.set_name(name);
  request.set_attempt(static_cast<int32_t>(attempt));
  if (rank >= 0) request.set_rank(static_cast<int32_t>(rank));
  request.set_follow(follow);
  // Without -f the stream is a bounded read and gets the deadline; with -f it lasts as long
  // as the attempt.
  std::unique_ptr<grpc::ClientContext> context =
      follow ? inv.client().StreamContext() : inv.client().UnaryContext();
  std::unique_ptr<grpc::ClientReaderInterface<v1::LogEntry>> reader =
      inv.client().jobs().GetJobLogs(context.get(), request);
  v1::LogEntry entry;
  while (reader->Read(&entry)) {
    inv.out() << (inv.format() == Format::kJson ? ToJson(entry, /*pretty=*/false)
                                                : LogLine(entry) + "\n");
    // Followed lines should appear as they arrive, also in a pipe.
    if (follow) inv.out().flush();
  }
  inv.out().flush();
  grpc::Status status = reader->Finish();
  return status.ok() ? kOk : inv.Fail(status);
}

int Metrics(Invocation& inv) {
  int64_t max_points = 0;
  inv.flags().Int("max-points", "", &max_points,
                  "Points at most, evenly spread over the steps (the first, the last and every "
                  "evaluation kept); 0 = the server's default (500), at most 10000");
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string name = JobArg(inv);
  if (name.empty()) return inv.exit_code();
  // The upper bound is the server's to name; only what an int32 cannot carry is refused here.
  if (max_points < 0 || max_points > std::numeric_limits<int32_t>::max()) {
    return inv.UsageError(
        absl::StrCat("--max-points: ", max_points, " is not between 0 and 10000"));
  }
  v1::GetJobMetricsRequest request;
  request.set_name(name);
  request.set_max_points(static_cast<int32_t>(max_points));
  v1::JobMetrics metrics;
  grpc::Status status =
      inv.client().jobs().GetJobMetrics(inv.client().UnaryContext().get(), request, &metrics);
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(metrics);
    return kOk;
  }
  // The plot below the table, so that it is what a long table leaves on the screen.
  inv.out() << MetricsTable(metrics);
  if (const std::string plot = LossPlot(metrics); !plot.empty()) inv.out() << "\n" << plot;
  // Notes on stderr, so that stdout stays the table and the plot.
  if (metrics.points_size() == 0) {
    inv.err() << "(no points yet: rank 0 reports every logEverySteps steps once training runs)\n";
  } else if (metrics.recorded_points() > metrics.points_size()) {
    inv.err() << "(" << metrics.points_size() << " of " << metrics.recorded_points()
              << " recorded points, evenly spread over the steps; --max-points shows more)\n";
  }
  return kOk;
}

// ---------------------------------------------------------------------------------------------
// Nodes (the admin token).

int NodesList(Invocation& inv) {
  std::string state, kind, page_token;
  std::vector<std::string> labels;
  int64_t page_size = 0;
  bool all = false;
  inv.flags()
      .String("state", "", &state, "Only nodes in this state (READY, CORDONED, DRAINING, LOST)")
      .String("kind", "", &kind, "Only nodes of this kind (CPU, CUDA)")
      .Int("page-size", "", &page_size, "Nodes per call; 0 = the server's default (50)")
      .Bool("all", "", &all, "Every page, not only the first")
      .String("page-token", "", &page_token, "Continue after the page that returned this token");
  inv.RepeatedFlag("label", &labels, "Only nodes with this label, KEY=VALUE");
  if (!inv.Parse(0, 0) || !CheckPageSize(inv, page_size)) return inv.exit_code();
  absl::StatusOr<std::string> filter = BuildFilter(
      {{"state", absl::AsciiStrToUpper(state)}, {"kind", absl::AsciiStrToUpper(kind)}}, labels);
  if (!filter.ok()) return inv.UsageError(std::string(filter.status().message()));

  v1::ListNodesRequest request;
  request.set_page_size(static_cast<int32_t>(page_size));
  request.set_page_token(page_token);
  request.set_filter(*filter);
  v1::ListNodesResponse nodes;
  grpc::Status status = Pages(
      request, all,
      [&](const v1::ListNodesRequest& page_request, v1::ListNodesResponse* page) {
        return inv.client().nodes().ListNodes(inv.client().UnaryContext().get(), page_request,
                                              page);
      },
      [](v1::ListNodesResponse& r) { return r.mutable_nodes(); }, &nodes);
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(nodes);
  } else {
    inv.out() << NodesTable(Pointers<v1::Node>(nodes.nodes()));
    MoreHint(inv, nodes.next_page_token());
  }
  return kOk;
}

// The single positional NODE, or "" after reporting a usage error.
std::string NodeArg(Invocation& inv) {
  std::string name = NodeName(inv.positional()[0]);
  if (name.empty()) {
    inv.UsageError("NODE must be nodes/<name> or <name>, not '" + inv.positional()[0] + "'");
  }
  return name;
}

int PrintNode(Invocation& inv, const grpc::Status& status, const v1::Node& node, bool summary) {
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(node);
  } else if (summary) {
    inv.out() << NodeSummary(node);
  } else {
    inv.out() << node.name() << " " << v1::Node::State_Name(node.state()) << "\n";
  }
  return kOk;
}

int NodesGet(Invocation& inv) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  v1::GetNodeRequest request;
  request.set_name(NodeArg(inv));
  if (request.name().empty()) return inv.exit_code();
  v1::Node node;
  grpc::Status status =
      inv.client().nodes().GetNode(inv.client().UnaryContext().get(), request, &node);
  return PrintNode(inv, status, node, /*summary=*/true);
}

int Cordon(Invocation& inv, bool cordon) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  v1::CordonNodeRequest request;
  request.set_name(NodeArg(inv));
  if (request.name().empty()) return inv.exit_code();
  request.set_cordon(cordon);
  v1::Node node;
  grpc::Status status =
      inv.client().nodes().CordonNode(inv.client().UnaryContext().get(), request, &node);
  return PrintNode(inv, status, node, /*summary=*/false);
}

int NodesCordon(Invocation& inv) { return Cordon(inv, true); }
int NodesUncordon(Invocation& inv) { return Cordon(inv, false); }

int NodesDrain(Invocation& inv) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  v1::DrainNodeRequest request;
  request.set_name(NodeArg(inv));
  if (request.name().empty()) return inv.exit_code();
  v1::Node node;
  grpc::Status status =
      inv.client().nodes().DrainNode(inv.client().UnaryContext().get(), request, &node);
  return PrintNode(inv, status, node, /*summary=*/false);
}

// ---------------------------------------------------------------------------------------------
// Admin (the admin token).

int CreateTenant(Invocation& inv) {
  std::string display_name, request_id;
  inv.flags()
      .String("display-name", "", &display_name, "Free text for humans")
      .String("request-id", "", &request_id,
              "Idempotency key: a retry with the same one returns the tenant the first call made");
  if (!inv.Parse(1, 1)) return inv.exit_code();
  std::string id = inv.positional()[0];
  if (id.rfind("tenants/", 0) == 0) id = id.substr(8);
  v1::CreateTenantRequest request;
  request.set_tenant_id(id);  // the server checks its syntax and names the field
  request.mutable_tenant()->set_display_name(display_name);
  request.set_request_id(request_id);
  v1::Tenant tenant;
  grpc::Status status =
      inv.client().admin().CreateTenant(inv.client().UnaryContext().get(), request, &tenant);
  if (!status.ok()) return inv.Fail(status);
  inv.out() << (inv.format() == Format::kJson ? ToJson(tenant) : tenant.name() + "\n");
  return kOk;
}

int ListTenants(Invocation& inv) {
  std::string page_token;
  int64_t page_size = 0;
  bool all = false;
  inv.flags()
      .Int("page-size", "", &page_size, "Tenants per call; 0 = the server's default (50)")
      .Bool("all", "", &all, "Every page, not only the first")
      .String("page-token", "", &page_token, "Continue after the page that returned this token");
  if (!inv.Parse(0, 0) || !CheckPageSize(inv, page_size)) return inv.exit_code();
  v1::ListTenantsRequest request;
  request.set_page_size(static_cast<int32_t>(page_size));
  request.set_page_token(page_token);
  v1::ListTenantsResponse tenants;
  grpc::Status status = Pages(
      request, all,
      [&](const v1::ListTenantsRequest& page_request, v1::ListTenantsResponse* page) {
        return inv.client().admin().ListTenants(inv.client().UnaryContext().get(), page_request,
                                                page);
      },
      [](v1::ListTenantsResponse& r) { return r.mutable_tenants(); }, &tenants);
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(tenants);
  } else {
    inv.out() << TenantsTable(Pointers<v1::Tenant>(tenants.tenants()));
    MoreHint(inv, tenants.next_page_token());
  }
  return kOk;
}

int CreateToken(Invocation& inv) {
  std::string kind = "tenant", description;
  inv.flags()
      .String("kind", "", &kind, "tenant (jobs of TENANT) or node (for agents and trainers)")
      .String("description", "", &description, "Free text, e.g. who or what holds it");
  if (!inv.Parse(1, 1)) return inv.exit_code();
  v1::CreateTokenRequest request;
  request.set_parent(TenantName(inv.positional()[0]));
  if (request.parent().empty()) {
    return inv.UsageError("TENANT must be tenants/<id> or <id>");
  }
  const std::string lower = absl::AsciiStrToLower(kind);
  if (lower == "tenant") {
    request.mutable_token()->set_kind(v1::Token::TENANT);
  } else if (lower == "node") {
    request.mutable_token()->set_kind(v1::Token::NODE);
  } else {
    return inv.UsageError("--kind: '" + kind + "' is not tenant or node");
  }
  request.mutable_token()->set_description(description);
  v1::CreateTokenResponse response;
  grpc::Status status =
      inv.client().admin().CreateToken(inv.client().UnaryContext().get(), request, &response);
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(response);
  } else {
    // The secret alone on stdout, so `TOKEN=$(gradhub admin create-token t)` works; the rest
    // is a note for the person running it.
    inv.out() << response.secret() << std::endl;
    inv.err() << "created " << response.token().name() << " (prefix " << response.token().prefix()
              << "); the secret above is shown only this once and cannot be recovered\n";
  }
  return kOk;
}

int RevokeToken(Invocation& inv) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::vector<std::string> parts = absl::StrSplit(inv.positional()[0], '/');
  if (parts.size() != 4 || parts[0] != "tenants" || parts[1].empty() || parts[2] != "tokens" ||
      parts[3].empty()) {
    return inv.UsageError("TOKEN_NAME must be tenants/<id>/tokens/<id>");
  }
  v1::RevokeTokenRequest request;
  request.set_name(inv.positional()[0]);
  v1::Token token;
  grpc::Status status =
      inv.client().admin().RevokeToken(inv.client().UnaryContext().get(), request, &token);
  if (!status.ok()) return inv.Fail(status);
  inv.out() << (inv.format() == Format::kJson ? ToJson(token) : TokenSummary(token));
  return kOk;
}

}  // namespace

std::string JobName(const std::string& arg) {
  if (arg.rfind("jobs/", 0) == 0) return arg.size() > 5 ? arg : "";
  // A bare id; a malformed one is the server's NOT_FOUND (ids leak nothing either way).
  return !arg.empty() && arg.find('/') == std::string::npos ? "jobs/" + arg : "";
}

absl::StatusOr<std::string> BuildFilter(
    const std::vector<std::pair<std::string, std::string>>& fields,
    const std::vector<std::string>& labels) {
  std::vector<std::string> terms;
  for (const auto& [field, value] : fields) {
    if (value.empty()) continue;
    // Enum names: letters, digits and '_' only, so nothing here can break the grammar.
    if (!std::all_of(value.begin(), value.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_'; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", field, ": '", value, "' is not a valid name"));
    }
    terms.push_back(absl::StrCat(field, "=", value));
  }
  for (const std::string& label : labels) {
    const size_t eq = label.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--label: '", label, "' is not KEY=VALUE"));
    }
    const std::string key = label.substr(0, eq), value = label.substr(eq + 1);
    // The grammar has no escapes: a key ends at '=', a quoted value at the next '"'.
    if (key.find_first_of(" \"") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--label: key '", key, "' may not contain spaces or '\"'"));
    }
    if (value.find('"') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--label: value '", value, "' may not contain '\"'"));
    }
    terms.push_back(absl::StrCat("labels.", key, "=\"", value, "\""));
  }
  return absl::StrJoin(terms, " AND ");
}

namespace {

// A tenant's commands: jobs, their output and checkpoints, code.
std::vector<Command> JobCommands() {
  return {
      {"submit", "-f FILE [--code DIR] [--request-id ID] [--watch]",
       "Submit a job from a YAML or JSON spec (relative paths in it are relative to FILE); "
       "prints its name (jobs/<id>). A script job's code directory (--code, or a directory as "
       "script.code) is packed and uploaded first, as `code push` does.",
       Submit},
      {"get", "JOB", "Show a job's state and progress.", Get},
      {"list", "[--state S] [--label K=V]... [--page-size N] [--all]", "List jobs, newest first.",
       List},
      {"describe", "JOB", "Show a job, its spec and its events.", Describe},
      {"cancel", "JOB [--reason R]", "Cancel a job (idempotent).", Cancel},
      {"watch", "JOB",
       "Follow a job until it ends (on a terminal: a progress bar with the time left); exit 0 "
       "if it SUCCEEDED, 8 if it FAILED, 9 if CANCELLED.",
       Watch},
      {"logs", "JOB [-f] [--rank R] [--attempt A]",
       "Print a job's output as `[rank R] line`; -f follows it.", Logs},
      {"metrics", "JOB [--max-points N]",
       "Show a job's training history by step (loss, lr, samples/s, evaluations) and plot its "
       "loss.",
       Metrics},
      {"checkpoints list", "JOB [--state S] [--page-size N] [--all]",
       "List a job's checkpoints, newest step first (from --checkpoint-server).", CheckpointsList},
      {"checkpoints download", "NAME -o FILE",
       "Download checkpoint jobs/<id>/checkpoints/<step> into FILE, verifying its sha256.",
       CheckpointsDownload},
      {"code push", "DIR [--max-code-bytes N]",
       "Pack DIR (minus what its .gradhubignore excludes) and upload it to --checkpoint-server "
       "unless it is there already; prints its digest, sha256:<hex>, for script.code.",
       CodePush},
      {"code get", "sha256:<hex>", "Show an uploaded code archive (size, entries, created).",
       CodeGet},
  };
}

// An operator's commands (admin token) and the local cluster's.
std::vector<Command> OperatorCommands() {
  return {
      {"nodes list", "[--state S] [--kind K] [--label K=V]... [--all]",
       "List nodes (admin token). `gradhub nodes` alone does the same.", NodesList},
      {"nodes get", "NODE", "Show a node and its devices (admin token).", NodesGet},
      {"nodes cordon", "NODE", "Stop placing new ranks on a node (admin token).", NodesCordon},
      {"nodes uncordon", "NODE", "Place ranks on a node again (admin token).", NodesUncordon},
      {"nodes drain", "NODE", "Cordon a node and restart its jobs elsewhere (admin token).",
       NodesDrain},
      {"admin create-tenant", "NAME [--display-name D] [--request-id ID]",
       "Create a tenant (admin token).", CreateTenant},
      {"admin list-tenants", "[--page-size N] [--all]", "List tenants (admin token).", ListTenants},
      {"admin create-token", "TENANT [--kind tenant|node] [--description D]",
       "Create a token and print its secret, shown only once (admin token).", CreateToken},
      {"admin revoke-token", "TOKEN_NAME",
       "Revoke a token (tenants/<id>/tokens/<id>); idempotent (admin token).", RevokeToken},
      {"admin audit",
       "[--tenant T] [--actor A] [--method M] [--resource R] [--outcome O] [--limit N] [-o json]",
       "Show the audit log of mutating calls, newest first (admin token: every tenant's; a "
       "tenant token: its own tenant's).",
       AdminAudit},
      {"cluster up", "[--data-root DIR]... [--insecure]",
       "Start a local cluster (PostgreSQL, api, checkpoint, metrics, two agents, Prometheus) "
       "in the background and make it this CLI's default; harmless when it is up. TLS with a "
       "CA of its own (--insecure: plaintext). State and "
       "logs in $GRADHUB_STATE_DIR, else $XDG_STATE_HOME/gradhub, else ~/.gradhub (as root "
       "/var/lib/gradhub/local); $GRADHUB_DATABASE_URL: that database instead of a private "
       "PostgreSQL; $GRADHUB_BIN: where the services' binaries are (default: beside gradhub).",
       ClusterUpCommand},
      {"cluster certs", "--out DIR [--ca-dir DIR] [--hosts H,...] [--nodes N,...]",
       "Make a cluster CA (kept when there is one) and issue its servers' certificate "
       "(localhost, 127.0.0.1 and --hosts) and a client certificate per agent node; keys 0600. "
       "For docker-compose and Kubernetes; `cluster up` makes its own.",
       ClusterCertsCommand},
      {"cluster status", "", "Show the local cluster's services; exit 6 if one has stopped.",
       ClusterStatusCommand},
      {"cluster down", "", "Stop the local cluster (only what `cluster up` started).",
       ClusterDownCommand},
      {"cluster logs", "[SERVICE] [--tail N]",
       "Print a local service's log (postgres, api, checkpoint, metrics, node-a, node-b, "
       "prometheus); without SERVICE, all of them.",
       ClusterLogsCommand},
  };
}

}  // namespace

const std::vector<Command>& AllCommands() {
  static const auto* const kCommands = [] {
    auto* commands = new std::vector<Command>(JobCommands());
    for (Command& command : OperatorCommands()) commands->push_back(std::move(command));
    return commands;
  }();
  return *kCommands;
}

}  // namespace gradhub::cli
