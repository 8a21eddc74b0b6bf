#include "gpu_worker/ddp/comm/collective_checks.h"

#include <stdexcept>

#include "gpu_worker/ddp/comm/checks.h"

namespace gradhub::ddp::detail {
namespace {

// "allreduce in group 'x' rank 0/2": the start of every argument error. Built only when a
// check fails, so a valid call pays nothing for it.
std::string Site(const char* op, const ProcessGroup& group) {
  return StrCat(op, " in group '", group.name(), "' rank ", group.rank(), "/", group.size());
}

// "tensor", "tensors[3]".
std::string OperandName(const char* name, int index) {
  return index < 0 ? std::string(name) : StrCat(name, "[", index, "]");
}

// Throws "<where>: <operand> <problem>" unless `tensor` is defined, dense, contiguous, of a
// supported dtype and on `device`.
void CheckTensor(const char* op, const ProcessGroup& group, const c10::Device& device,
                 const at::Tensor& tensor, const char* name, int index = -1) {
  auto fail = [&](const std::string& problem) {
    throw std::invalid_argument(
        StrCat(Site(op, group), ": ", OperandName(name, index), " ", problem));
  };
  if (!tensor.defined()) fail("is undefined");
  if (tensor.layout() != at::kStrided) {
    fail(StrCat("must be a dense (strided) tensor, got layout ", tensor.layout()));
  }
  if (!IsSupportedDtype(tensor.scalar_type())) {
    fail(StrCat("has unsupported dtype ", DtypeName(tensor.scalar_type()),
                " (supported: float32, float64, float16, bfloat16, int64)"));
  }
  if (tensor.device() != device) {
    fail(StrCat("is on ", tensor.device(), ", this process group needs tensors on ", device));
  }
  if (!tensor.is_contiguous()) {
    fail(StrCat("is not contiguous (sizes ", tensor.sizes(), ", strides ", tensor.strides(),
                "); pass tensor.contiguous()"));
  }
}

}  // namespace

std::string DtypeName(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

bool IsSupportedDtype(at::ScalarType type) {
  return type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16 ||
         type == at::kLong;
}

CheckedCollective CheckBroadcast(const ProcessGroup& group, const c10::Device& device,
                                 const std::vector<at::Tensor>& tensors, int root) {
  if (root < 0 || root >= group.size()) {
    throw std::invalid_argument(
        StrCat(Site("broadcast", group), ": root ", root, " is not in [0, ", group.size(), ")"));
  }
  size_t total_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    CheckTensor("broadcast", group, device, tensors[i], "tensors", static_cast<int>(i));
    total_bytes += tensors[i].nbytes();
  }
  std::string detail = tensors.size() == 1 ? StrCat(DtypeName(tensors[0].scalar_type()), ", ",
                                                    tensors[0].numel(), " elements, root ", root)
                                           : StrCat(tensors.size(), " tensors, ", total_bytes,
                                                    " bytes, root ", root);
  return {std::move(detail), total_bytes == 0};
}

CheckedCollective CheckAllReduce(const ProcessGroup& group, const c10::Device& device,
                                 const at::Tensor& tensor, ReduceOp op) {
  CheckTensor("allreduce", group, device, tensor, "tensor");
  return {StrCat(DtypeName(tensor.scalar_type()), ", ", tensor.numel(), " elements, ",
                 ReduceOpName(op)),
          tensor.numel() == 0};
}

CheckedCollective CheckAllGather(const ProcessGroup& group, const c10::Device& device,
                                 const std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  CheckTensor("allgather", group, device, input, "input");
  auto fail = [&](size_t r, const std::string& problem) {
    throw std::invalid_argument(StrCat(Site("allgather", group), ": outputs[", r, "] ", problem));
  };
  if (static_cast<int>(outputs.size()) != group.size()) {
    throw std::invalid_argument(StrCat(Site("allgather", group), ": outputs has ", outputs.size(),
                                       " tensors, expected one per rank (", group.size(), ")"));
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    CheckTensor("allgather", group, device, outputs[r], "outputs", static_cast<int>(r));
    if (outputs[r].scalar_type() != input.scalar_type()) {
      fail(r, StrCat("has dtype ", DtypeName(outputs[r].scalar_type()), ", input has ",
                     DtypeName(input.scalar_type())));
    }
    if (outputs[r].sizes() != input.sizes()) {
      fail(r, StrCat("has shape ", outputs[r].sizes(), ", input has ", input.sizes()));
    }
  }
  return {StrCat(DtypeName(input.scalar_type()), ", ", input.numel(), " elements per rank"),
          input.numel() == 0};
}

CheckedCollective CheckPointToPoint(const ProcessGroup& group, const c10::Device& device,
                                    bool sending, const at::Tensor& tensor, int peer,
                                    uint32_t tag) {
  const char* op = sending ? "send" : "recv";
  CheckTensor(op, group, device, tensor, "tensor");
  const char* field = sending ? "dst" : "src";
  if (peer < 0 || peer >= group.size() || peer == group.rank()) {
    throw std::invalid_argument(StrCat(
        Site(op, group), ": ", field, " ", peer,
        peer == group.rank() ? " is this rank" : StrCat(" is not in [0, ", group.size(), ")")));
  }
  return {StrCat(DtypeName(tensor.scalar_type()), ", ", tensor.numel(), " elements, ",
                 sending ? "to" : "from", " rank ", peer, ", tag ", tag),
          false};
}

std::string DescribeCollective(const ProcessGroup& group, const char* kind, uint64_t seq,
                               const std::string& detail) {
  return StrCat(kind, " #", seq, detail.empty() ? "" : " (" + detail + ")", " in group '",
                group.name(), "' rank ", group.rank(), "/", group.size());
}

bool IsOneFlatBuffer(const std::vector<at::Tensor>& outputs, size_t bytes) {
  const auto* base = static_cast<const uint8_t*>(outputs[0].data_ptr());
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].data_ptr() != base + r * bytes) return false;
  }
  return true;
}

}  // namespace gradhub::ddp::detail
