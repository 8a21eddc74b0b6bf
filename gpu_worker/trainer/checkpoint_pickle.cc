#include "gpu_worker/trainer/checkpoint_pickle.h"

#include <cctype>
#include <limits>
#include <memory>
#include <utility>

#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

// What the scan knows of a value on the pickle's stack: literals exactly (they make the
// persistent ids), the rest as "something" (objects, lists, dicts, floats, tensors).
struct Value {
  enum class Kind { kOpaque, kInt, kStr, kGlobal, kTuple };
  Kind kind = Kind::kOpaque;
  int64_t integer = 0;
  std::string_view text;                            // kStr; kGlobal: the module
  std::string_view name;                            // kGlobal
  std::shared_ptr<const std::vector<Value>> items;  // kTuple; shared, so a GET copies no items
};

// The bytes per element of torch's storage classes (GLOBAL torch <Type>Storage).
int64_t ItemSize(std::string_view storage) {
  static const std::pair<std::string_view, int64_t> kSizes[] = {
      {"FloatStorage", 4},    {"DoubleStorage", 8},       {"HalfStorage", 2},
      {"BFloat16Storage", 2}, {"LongStorage", 8},         {"IntStorage", 4},
      {"ShortStorage", 2},    {"CharStorage", 1},         {"ByteStorage", 1},
      {"BoolStorage", 1},     {"ComplexFloatStorage", 8}, {"ComplexDoubleStorage", 16}};
  for (const auto& [name, size] : kSizes) {
    if (name == storage) return size;
  }
  return 0;
}

// Step 3: torch's and the archive's own modules.
bool AllowedModule(std::string_view module) {
  return module == "__torch__" || module.substr(0, 10) == "__torch__." || module == "torch" ||
         module == "torch._utils" || module == "torch.jit._pickle" || module == "collections";
}

bool IsName(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

class PickleScanner {
 public:
  explicit PickleScanner(std::string_view pickle) : in_(pickle) {}

  std::vector<StorageClaim> Run() {
    while (true) {
      const uint8_t op = static_cast<uint8_t>(Take(1, "an opcode")[0]);
      if (op == '.') break;  // STOP
      if (!Literal(op) && !Memo(op) && !Container(op) && !Call(op)) {
        Refuse("opcode 0x" + Hex(op) + ", which torch's pickler does not write");
      }
    }
    if (at_ != in_.size() || stack_.size() != 1 || !marks_.empty()) {
      Refuse("STOP with more to read, or not one value left");
    }
    return std::move(claims_);
  }

 private:
  [[noreturn]] void Refuse(const std::string& why) const {
    throw UserError("checkpoint", "not an archive gradhub writes: data.pkl at byte " +
                                      std::to_string(at_) + ": " + why);
  }
  static std::string Hex(uint8_t byte) {
    constexpr char kDigits[] = "0123456789abcdef";
    return {kDigits[byte >> 4], kDigits[byte & 15]};
  }

  std::string_view Take(uint64_t n, const char* what) {
    if (n > in_.size() - at_) Refuse(std::string(what) + " past the end");
    const std::string_view taken = in_.substr(at_, n);
    at_ += n;
    return taken;
  }
  uint64_t TakeUint(size_t n) {
    const std::string_view bytes = Take(n, "an operand");
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
    return value;
  }
  std::string_view TakeLine() {
    const size_t end = in_.find('\n', at_);
    if (end == std::string_view::npos || end - at_ > 256) Refuse("a GLOBAL without its line");
    const std::string_view line = Take(end - at_, "a GLOBAL");
    ++at_;  // the newline
    return line;
  }

  // Step 1: nothing is taken from below the innermost MARK.
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  Value Pop() {
    if (stack_.size() <= Floor()) Refuse("an opcode takes from an empty stack or past a MARK");
    Value top = std::move(stack_.back());
    stack_.pop_back();
    return top;
  }
  void RequireTop() {
    if (stack_.size() <= Floor()) Refuse("an opcode changes what is not on the stack");
  }
  std::vector<Value> PopToMark() {
    if (marks_.empty()) Refuse("an opcode takes to a MARK that is not there");
    std::vector<Value> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                             stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  void PushTuple(std::vector<Value> items) {
    Value tuple;
    tuple.kind = Value::Kind::kTuple;
    tuple.items = std::make_shared<const std::vector<Value>>(std::move(items));
    stack_.push_back(std::move(tuple));
  }
  void PushInt(int64_t integer) {
    stack_.push_back(Value{Value::Kind::kInt, integer, {}, {}, nullptr});
  }

  // Literals: PROTO, GLOBAL, None, booleans, numbers, strings.
  bool Literal(uint8_t op) {
    switch (op) {
      case 0x80:  // PROTO
        if (TakeUint(1) != 2) Refuse("a protocol other than 2");
        return true;
      case 'c': {  // GLOBAL
        const std::string_view module = TakeLine(), name = TakeLine();
        if (!AllowedModule(module) || !IsName(name)) Refuse("a GLOBAL of another module");
        stack_.push_back(Value{Value::Kind::kGlobal, 0, module, name, nullptr});
        return true;
      }
      case 'N':
      case 0x88:
      case 0x89:  // NONE, NEWTRUE, NEWFALSE
        stack_.emplace_back();
        return true;
      case 'G':  // BINFLOAT
        Take(8, "a float");
        stack_.emplace_back();
        return true;
      case 'K':
        PushInt(static_cast<int64_t>(TakeUint(1)));
        return true;  // BININT1
      case 'M':
        PushInt(static_cast<int64_t>(TakeUint(2)));
        return true;  // BININT2
      case 'J':
        PushInt(static_cast<int32_t>(TakeUint(4)));
        return true;  // BININT
      case 0x8a: {    // LONG1
        const size_t n = TakeUint(1);
        if (n > 8) Refuse("an integer of more than 8 bytes");
        const uint64_t raw = n == 0 ? 0 : TakeUint(n);
        const int shift = static_cast<int>(64 - 8 * n);
        PushInt(n == 0 ? 0 : static_cast<int64_t>(raw << shift) >> shift);
        return true;
      }
      case 'X':  // BINUNICODE
        stack_.push_back(Value{Value::Kind::kStr, 0, Take(TakeUint(4), "a string"), {}, nullptr});
        return true;
      default:
        return false;
    }
  }

  // Step 2: BINPUT, LONG_BINPUT, BINGET, LONG_BINGET.
  bool Memo(uint8_t op) {
    if (op != 'q' && op != 'r' && op != 'h' && op != 'j') return false;
    const uint64_t index = TakeUint(op == 'q' || op == 'h' ? 1 : 4);
    if (op == 'q' || op == 'r') {
      RequireTop();
      if (index > memo_.size()) Refuse("a memo index out of order");
      if (index == memo_.size()) memo_.emplace_back();
      memo_[index] = stack_.back();
    } else {
      if (index >= memo_.size()) Refuse("a memo index never given");
      stack_.push_back(memo_[index]);
    }
    return true;
  }

  // Tuples, lists and dicts.
  bool Container(uint8_t op) {
    switch (op) {
      case '(':
        marks_.push_back(stack_.size());
        return true;  // MARK
      case ')':
        PushTuple({});
        return true;  // EMPTY_TUPLE
      case 't':
        PushTuple(PopToMark());
        return true;  // TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
        std::vector<Value> items(op - 0x84);
        for (size_t i = items.size(); i > 0; --i) items[i - 1] = Pop();
        PushTuple(std::move(items));
        return true;
      }
      case ']':
      case '}':
        stack_.emplace_back();
        return true;  // EMPTY_LIST, EMPTY_DICT
      case 'a':
        Pop();
        RequireTop();
        return true;  // APPEND
      case 's':
        Pop();
        Pop();
        RequireTop();
        return true;  // SETITEM
      case 'e':
      case 'u':  // APPENDS, SETITEMS
        if (PopToMark().size() % (op == 'u' ? 2 : 1) != 0) Refuse("SETITEMS of an odd count");
        RequireTop();
        return true;
      default:
        return false;
    }
  }

  // REDUCE, NEWOBJ, BUILD and BINPERSID.
  bool Call(uint8_t op) {
    switch (op) {
      case 'R':
      case 0x81: {
        const Value args = Pop(), callable = Pop();
        if (args.kind != Value::Kind::kTuple || callable.kind != Value::Kind::kGlobal) {
          Refuse("a call of something but a GLOBAL with a tuple");
        }
        stack_.emplace_back();
        return true;
      }
      case 'b':
        Pop();
        RequireTop();
        return true;  // BUILD
      case 'Q':
        Claim(Pop());
        stack_.emplace_back();
        return true;  // BINPERSID
      default:
        return false;
    }
  }

  // Step 4.
  void Claim(const Value& id) {
    const std::vector<Value>* parts = id.kind == Value::Kind::kTuple ? id.items.get() : nullptr;
    auto is = [&](size_t i, Value::Kind kind) { return (*parts)[i].kind == kind; };
    if (parts == nullptr || parts->size() != 5 || !is(0, Value::Kind::kStr) ||
        (*parts)[0].text != "storage" || !is(1, Value::Kind::kGlobal) ||
        (*parts)[1].text != "torch" || !is(2, Value::Kind::kStr) || !is(3, Value::Kind::kStr) ||
        !is(4, Value::Kind::kInt)) {
      Refuse("a persistent id other than ('storage', torch.<T>Storage, key, location, numel)");
    }
    const int64_t item_size = ItemSize((*parts)[1].name);
    const int64_t numel = (*parts)[4].integer;
    if (item_size == 0 || numel < 0 || numel > std::numeric_limits<int64_t>::max() / item_size) {
      Refuse("a storage of an unknown type or size");
    }
    claims_.push_back({std::string((*parts)[2].text), static_cast<uint64_t>(numel * item_size)});
  }

  std::string_view in_;
  size_t at_ = 0;
  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::vector<Value> memo_;
  std::vector<StorageClaim> claims_;
};

}  // namespace

std::vector<StorageClaim> ScanDataPickle(std::string_view pickle) {
  return PickleScanner(pickle).Run();
}

}  // namespace gradhub::trainer
