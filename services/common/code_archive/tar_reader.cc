#include "services/common/code_archive/tar_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "services/common/code_archive/names.h"
#include "services/common/status_macros.h"

namespace gradhub::code {
namespace {

bool IsMetadata(char type) {
  return type == tar::kPaxEntry || type == tar::kPaxGlobal || type == tar::kGnuLongName ||
         type == tar::kGnuLongLink;
}

// A GNU long name's data: the name, then NULs.
std::string UpToNul(const std::string& data) { return data.substr(0, data.find('\0')); }

}  // namespace

absl::Status TarReader::Feed(absl::string_view bytes) {
  while (error_.ok() && !bytes.empty()) {
    switch (phase_) {
      case Phase::kHeader:
      case Phase::kSecondZero:
        error_ = TakeBlock(&bytes);
        break;
      case Phase::kData:
        error_ = TakeData(&bytes);
        break;
      case Phase::kPadding:
        TakePadding(&bytes);
        break;
      case Phase::kEnd:
        return absl::OkStatus();
    }
  }
  return error_;
}

absl::Status TarReader::Finish() {
  if (!error_.ok()) return error_;
  const int64_t size = entry_.size;
  switch (phase_) {
    case Phase::kEnd:
      return absl::OkStatus();
    case Phase::kData:
      error_ = EntryError(
          entry_.name, absl::StrFormat("truncated: the archive ends %d bytes into its %d of data",
                                       size - data_left_, size));
      break;
    case Phase::kPadding:
      error_ = absl::InvalidArgumentError("archive: truncated inside the padding of a block");
      break;
    case Phase::kSecondZero:
      error_ = absl::InvalidArgumentError(
          "archive: ends after one zero block; its end marker is two zero blocks");
      break;
    case Phase::kHeader:
      error_ = absl::InvalidArgumentError(
          block_.empty() ? "archive: ends without its end marker (two zero blocks)"
                         : "archive: truncated inside a header block");
      break;
  }
  return error_;
}

absl::Status TarReader::TakeBlock(absl::string_view* bytes) {
  if (block_.empty() && bytes->size() >= tar::kBlockBytes) {  // the whole block here: no copy
    const absl::string_view block = bytes->substr(0, tar::kBlockBytes);
    bytes->remove_prefix(tar::kBlockBytes);
    return OnBlock(block);
  }
  const size_t take = std::min(tar::kBlockBytes - block_.size(), bytes->size());
  block_.append(bytes->data(), take);
  bytes->remove_prefix(take);
  if (block_.size() < tar::kBlockBytes) return absl::OkStatus();
  const std::string block = std::exchange(block_, {});
  return OnBlock(block);
}

absl::Status TarReader::TakeData(absl::string_view* bytes) {
  const size_t take = static_cast<size_t>(std::min<int64_t>(data_left_, bytes->size()));
  const absl::string_view piece = bytes->substr(0, take);
  bytes->remove_prefix(take);
  data_left_ -= static_cast<int64_t>(take);
  if (entry_is_metadata_) {
    metadata_.append(piece.data(), piece.size());
  } else {
    GRADHUB_RETURN_IF_ERROR(sink_->OnData(piece));
  }
  return data_left_ == 0 ? EndOfData() : absl::OkStatus();
}

void TarReader::TakePadding(absl::string_view* bytes) {
  const size_t take = static_cast<size_t>(std::min<int64_t>(padding_left_, bytes->size()));
  bytes->remove_prefix(take);
  padding_left_ -= static_cast<int64_t>(take);
  if (padding_left_ == 0) phase_ = Phase::kHeader;
}

absl::Status TarReader::OnBlock(absl::string_view block) {
  const bool zero = tar::IsZeroBlock(block);
  if (phase_ == Phase::kSecondZero) {
    if (!zero) {
      return absl::InvalidArgumentError(
          "archive: a lone zero block before a header; its end marker is two zero blocks");
    }
    phase_ = Phase::kEnd;
    return absl::OkStatus();
  }
  if (zero) {
    if (pending_.path || pending_.link_target || pending_.size) {
      return absl::InvalidArgumentError(
          "archive: a pax or GNU long-name header without the entry it describes");
    }
    phase_ = Phase::kSecondZero;
    return absl::OkStatus();
  }
  absl::StatusOr<tar::Header> header = tar::ParseHeader(block);
  if (!header.ok()) return EntryError(tar::NameFieldOf(block), header.status().message());
  return OnHeader(*header);
}

absl::Status TarReader::OnHeader(const tar::Header& header) {
  entry_is_metadata_ = IsMetadata(header.type);
  if (entry_is_metadata_) {
    if (header.size > kMaxMetadataBytes) {
      return EntryError(header.name, absl::StrFormat("a metadata header of %d bytes, over %d",
                                                     header.size, kMaxMetadataBytes));
    }
    entry_ = TarEntry{header.name, header.type, "", header.size, header.mode};
    metadata_.clear();
  } else {
    entry_ = TarEntry{pending_.path.value_or(header.name), header.type,
                      pending_.link_target.value_or(header.link_target),
                      pending_.size.value_or(header.size), header.mode};
    pending_ = {};
    GRADHUB_RETURN_IF_ERROR(sink_->OnEntry(entry_));
  }
  data_left_ = entry_.size;
  padding_left_ = tar::PaddingOf(entry_.size);
  phase_ = Phase::kData;
  return data_left_ == 0 ? EndOfData() : absl::OkStatus();
}

absl::Status TarReader::EndOfData() {
  phase_ = padding_left_ > 0 ? Phase::kPadding : Phase::kHeader;
  const absl::Status ended = entry_is_metadata_ ? ApplyMetadata() : sink_->OnEntryEnd();
  entry_ = {};
  return ended;
}

absl::Status TarReader::ApplyMetadata() {
  switch (entry_.type) {
    case tar::kPaxEntry: {
      const absl::Status parsed = tar::ParsePaxRecords(metadata_, &pending_);
      return parsed.ok() ? parsed : EntryError(entry_.name, parsed.message());
    }
    case tar::kGnuLongName:
      pending_.path = UpToNul(metadata_);
      return absl::OkStatus();
    case tar::kGnuLongLink:
      pending_.link_target = UpToNul(metadata_);
      return absl::OkStatus();
    default:  // kPaxGlobal: defaults for every later entry; none of its keys matters here
      return absl::OkStatus();
  }
}

}  // namespace gradhub::code
