#include "services/common/audit/grpc_audit.h"

#include <google/protobuf/message.h>
#include <grpcpp/server_context.h>

#include <string>

#include "services/common/audit/audited_calls.h"
#include "services/common/auth/call_authorization.h"

namespace gradhub::audit {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using grpc::experimental::InterceptionHookPoints;

// gRPC hands messages over as void*: the generated message of the rpc, whose only base is
// google::protobuf::Message, so the pointer is also that Message's.
const Message* AsMessage(const void* message) { return static_cast<const Message*>(message); }

// A singular string field's value, "" when the message has no such field.
std::string StringField(const Message& message, const std::string& field) {
  const FieldDescriptor* descriptor = message.GetDescriptor()->FindFieldByName(field);
  if (descriptor == nullptr || descriptor->is_repeated() ||
      descriptor->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
    return "";
  }
  return message.GetReflection()->GetString(message, descriptor);
}

// What a response names: its `name`, else that of its first set message field
// (CreateTokenResponse.token), else "" (Empty).
std::string ReturnedName(const Message& response) {
  if (std::string name = StringField(response, "name"); !name.empty()) return name;
  const auto* descriptor = response.GetDescriptor();
  const auto* reflection = response.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated() &&
        reflection->HasField(response, field)) {
      return StringField(reflection->GetMessage(response, field), "name");
    }
  }
  return "";
}

std::string TargetOf(const AuditedRpc& rpc, const Message& request) {
  if (rpc.request_field.empty()) return "";
  const std::string value = StringField(request, std::string(rpc.request_field));
  return value.empty() ? "" : std::string(rpc.request_prefix) + value;
}

// One audited call, created with it and destroyed when it ends (see grpc_audit.h).
class AuditInterceptor final : public grpc::experimental::Interceptor {
 public:
  AuditInterceptor(CallAuditor* auditor, const AuditedRpc* rpc, grpc::ServerContextBase* context)
      : auditor_(auditor), rpc_(rpc), context_(context) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        !request_seen_) {
      request_seen_ = true;  // a client stream's later messages carry data, not the target
      if (const void* request = methods->GetRecvMessage()) {
        target_ = TargetOf(*rpc_, *AsMessage(request));
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      if (const void* response = methods->GetSendMessage()) {
        returned_ = ReturnedName(*AsMessage(response));
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void Record(const grpc::Status& status) {
    const absl::Status outcome(static_cast<absl::StatusCode>(status.error_code()),
                               status.error_message());
    FinishedCall call = GrpcCallOf(*context_, rpc_->method);
    call.resource = ResourceOf(outcome.ok(), returned_, target_);
    call.outcome = outcome;
    auditor_->Record(call);
  }

  CallAuditor* auditor_;
  const AuditedRpc* rpc_;
  grpc::ServerContextBase* context_;
  bool request_seen_ = false;
  std::string target_, returned_;
};

class AuditInterceptorFactoryImpl final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit AuditInterceptorFactoryImpl(CallAuditor* auditor) : auditor_(auditor) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const AuditedRpc* rpc = FindAuditedRpc(info->method() == nullptr ? "" : info->method());
    if (rpc == nullptr) return nullptr;  // gRPC then leaves the call alone
    return new AuditInterceptor(auditor_, rpc, info->server_context());
  }

 private:
  CallAuditor* auditor_;
};

}  // namespace

FinishedCall GrpcCallOf(const grpc::ServerContextBase& context, std::string_view method) {
  return {.method = method,
          .authorization = api::AuthorizationOf(context),
          .transport = "grpc",
          .peer = GrpcPeerAddress(context.peer())};
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> AuditInterceptorFactory(
    CallAuditor* auditor) {
  return std::make_unique<AuditInterceptorFactoryImpl>(auditor);
}

}  // namespace gradhub::audit
