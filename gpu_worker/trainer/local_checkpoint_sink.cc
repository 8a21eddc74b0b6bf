#include "gpu_worker/trainer/local_checkpoint_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "services/common/sha256.h"

namespace gradhub::trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kFooterMagic[] = "GHCKPT1";

std::vector<std::pair<int64_t, fs::path>> ListCheckpoints(const std::string& directory) {
  static const std::regex kName(R"(ckpt-([0-9]+)\.gh)");
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, kName))
      found.emplace_back(std::stoll(match[1]), entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

[[noreturn]] void Fail(const std::string& what, const std::string& path) {
  throw std::runtime_error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

LocalCheckpointSink::LocalCheckpointSink(std::string directory, int keep_last)
    : directory_(std::move(directory)), keep_last_(std::max(1, keep_last)) {
  fs::create_directories(directory_);
}

void LocalCheckpointSink::Save(const Checkpoint& checkpoint) {
  std::ostringstream footer;
  footer << '\n'
         << kFooterMagic << ' ' << checkpoint.bytes.size() << ' '
         << Sha256Hex(checkpoint.bytes.view()) << '\n';
  const std::string footer_text = footer.str();
  const std::string final_path =
      (fs::path(directory_) / ("ckpt-" + std::to_string(checkpoint.step) + ".gh")).string();
  const std::string temp_path = final_path + ".tmp";
  int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail("cannot create", temp_path);
  for (std::string_view part : {checkpoint.bytes.view(), std::string_view(footer_text)}) {
    size_t written = 0;
    while (written < part.size()) {
      ssize_t n = ::write(fd, part.data() + written, part.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        ::close(fd);
        Fail("cannot write", temp_path);
      }
      written += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    Fail("cannot fsync", temp_path);
  }
  ::close(fd);
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) Fail("cannot rename", temp_path);
  auto all = ListCheckpoints(directory_);
  for (size_t i = 0; i + keep_last_ < all.size(); ++i) fs::remove(all[i].second);
}

std::optional<Checkpoint> LocalCheckpointSink::LoadLatest() {
  auto all = ListCheckpoints(directory_);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::string reason = "no footer (torn write?)";
    CheckpointBytes content;  // mapped: a checkpoint need not fit in memory (sinks.h)
    try {
      content = CheckpointBytes::MapFile(it->second.string());
    } catch (const std::runtime_error& error) {
      reason = error.what();
    }
    const size_t footer_start = content.view().rfind(std::string("\n") + kFooterMagic + " ");
    if (footer_start != std::string_view::npos) {
      std::istringstream footer(std::string(content.view().substr(footer_start + 1)));
      std::string magic, sha;
      size_t size = 0;
      footer >> magic >> size >> sha;
      CheckpointBytes payload = content.Slice(0, footer_start);
      if (size != payload.size()) {
        reason =
            "length " + std::to_string(payload.size()) + " but footer says " + std::to_string(size);
      } else if (Sha256Hex(payload.view()) != sha) {
        reason = "SHA-256 mismatch";
      } else {
        return Checkpoint{it->first, std::move(payload)};
      }
    }
    std::cerr << "gradhub-trainer: skipping corrupt checkpoint " << it->second.string() << ": "
              << reason << "\n";
  }
  return std::nullopt;
}

}  // namespace gradhub::trainer
