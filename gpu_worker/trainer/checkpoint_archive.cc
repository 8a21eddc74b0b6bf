#include "gpu_worker/trainer/checkpoint_archive.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu_worker/trainer/checkpoint_pickle.h"
#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

// A class record is a few lines per attribute; anything near this is not one of ours.
constexpr size_t kMaxCodeBytes = 1 << 20;
// Type expressions nest this deep at most (Optional[List[Tuple[...]]]).
constexpr int kMaxTypeDepth = 4;

// What the exporter writes for a class without methods and constants (torch 1.13).
constexpr std::string_view kEmptyConstants("\x80\x02).", 4);
constexpr std::string_view kClassDebugPickle(
    "\x80\x02X\x18\x00\x00\x00"
    "FORMAT_WITH_STRING_TABLEq\x00X\x00\x00\x00\x00q\x01\x85q\x02K\x00"
    "ctorch.jit._pickle\nbuild_intlist\nq\x03(](etRK\x00K\x00\x87q\x04K\x00K\x00\x87K\x00\x87"
    "\x85q\x05\x87.",
    106);

[[noreturn]] void Refuse(const std::string& why) {
  throw UserError("checkpoint", "not an archive gradhub writes: " + why);
}

// The checkpoint's bytes for torch's zip reader, read in place (reads past the end get
// nothing, whatever the zip's directory claims).
class BytesAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesAdapter(std::string_view bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::string_view bytes_;
};

bool Consume(std::string_view& text, std::string_view prefix) {
  if (text.substr(0, prefix.size()) != prefix) return false;
  text.remove_prefix(prefix.size());
  return true;
}

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `word` not followed by more of a word.
bool ConsumeWord(std::string_view& text, std::string_view word) {
  if (text.substr(0, word.size()) != word) return false;
  if (text.size() > word.size() && IsWordChar(text[word.size()])) return false;
  text.remove_prefix(word.size());
  return true;
}

bool ConsumeDigits(std::string_view& text) {
  size_t n = 0;
  while (n < text.size() && n < 10 && std::isdigit(static_cast<unsigned char>(text[n]))) ++n;
  text.remove_prefix(n);
  return n > 0;
}

bool ConsumeIdentifier(std::string_view& text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0])) || !IsWordChar(text[0])) {
    return false;
  }
  size_t n = 0;
  while (n < text.size() && IsWordChar(text[n])) ++n;
  text.remove_prefix(n);
  return true;
}

// A name in double quotes, as the exporter quotes attribute names: printable, no quote or
// backslash inside.
bool ConsumeQuoted(std::string_view& text) {
  if (!Consume(text, "\"")) return false;
  const size_t end = text.find('"');
  if (end == std::string_view::npos) return false;
  for (char c : text.substr(0, end)) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '\\' || c == 0x7f) return false;
  }
  text.remove_prefix(end + 1);
  return true;
}

// `__torch__.Module` or `__torch__.___torch_mangle_<n>.Module`: a class of the archive.
bool ConsumeModuleType(std::string_view& text) {
  if (!Consume(text, "__torch__.")) return false;
  if (Consume(text, "___torch_mangle_") && !(ConsumeDigits(text) && Consume(text, "."))) {
    return false;
  }
  return ConsumeWord(text, "Module");
}

bool ConsumeType(std::string_view& text, int depth);

// `Name[T, T, ...]` with `arity` types (0: one or more).
bool ConsumeGeneric(std::string_view& text, int depth, size_t arity) {
  size_t types = 0;
  do {
    if (!ConsumeType(text, depth + 1)) return false;
    ++types;
  } while (Consume(text, ", "));
  return Consume(text, "]") && (arity == 0 || types == arity);
}

bool ConsumeType(std::string_view& text, int depth) {
  if (depth > kMaxTypeDepth) return false;
  for (std::string_view scalar : {"Tensor", "str", "int", "float", "bool", "NoneType"}) {
    if (ConsumeWord(text, scalar)) return true;
  }
  if (ConsumeModuleType(text)) return true;
  if (Consume(text, "Optional[") || Consume(text, "List[")) {
    return ConsumeGeneric(text, depth, 1);
  }
  if (Consume(text, "Dict[")) return ConsumeGeneric(text, depth, 2);
  if (Consume(text, "Tuple[")) return ConsumeGeneric(text, depth, 0);
  return false;
}

// `[]` or `["a", "b", ]`, as the exporter lists parameters and buffers.
bool ConsumeNameList(std::string_view& text) {
  if (!Consume(text, "[")) return false;
  while (ConsumeQuoted(text)) {
    if (!Consume(text, ", ")) return false;
  }
  return Consume(text, "]");
}

// One line of a class body (without its newline), step 2.
bool IsClassBodyLine(std::string_view line) {
  if (!Consume(line, "  ")) return false;
  bool ok;
  if (Consume(line, "__parameters__ = ") || Consume(line, "__buffers__ = ")) {
    ok = ConsumeNameList(line);
  } else if (Consume(line, "__annotations__")) {
    ok = Consume(line, " = []") || (Consume(line, "[") && ConsumeQuoted(line) &&
                                    Consume(line, "] = ") && ConsumeType(line, 0));
  } else {
    ok = ConsumeIdentifier(line) && Consume(line, " : ") && ConsumeType(line, 0);
  }
  return ok && line.empty();
}

// Step 2 for one code record.
void CheckClassCode(const std::string& name, std::string_view code) {
  if (code.size() > kMaxCodeBytes) Refuse(name + " is over " + std::to_string(kMaxCodeBytes));
  if (!Consume(code, "class Module(Module):\n")) Refuse(name + " does not declare one class");
  int line_number = 1;
  while (!code.empty()) {
    ++line_number;
    const size_t end = code.find('\n');
    if (end == std::string_view::npos) Refuse(name + " does not end with a newline");
    if (!IsClassBodyLine(code.substr(0, end))) {
      Refuse(name + ":" + std::to_string(line_number) + " is not an attribute declaration");
    }
    code.remove_prefix(end + 1);
  }
}

// The zip's own account of its records (its central directory, zip64 included): the name,
// without the archive's folder, and the size torch's reader gives its bytes (uncompressed).
// Empty when the directory cannot be read; torch's reader has refused that zip already.
class ZipDirectory {
 public:
  explicit ZipDirectory(std::string_view zip) : zip_(zip) {}

  std::optional<std::map<std::string, uint64_t>> RecordSizes() const {
    const std::optional<size_t> end = FindEnd();
    if (!end) return std::nullopt;
    uint64_t entries = Uint(*end + 10, 2), at = Uint(*end + 16, 4);
    if ((entries == 0xffff || at == 0xffffffff) && *end >= 20 &&
        Uint(*end - 20, 4) == 0x07064b50) {  // the zip64 locator, then its end record
      const uint64_t end64 = Uint(*end - 12, 8);
      if (Uint(end64, 4) != 0x06064b50) return std::nullopt;
      entries = Uint(end64 + 32, 8);
      at = Uint(end64 + 48, 8);
    }
    std::map<std::string, uint64_t> sizes;
    for (uint64_t i = 0; i < entries; ++i) {
      if (Uint(at, 4) != 0x02014b50) return std::nullopt;
      const uint64_t name_size = Uint(at + 28, 2), extra_size = Uint(at + 30, 2);
      const std::string name = Text(at + 46, name_size);
      std::optional<uint64_t> size = Uint(at + 24, 4);
      if (*size == 0xffffffff) size = Zip64Size(at + 46 + name_size, extra_size);
      const size_t slash = name.find('/');
      if (!size || slash == std::string::npos ||
          !sizes.emplace(name.substr(slash + 1), *size).second) {
        return std::nullopt;  // a size it does not give, or a name twice
      }
      at += 46 + name_size + extra_size + Uint(at + 32, 2);
    }
    return sizes;
  }

 private:
  // Little-endian, 0 past the end (which no signature or size then matches).
  uint64_t Uint(uint64_t at, size_t n) const {
    if (at > zip_.size() || n > zip_.size() - at) return 0;
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= uint64_t{static_cast<uint8_t>(zip_[at + i])} << (8 * i);
    return value;
  }
  std::string Text(uint64_t at, uint64_t n) const {
    if (at > zip_.size() || n > zip_.size() - at) return "";
    return std::string(zip_.substr(at, n));
  }
  // The end of central directory record: the last one whose comment ends the file.
  std::optional<size_t> FindEnd() const {
    for (size_t back = 22; back <= std::min<size_t>(zip_.size(), 22 + 0xffff); ++back) {
      const size_t at = zip_.size() - back;
      if (Uint(at, 4) == 0x06054b50 && Uint(at + 20, 2) == back - 22) return at;
    }
    return std::nullopt;
  }
  // The uncompressed size in a zip64 extra field (id 1), whose first value it is.
  std::optional<uint64_t> Zip64Size(uint64_t at, uint64_t size) const {
    for (uint64_t end = at + size; at + 4 <= end;) {
      const uint64_t id = Uint(at, 2), length = Uint(at + 2, 2);
      if (id == 1 && length >= 8) return Uint(at + 4, 8);
      at += 4 + length;
    }
    return std::nullopt;
  }

  std::string_view zip_;
};

enum class RecordKind { kData, kCode, kDebugPickle, kConstants, kOther };

// Step 1: what a record's name says it is; kOther for a name such an archive never has.
RecordKind KindOf(std::string_view name) {
  if (name == "data.pkl" || name == "version" || name == ".data/version") return RecordKind::kData;
  if (name == "constants.pkl") return RecordKind::kConstants;
  if (Consume(name, "data/")) {
    return ConsumeDigits(name) && name.empty() ? RecordKind::kData : RecordKind::kOther;
  }
  if (!Consume(name, "code/__torch__")) return RecordKind::kOther;
  if (Consume(name, "/___torch_mangle_") && !ConsumeDigits(name)) return RecordKind::kOther;
  if (name == ".py") return RecordKind::kCode;
  return name == ".py.debug_pkl" ? RecordKind::kDebugPickle : RecordKind::kOther;
}

std::string RecordText(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name) {
  try {
    auto [data, size] = reader.getRecord(name);
    return std::string(static_cast<const char*>(data.get()), size);
  } catch (const c10::Error& error) {  // e.g. a CRC that does not match
    Refuse(name + " cannot be read (" + error.what_without_backtrace() + ")");
  }
}

// Step 4: every storage the pickle asks for fits in the record that holds its bytes.
void CheckStorages(const std::vector<StorageClaim>& claims,
                   const std::map<std::string, uint64_t>& sizes) {
  for (const StorageClaim& claim : claims) {
    const auto record = sizes.find("data/" + claim.key);
    if (record == sizes.end() || record->second < claim.bytes) {
      Refuse("a storage of " + std::to_string(claim.bytes) +
             " bytes that its record does not hold");
    }
  }
}

}  // namespace

void CheckCheckpointArchive(std::string_view bytes) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::vector<std::string> records;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<BytesAdapter>(bytes));
    records = reader->getAllRecords();
  } catch (const c10::Error& error) {
    Refuse(std::string("not a readable zip archive (") + error.what_without_backtrace() + ")");
  }
  const std::optional<std::map<std::string, uint64_t>> sizes = ZipDirectory(bytes).RecordSizes();
  if (!sizes) Refuse("a zip directory that does not give every record's size once");
  // A reader allocates a record's size before it inflates it: none may claim more bytes than
  // the whole archive holds (the records gradhub writes are stored, or small code).
  for (const auto& [name, size] : *sizes) {
    if (size > bytes.size()) Refuse("a record that unpacks to more bytes than the whole archive");
  }
  if (records.size() > kMaxCheckpointRecords) {
    Refuse(std::to_string(records.size()) + " records, over " +
           std::to_string(kMaxCheckpointRecords));
  }
  for (const std::string& name : records) {
    switch (KindOf(name)) {
      case RecordKind::kData:
        if (name == "data.pkl") CheckStorages(ScanDataPickle(RecordText(*reader, name)), *sizes);
        break;
      case RecordKind::kCode:
        CheckClassCode(name, RecordText(*reader, name));
        break;
      case RecordKind::kDebugPickle:
        if (RecordText(*reader, name) != kClassDebugPickle) Refuse(name + " is not a class's");
        break;
      case RecordKind::kConstants:
        if (RecordText(*reader, name) != kEmptyConstants) Refuse(name + " is not empty");
        break;
      case RecordKind::kOther:
        Refuse("a record whose name such an archive never has");
    }
  }
}

}  // namespace gradhub::trainer
