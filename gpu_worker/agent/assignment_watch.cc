#include "gpu_worker/agent/assignment_watch.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "services/common/grpc_retry.h"

namespace gradhub::agent {

AssignmentWatch::AssignmentWatch(v1::NodeService::StubInterface* stub, std::string token,
                                 std::function<void()> wake)
    : stub_(stub), token_(std::move(token)), wake_(std::move(wake)) {
  thread_ = std::thread([this] { Run(); });
}

AssignmentWatch::~AssignmentWatch() { Stop(); }

void AssignmentWatch::Watch(const std::string& node, const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node == node_ && session_id == session_) return;
  node_ = node;
  session_ = session_id;
  ++session_generation_;
  if (open_ != nullptr) open_->TryCancel();  // step 1: the old session's stream is over
  changed_.notify_all();
}

void AssignmentWatch::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (open_ != nullptr) open_->TryCancel();
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

grpc::Status AssignmentWatch::WatchOnce(const std::string& node, const std::string& session) {
  grpc::ClientContext context;  // no deadline: the stream lives as long as the session
  context.AddMetadata("authorization", "Bearer " + token_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return grpc::Status::CANCELLED;
    open_ = &context;
  }
  v1::WatchAssignmentsRequest request;
  request.set_node(node);
  request.set_session_id(session);
  std::unique_ptr<grpc::ClientReaderInterface<v1::WatchAssignmentsResponse>> reader =
      stub_->WatchAssignments(&context, request);
  v1::WatchAssignmentsResponse message;
  while (reader->Read(&message)) {  // step 2
    ++news_;
    wake_();
  }
  grpc::Status status = reader->Finish();
  std::lock_guard<std::mutex> lock(mu_);
  open_ = nullptr;
  return status;
}

void AssignmentWatch::Run() {
  Backoff backoff(kGrpcBackoff);
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t failed_generation = 0;  // the session whose stream said FAILED_PRECONDITION
  while (true) {
    changed_.wait(lock, [&] {
      return stopping_ || (!session_.empty() && session_generation_ != failed_generation);
    });
    if (stopping_) return;
    const std::string node = node_, session = session_;
    const uint64_t generation = session_generation_;
    const uint64_t news_before = news_;
    lock.unlock();
    const grpc::Status status = WatchOnce(node, session);
    lock.lock();
    if (news_ != news_before) backoff.Reset();  // it worked for a while
    if (stopping_) return;
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {  // step 3
      std::cerr << "gradhub-agent: the api does not push assignments (" << status.error_message()
                << "); new work arrives with heartbeats\n";
      return;
    }
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      failed_generation = generation;  // wait for the next session
      backoff.Reset();
      continue;
    }
    if (generation != session_generation_) {  // a new session cancelled it: open at once
      backoff.Reset();
      continue;
    }
    changed_.wait_for(lock, backoff.Next(),
                      [&] { return stopping_ || generation != session_generation_; });
  }
}

}  // namespace gradhub::agent
