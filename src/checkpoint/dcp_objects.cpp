// A DCP checkpoint's bytes entries read as the Python values they hold (dcp.h: read_objects).

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>

#include <unordered_map>

#include "dcp_item.h"
#include "dcp_pickle_field.h"
#include "dtensor/dcp.h"

namespace dtensor::checkpoint::dcp {
namespace {

using detail::Field;
using detail::name_text;
using io::PickleKind;
using io::PickleRef;

// Values visited in one entry (each value is made once, later references sharing it, so this bounds
// the work; the depth bound stops a value holding itself).
constexpr int64_t kMaxValuesVisited = int64_t{1} << 20;

// Each pickle value becomes one IValue, made once: a value the memo refers to again (a 512 KiB string
// referred to 10^5 times) is shared, as in Python, not copied. So the result may share parts: a tuple of
// the same tuple twice, 60 levels deep, is 60 values whose naive walk is 2^60 (Python's is the same);
// read_objects' header says so.
class ValueReader {
 public:
  c10::IValue read(const Field& f, int depth = 0) {
    if (++visited_ > kMaxValuesVisited) f.fail("more than 2^20 values (a value shared many times over)");
    if (depth > io::kMaxPickleDepth) f.fail("values nested deeper than " + std::to_string(io::kMaxPickleDepth) + " (or holding themselves)");
    const PickleRef ref = f.ref();
    if (const auto made = made_.find(ref); made != made_.end()) return made->second;
    c10::IValue value = make(f, depth);
    made_.emplace(ref, value);
    return value;
  }

 private:
  c10::IValue make(const Field& f, int depth) {
    switch (f.kind()) {
      case PickleKind::None: return c10::IValue();
      case PickleKind::Bool: return f.as_bool();
      case PickleKind::Int: return f.value().integer;
      case PickleKind::Float: return f.value().real;
      case PickleKind::String: return f.value().text;
      case PickleKind::Tuple: {
        std::vector<c10::IValue> elements;
        for (const Field& e : f.elements()) elements.push_back(read(e, depth + 1));
        return c10::ivalue::Tuple::create(std::move(elements));
      }
      case PickleKind::List: {
        c10::impl::GenericList list(c10::AnyType::get());
        for (const Field& e : f.list()) list.push_back(read(e, depth + 1));
        return list;
      }
      case PickleKind::Dict: {
        c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
        for (const auto& [key, value] : f.items()) {
          const PickleKind k = key.kind();
          if (k != PickleKind::String && k != PickleKind::Int && k != PickleKind::Bool && k != PickleKind::Float)
            key.expected("a dict key that is a string or a number");
          if (!dict.insert(read(key, depth + 1), read(value, depth + 1)).second) key.fail("a key that appears twice");
        }
        return dict;
      }
      default:
        f.expected("None, a bool, a number, a string, or a list, tuple or dict of them");
    }
  }

  int64_t visited_ = 0;
  std::unordered_map<PickleRef, c10::IValue> made_;
};

}  // namespace

c10::IValue read_object_item(const std::string& dir, const DcpStorage& storage, const std::string& fqn) {
  const detail::SavedItem item = detail::open_saved_item(dir, storage, "bytes entry " + name_text(fqn), io::python_value_pickle());
  return ValueReader().read(Field(item.tree, item.tree.root(), "value"));
}

std::map<std::string, c10::IValue> read_objects(const std::string& dir, const std::string& prefix) {
  const DcpMetadata md = read_metadata(dir);
  std::map<std::string, c10::IValue> out;
  for (const auto& [index, storage] : md.storage)
    if (index.fqn.compare(0, prefix.size(), prefix) == 0 && std::holds_alternative<DcpBytes>(md.entries.at(index.fqn)))
      out.emplace(index.fqn, read_object_item(dir, storage, index.fqn));
  return out;
}

}  // namespace dtensor::checkpoint::dcp
