#include "restricted_pickle.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "dtensor/errors.h"

namespace dtensor::io {
namespace {

// ---- the accepted subset ---------------------------------------------------------------------------
// What `pickle.dump(Metadata)` of PyTorch 2.15 emits at protocols 2 to 5 (pickletools.dis of files dcp.save
// wrote, and of the same Metadata dumped again at each protocol): protocol 2 and 3 write GLOBAL, BINPUT and
// BINUNICODE where 4 and 5 write STACK_GLOBAL, MEMOIZE and SHORT_BINUNICODE. Everything else a pickle can
// hold (other opcodes: INST, OBJ, PERSID, EXT*, text floats, bytes, sets...) is refused by name. BINFLOAT
// is a DCP bytes entry's (a learning rate torch.save'd).
enum Op : uint8_t {
  kMark = '(', kStop = '.', kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kNone = 'N', kReduce = 'R',
  kBinUnicode = 'X', kAppend = 'a', kBuild = 'b', kGlobal = 'c', kAppends = 'e', kBinGet = 'h', kLongBinGet = 'j',
  kBinPersId = 'Q', kBinPut = 'q', kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kSetItems = 'u', kEmptyDict = '}',
  kEmptyList = ']', kEmptyTuple = ')', kProto = 0x80, kNewObj = 0x81, kTuple1 = 0x85, kTuple2 = 0x86,
  kTuple3 = 0x87, kNewTrue = 0x88, kNewFalse = 0x89, kLong1 = 0x8a, kShortBinUnicode = 0x8c, kStackGlobal = 0x93,
  kMemoize = 0x94, kFrame = 0x95, kBinFloat = 'G',
};

// Every opcode of pickle protocols 0-5 by name, for errors about the ones refused.
const char* op_name(uint8_t op) {
  switch (op) {
    case '(': return "MARK"; case '.': return "STOP"; case '0': return "POP"; case '1': return "POP_MARK";
    case '2': return "DUP"; case 'F': return "FLOAT"; case 'I': return "INT"; case 'J': return "BININT";
    case 'K': return "BININT1"; case 'L': return "LONG"; case 'M': return "BININT2"; case 'N': return "NONE";
    case 'P': return "PERSID"; case 'Q': return "BINPERSID"; case 'R': return "REDUCE"; case 'S': return "STRING";
    case 'T': return "BINSTRING"; case 'U': return "SHORT_BINSTRING"; case 'V': return "UNICODE";
    case 'X': return "BINUNICODE"; case 'a': return "APPEND"; case 'b': return "BUILD"; case 'c': return "GLOBAL";
    case 'd': return "DICT"; case '}': return "EMPTY_DICT"; case 'e': return "APPENDS"; case 'g': return "GET";
    case 'h': return "BINGET"; case 'i': return "INST"; case 'j': return "LONG_BINGET"; case 'l': return "LIST";
    case ']': return "EMPTY_LIST"; case 'o': return "OBJ"; case 'p': return "PUT"; case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT"; case 's': return "SETITEM"; case 't': return "TUPLE"; case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS"; case 'G': return "BINFLOAT"; case 0x80: return "PROTO"; case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1"; case 0x83: return "EXT2"; case 0x84: return "EXT4"; case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2"; case 0x87: return "TUPLE3"; case 0x88: return "NEWTRUE"; case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1"; case 0x8b: return "LONG4"; case 'B': return "BINBYTES"; case 'C': return "SHORT_BINBYTES";
    case 0x8c: return "SHORT_BINUNICODE"; case 0x8d: return "BINUNICODE8"; case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET"; case 0x90: return "ADDITEMS"; case 0x91: return "FROZENSET"; case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL"; case 0x94: return "MEMOIZE"; case 0x95: return "FRAME"; case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER"; case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

const char* const kDtypeNames[] = {"float64", "float32", "float16", "bfloat16", "complex32", "complex64", "complex128", "int64",
                                   "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool", "float8_e4m3fn",
                                   "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"};

// The globals, each with the one role it may play. The metadata classes are dataclasses (NEWOBJ, then BUILD
// with their __dict__ or, for TensorProperties, its __getstate__ tuple); _MEM_FORMAT_ENCODING is an Enum
// (REDUCE of the class on its value); torch.Size is REDUCE'd on a tuple of ints; layouts are REDUCE'd
// through torch.serialization._get_layout on their name; dtypes are globals of the torch module;
// StorageMeta.checkpoint_id may be a pathlib path (REDUCE of the class on its parts; pathlib._local is its
// module from Python 3.13). Containers (dict, list, tuple) are opcodes, not globals.
std::vector<PickleGlobal> make_allowed_globals() {
  using R = PickleGlobalRole;
  constexpr const char* kMeta = "torch.distributed.checkpoint.metadata";
  std::vector<PickleGlobal> t = {
      {kMeta, "Metadata", R::Class},
      {kMeta, "TensorStorageMetadata", R::Class},
      {kMeta, "ChunkStorageMetadata", R::Class},
      {kMeta, "BytesStorageMetadata", R::Class},
      {kMeta, "MetadataIndex", R::Class},
      {kMeta, "TensorProperties", R::Class},
      {kMeta, "StorageMeta", R::Class},
      {kMeta, "_MEM_FORMAT_ENCODING", R::Callable},
      {"torch.distributed.checkpoint.filesystem", "_StorageInfo", R::Class},
      {"torch", "Size", R::Callable},
      {"torch.serialization", "_get_layout", R::Callable},
      {"pathlib", "PosixPath", R::Callable},
      {"pathlib", "PurePosixPath", R::Callable},
      {"pathlib._local", "PosixPath", R::Callable},
      {"pathlib._local", "PurePosixPath", R::Callable},
  };
  for (const char* dtype : kDtypeNames) t.push_back({"torch", dtype, R::Value});
  return t;
}

// A torch.save'd tensor's data.pkl: the rebuild functions, the storage classes (values inside the
// persistent id), OrderedDict for the backward hooks, and the dtypes (_rebuild_tensor_v3's argument).
std::vector<PickleGlobal> make_tensor_globals() {
  using R = PickleGlobalRole;
  std::vector<PickleGlobal> t = {
      {"torch._utils", "_rebuild_tensor_v2", R::Callable},
      {"torch._utils", "_rebuild_tensor_v3", R::Callable},
      {"collections", "OrderedDict", R::Callable},
      {"torch.storage", "UntypedStorage", R::Value},
  };
  for (const char* storage : {"DoubleStorage", "FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage", "IntStorage",
                              "ShortStorage", "CharStorage", "ByteStorage", "BoolStorage", "ComplexFloatStorage", "ComplexDoubleStorage"})
    t.push_back({"torch", storage, R::Value});
  for (const char* dtype : kDtypeNames) t.push_back({"torch", dtype, R::Value});
  return t;
}

const PickleGlobal* find_global(const PickleRules& rules, std::string_view module, std::string_view name) {
  for (const PickleGlobal& g : *rules.globals)
    if (module == g.module && name == g.name) return &g;
  return nullptr;
}

std::string excerpt(std::string_view text, size_t max = 80) {
  std::string out;
  for (char c : text.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\'') {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    }
  }
  return text.size() > max ? out + "..." : out;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    i += n;
  }
  return true;
}

class Machine {
 public:
  Machine(std::string_view bytes, const std::string& source, const PickleRules& rules) : in_(bytes), source_(source), rules_(rules) {}

  PickleTree run() {
    if (in_.size() < 2 || static_cast<uint8_t>(in_[0]) != kProto)
      fail(0, "not a pickle of protocol 2 to 5 (it does not start with PROTO)");
    for (;;) {
      op_at_ = pos_;
      const uint8_t op = byte();
      if (op == kStop) break;
      step(op);
    }
    if (!marks_.empty()) fail(op_at_, "STOP with " + std::to_string(marks_.size()) + " MARK(s) still open");
    if (stack_.size() != 1) fail(op_at_, "STOP with " + std::to_string(stack_.size()) + " values on the stack, not 1");
    if (pos_ != in_.size())
      fail(pos_, std::to_string(in_.size() - pos_) + " bytes after STOP: the file holds more than one pickle");
    return PickleTree(source_, std::move(values_), stack_.back());
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw DTensorError(source_ + ": byte " + std::to_string(at) + ": " + what);
  }
  std::string op_text(uint8_t op) const {
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", op);
    const char* name = op_name(op);
    return std::string("opcode ") + code + (name ? std::string(" (") + name + ")" : std::string(" (not a pickle opcode)"));
  }

  // ---- reading the opcode stream ----
  std::string_view take(size_t n, const char* what) {
    if (n > in_.size() - pos_)
      fail(op_at_, std::string(what) + " of " + std::to_string(n) + " bytes runs past the end of the file (" +
                       std::to_string(in_.size() - pos_) + " left): the file is truncated or corrupted");
    const std::string_view out = in_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint8_t byte() {
    if (pos_ >= in_.size()) fail(pos_, "the pickle ends without STOP: the file is truncated");
    return static_cast<uint8_t>(in_[pos_++]);
  }
  uint64_t unsigned_le(size_t n, const char* what) {
    const std::string_view b = take(n, what);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    return v;
  }
  // A line of GLOBAL (protocols 2 and 3): module or name, at most 256 bytes, ended by '\n'.
  std::string_view line(const char* what) {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 256)
      fail(op_at_, std::string("GLOBAL's ") + what + " is not a line of at most 256 bytes");
    const std::string_view out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

  // ---- values ----
  PickleRef make(PickleKind kind) {
    if (static_cast<int64_t>(values_.size()) >= kMaxPickleValues)
      fail(op_at_, "more than " + std::to_string(kMaxPickleValues) + " values: more than a checkpoint's metadata holds");
    PickleValue v;
    v.kind = kind;
    v.offset = static_cast<int64_t>(op_at_);
    values_.push_back(std::move(v));
    return static_cast<PickleRef>(values_.size() - 1);
  }
  void push(PickleRef ref) { stack_.push_back(ref); }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  PickleRef pop(const char* op) {
    if (stack_.size() <= floor())
      fail(op_at_, std::string(op) + " needs a value, and the stack" + (marks_.empty() ? " is empty" : " is empty above its MARK"));
    const PickleRef ref = stack_.back();
    stack_.pop_back();
    return ref;
  }
  PickleRef top(const char* op) {
    if (stack_.size() <= floor()) fail(op_at_, std::string(op) + " needs a value below it, and the stack has none");
    return stack_.back();
  }
  // The values above the innermost MARK, which is closed.
  std::vector<PickleRef> pop_mark(const char* op) {
    if (marks_.empty()) fail(op_at_, std::string(op) + " without a MARK");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleRef> out(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return out;
  }
  // Adds `child` to container `parent`, which gets deeper (refused past the limit).
  void adopt(PickleRef parent, PickleRef child) {
    const int depth = values_[child].depth + 1;
    if (depth > kMaxPickleDepth)
      fail(op_at_, "values nested deeper than " + std::to_string(kMaxPickleDepth) + " levels");
    values_[parent].items.push_back(child);
    values_[parent].depth = std::max(values_[parent].depth, depth);
  }
  // `items` must not be a part of values_, which make() can move.
  PickleRef container(PickleKind kind, const std::vector<PickleRef>& items) {
    const PickleRef ref = make(kind);
    for (PickleRef item : items) adopt(ref, item);
    return ref;
  }
  PickleRef expect(PickleRef ref, PickleKind kind, const std::string& what) {
    if (values_[ref].kind != kind) fail(op_at_, what + ", found " + describe(ref));
    return ref;
  }
  std::string describe(PickleRef ref) const { return PickleTree::describe(ref, values_); }

  void memo_put(uint64_t index) {
    const PickleRef ref = top("a memo put");
    if (index > memo_.size())
      fail(op_at_, "memo index " + std::to_string(index) + " leaves a gap (the memo holds " + std::to_string(memo_.size()) + ")");
    if (index == memo_.size()) {
      memo_.push_back(ref);
    } else {
      memo_[index] = ref;
    }
  }
  void memo_get(uint64_t index) {
    if (index >= memo_.size())
      fail(op_at_, "memo index " + std::to_string(index) + " is out of range (the memo holds " + std::to_string(memo_.size()) + ")");
    push(memo_[index]);
  }
  void global(std::string_view module, std::string_view name) {
    const PickleGlobal* g = find_global(rules_, module, name);
    if (!g)
      fail(op_at_, "global '" + excerpt(module) + "." + excerpt(name) + "' is not one " + rules_.what +
                       " holds: refused (nothing is executed)");
    // The text first: `module` and `name` may view strings of values_, which make() can move.
    std::string text = std::string(module) + "." + std::string(name);
    const PickleRef ref = make(PickleKind::Global);
    values_[ref].text = std::move(text);
    values_[ref].integer = static_cast<int64_t>(g->role);
    push(ref);
  }
  PickleGlobalRole role_of(PickleRef ref) const { return static_cast<PickleGlobalRole>(values_[ref].integer); }
  void string(size_t n) {
    const std::string_view text = take(n, "a string");
    if (!valid_utf8(text)) fail(op_at_, "a string that is not UTF-8: '" + excerpt(text) + "'");
    const PickleRef ref = make(PickleKind::String);
    values_[ref].text = std::string(text);
    push(ref);
  }
  void integer(int64_t v) {
    const PickleRef ref = make(PickleKind::Int);
    values_[ref].integer = v;
    push(ref);
  }
  // BINFLOAT: an IEEE double, big-endian.
  void binfloat() {
    const std::string_view b = take(8, "BINFLOAT's double");
    uint64_t bits = 0;
    for (size_t i = 0; i < 8; ++i) bits = bits << 8 | static_cast<uint8_t>(b[i]);
    const PickleRef ref = make(PickleKind::Float);
    std::memcpy(&values_[ref].real, &bits, sizeof bits);
    push(ref);
  }
  void boolean(bool v) {
    const PickleRef ref = make(PickleKind::Bool);
    values_[ref].integer = v;
    push(ref);
  }
  void long1() {
    const size_t n = byte();
    if (n > 8) fail(op_at_, "LONG1 of " + std::to_string(n) + " bytes: an integer past 64 bits");
    uint64_t v = unsigned_le(n, "LONG1's integer");
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    integer(static_cast<int64_t>(v));
  }
  // NEWOBJ: an allowed class with an empty argument tuple; REDUCE: an allowed callable on a tuple.
  void instantiate(bool reduce) {
    const char* op = reduce ? "REDUCE" : "NEWOBJ";
    const PickleRef args = expect(pop(op), PickleKind::Tuple, std::string(op) + " expects an argument tuple");
    const PickleRef callable = pop(op);
    if (values_[callable].kind != PickleKind::Global) fail(op_at_, std::string(op) + " of " + describe(callable) + ": refused");
    const PickleGlobalRole want = reduce ? PickleGlobalRole::Callable : PickleGlobalRole::Class;
    if (role_of(callable) != want)
      fail(op_at_, std::string(op) + " of " + values_[callable].text + ", which " + rules_.what + " does not " +
                       (reduce ? "call" : "instantiate") + ": refused");
    if (!reduce && !values_[args].items.empty())
      fail(op_at_, "NEWOBJ of " + values_[callable].text + " with " + std::to_string(values_[args].items.size()) +
                       " arguments (its pickles have none)");
    const std::vector<PickleRef> items = values_[args].items;  // a copy: make() can move values_
    const PickleRef obj = container(PickleKind::Object, items);
    values_[obj].text = values_[callable].text;
    values_[obj].reduced = reduce;
    push(obj);
  }
  void build() {
    const PickleRef state = pop("BUILD");
    const PickleRef obj = top("BUILD");
    if (values_[obj].kind != PickleKind::Object || values_[obj].reduced)
      fail(op_at_, "BUILD on " + describe(obj) + " (only objects NEWOBJ made take a state)");
    if (values_[obj].state) fail(op_at_, "a second BUILD on the " + values_[obj].text + " object");
    const int depth = values_[state].depth + 1;
    if (depth > kMaxPickleDepth) fail(op_at_, "values nested deeper than " + std::to_string(kMaxPickleDepth) + " levels");
    values_[obj].state = state;
    values_[obj].depth = std::max(values_[obj].depth, depth);
  }
  void set_items(PickleRef dict, const std::vector<PickleRef>& kv, const char* op) {
    expect(dict, PickleKind::Dict, std::string(op) + " expects a dict below its items");
    if (kv.size() % 2) fail(op_at_, std::string(op) + " with an odd number of values (" + std::to_string(kv.size()) + ")");
    for (PickleRef item : kv) adopt(dict, item);
  }

  void step(uint8_t op) {
    switch (op) {
      case kProto: {
        const uint8_t version = byte();
        if (op_at_ != 0 || version < 2 || version > 5)
          fail(op_at_, "PROTO " + std::to_string(version) + (op_at_ ? " after the start" : " (dtensor reads protocols 2 to 5)"));
        return;
      }
      case kFrame: {
        const uint64_t n = unsigned_le(8, "FRAME's length");
        if (n > in_.size() - pos_) fail(op_at_, "a FRAME of " + std::to_string(n) + " bytes runs past the end of the file");
        return;
      }
      case kMark:
        if (marks_.size() >= static_cast<size_t>(kMaxPickleDepth))
          fail(op_at_, "more than " + std::to_string(kMaxPickleDepth) + " MARKs open: nested too deeply");
        marks_.push_back(stack_.size());
        return;
      case kMemoize: return memo_put(memo_.size());
      case kBinPut: return memo_put(byte());
      case kLongBinPut: return memo_put(unsigned_le(4, "LONG_BINPUT's index"));
      case kBinGet: return memo_get(byte());
      case kLongBinGet: return memo_get(unsigned_le(4, "LONG_BINGET's index"));
      case kNone: return push(make(PickleKind::None));
      case kNewTrue: return boolean(true);
      case kNewFalse: return boolean(false);
      case kBinInt1: return integer(byte());
      case kBinInt2: return integer(static_cast<int64_t>(unsigned_le(2, "BININT2's integer")));
      case kBinInt: return integer(static_cast<int32_t>(static_cast<uint32_t>(unsigned_le(4, "BININT's integer"))));
      case kLong1: return long1();
      case kBinFloat: return binfloat();
      case kShortBinUnicode: return string(byte());
      case kBinUnicode: return string(unsigned_le(4, "BINUNICODE's length"));
      case kEmptyTuple: return push(make(PickleKind::Tuple));
      case kEmptyList: return push(make(PickleKind::List));
      case kEmptyDict: return push(make(PickleKind::Dict));
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        std::vector<PickleRef> items(op - kTuple1 + 1);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop(op_name(op));
        return push(container(PickleKind::Tuple, items));
      }
      case kTuple: return push(container(PickleKind::Tuple, pop_mark("TUPLE")));
      case kAppend: {
        const PickleRef item = pop("APPEND");
        return adopt(expect(top("APPEND"), PickleKind::List, "APPEND expects a list below its item"), item);
      }
      case kAppends: {
        const std::vector<PickleRef> items = pop_mark("APPENDS");
        const PickleRef list = expect(top("APPENDS"), PickleKind::List, "APPENDS expects a list below its MARK");
        for (PickleRef item : items) adopt(list, item);
        return;
      }
      case kSetItem: {
        const PickleRef value = pop("SETITEM");
        const PickleRef key = pop("SETITEM");
        return set_items(top("SETITEM"), {key, value}, "SETITEM");
      }
      case kSetItems: {
        const std::vector<PickleRef> kv = pop_mark("SETITEMS");
        return set_items(top("SETITEMS"), kv, "SETITEMS");
      }
      case kStackGlobal: {
        const PickleRef name = expect(pop("STACK_GLOBAL"), PickleKind::String, "STACK_GLOBAL expects a name string");
        const PickleRef module = expect(pop("STACK_GLOBAL"), PickleKind::String, "STACK_GLOBAL expects a module string");
        return global(values_[module].text, values_[name].text);
      }
      case kGlobal: {
        const std::string_view module = line("module");
        return global(module, line("name"));
      }
      case kNewObj: return instantiate(false);
      case kReduce: return instantiate(true);
      case kBuild: return build();
      case kBinPersId: {
        if (!rules_.persistent_ids) break;
        const PickleRef pid = pop("BINPERSID");
        return push(container(PickleKind::PersistentId, {pid}));
      }
      default: break;
    }
    fail(op_at_, op_text(op) + " is not one " + rules_.what + " uses: refused");
  }

  std::string_view in_;
  const std::string& source_;
  const PickleRules& rules_;
  size_t pos_ = 0;
  size_t op_at_ = 0;  // the opcode being run
  std::vector<PickleValue> values_;
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;  // stack sizes at each open MARK
  std::vector<PickleRef> memo_;
};

}  // namespace

const std::vector<PickleGlobal>& allowed_pickle_globals() {
  static const std::vector<PickleGlobal> table = make_allowed_globals();
  return table;
}

std::string PickleTree::describe(PickleRef ref) const { return describe(ref, values_); }

std::string PickleTree::describe(PickleRef ref, const std::vector<PickleValue>& values) {
  const PickleValue& v = values[ref];
  const std::string n = std::to_string(v.items.size());
  switch (v.kind) {
    case PickleKind::None: return "None";
    case PickleKind::Bool: return v.integer ? "True" : "False";
    case PickleKind::Int: return "an integer " + std::to_string(v.integer);
    case PickleKind::Float: {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", v.real);
      return std::string("a float ") + text;
    }
    case PickleKind::String: return "a string '" + excerpt(v.text) + "'";
    case PickleKind::Tuple: return "a tuple of " + n;
    case PickleKind::List: return "a list of " + n;
    case PickleKind::Dict: return "a dict of " + std::to_string(v.items.size() / 2);
    case PickleKind::Global: return "the global " + v.text;
    case PickleKind::Object: return "a " + v.text + " object";
    case PickleKind::PersistentId: return "a persistent id";
  }
  return "a value";
}

const PickleRules& dcp_metadata_pickle() {
  static const PickleRules rules{&allowed_pickle_globals(), false, "a DCP checkpoint's metadata"};
  return rules;
}

const PickleRules& torch_tensor_pickle() {
  static const std::vector<PickleGlobal> globals = make_tensor_globals();
  static const PickleRules rules{&globals, true, "a torch.save'd tensor"};
  return rules;
}

const PickleRules& python_value_pickle() {
  static const std::vector<PickleGlobal> none;
  static const PickleRules rules{&none, false, "a torch.save'd Python value"};
  return rules;
}

PickleTree unpickle_restricted(std::string_view bytes, const std::string& source, const PickleRules& rules) {
  return Machine(bytes, source, rules).run();
}

}  // namespace dtensor::io
