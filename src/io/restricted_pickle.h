#pragma once
// Python pickles from untrusted files (PyTorch DCP's .metadata), read without executing anything.
//
// unpickle_restricted runs the subset of pickle protocols 2-5 that `pickle.dump` of a DCP Metadata
// emits (the opcode table in restricted_pickle.cpp) and builds a tree of plain values: None, bools,
// integers, floats, strings, tuples, lists, dicts, the allowed globals, and objects of allowed classes, which
// record what the pickle asked for (the class, its arguments, the state BUILD gave it) without calling
// anything. Only the globals in kAllowedGlobals are accepted, each only in the role the table gives
// it (a value such as torch.float32, a class made by NEWOBJ without arguments and given its state by
// BUILD, or a callable REDUCE applies). Every other global, any other opcode, a REDUCE or NEWOBJ of
// something else, memo indexes out of range, a stack underflow, lengths past the end, nesting deeper
// than kMaxPickleDepth, more values than kMaxPickleValues and bytes after STOP are refused with a
// DTensorError "<source>: byte <offset>: <what was found>".
//
// The same machine reads a torch.save'd tensor's data.pkl (the items of a DCP checkpoint's .distcp files)
// with another table, torch_tensor_pickle(): its globals (torch._utils._rebuild_tensor_v2/_v3, the storage
// classes, collections.OrderedDict, the dtypes) and BINPERSID, whose persistent id (the storage's tuple)
// becomes a PersistentId value; nothing is loaded from it here.
//
// The tree may share values (the memo lets a pickle refer to one value twice) and may even hold a
// cycle (a list appended to itself): whoever reads it walks it by a schema, never recursively without
// a bound. This layer knows nothing of LibTorch: dtypes stay names ("torch.float32").

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor::io {

inline constexpr int kMaxPickleDepth = 64;                   // open MARKs, and containers in containers
inline constexpr int64_t kMaxPickleValues = int64_t{1} << 25;  // values made (each a few dozen bytes)

enum class PickleKind : uint8_t { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Object, PersistentId };

using PickleRef = uint32_t;

// How an allowed global may be used.
enum class PickleGlobalRole : uint8_t {
  Value,     // the global itself is the value (torch.float32)
  Class,     // NEWOBJ with an empty argument tuple, then at most one BUILD (a dataclass)
  Callable,  // REDUCE applies it to an argument tuple (torch.Size, an Enum)
};

struct PickleGlobal {
  const char* module;
  const char* name;
  PickleGlobalRole role;
};

// Every global a DCP .metadata of PyTorch 2.15 holds (found with pickletools.dis on files dcp.save
// wrote; scripts/write_dcp_checkpoints.py writes such files for the tests).
const std::vector<PickleGlobal>& allowed_pickle_globals();

// What one kind of pickle may hold: its globals, whether BINPERSID is allowed, and what it is ("a DCP
// checkpoint's metadata"), for the errors refusing anything else.
struct PickleRules {
  const std::vector<PickleGlobal>* globals;
  bool persistent_ids = false;
  const char* what;
};
// A DCP .metadata: allowed_pickle_globals(), no persistent ids.
const PickleRules& dcp_metadata_pickle();
// The data.pkl of a torch.save'd tensor (PyTorch 2.15, pickletools.dis of what torch.save writes for
// each dtype): _rebuild_tensor_v2 on a typed storage (torch.FloatStorage...), _rebuild_tensor_v3 on
// torch.storage.UntypedStorage and a dtype (uint16, float8...), collections.OrderedDict (the backward
// hooks, empty), the storage by BINPERSID.
const PickleRules& torch_tensor_pickle();
// The data.pkl of a torch.save'd Python value (a DCP bytes entry: an optimizer's learning rate, its
// parameter names): builtins only, no globals, no persistent ids (a tensor inside is refused).
const PickleRules& python_value_pickle();

struct PickleValue {
  PickleKind kind = PickleKind::None;
  int64_t offset = 0;   // of the opcode that made it
  int64_t integer = 0;  // Int; Bool (0 or 1); Global: its PickleGlobalRole
  double real = 0;      // Float
  std::string text;     // String; Global and Object: the global's "module.name"
  // Tuple and List: the elements; PersistentId: the persistent id (one value); Dict: keys and values alternating, in insertion order (duplicate
  // keys are kept, for the reader to refuse); Object: the arguments NEWOBJ or REDUCE gave.
  std::vector<PickleRef> items;
  std::optional<PickleRef> state;  // Object made by NEWOBJ: what BUILD gave it
  bool reduced = false;            // Object: made by REDUCE (a callable applied), not NEWOBJ
  int depth = 1;                   // containers below it, when it was last changed
};

class PickleTree {
 public:
  PickleTree(std::string source, std::vector<PickleValue> values, PickleRef root)
      : source_(std::move(source)), values_(std::move(values)), root_(root) {}
  const std::string& source() const { return source_; }
  PickleRef root() const { return root_; }
  const PickleValue& at(PickleRef ref) const { return values_[ref]; }
  size_t size() const { return values_.size(); }

  // What a value is, for "expected X, found Y": its kind and a short excerpt, never a whole container
  // ("a string 'w'", "an integer 7", "a tuple of 2", "a torch.Size object").
  std::string describe(PickleRef ref) const;
  static std::string describe(PickleRef ref, const std::vector<PickleValue>& values);

 private:
  std::string source_;
  std::vector<PickleValue> values_;
  PickleRef root_;
};

// Runs the pickle `bytes`, read from `source` (a file name, named in every error).
PickleTree unpickle_restricted(std::string_view bytes, const std::string& source,
                               const PickleRules& rules = dcp_metadata_pickle());

}  // namespace dtensor::io
