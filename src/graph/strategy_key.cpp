#include "strategy_key.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <bit>
#include <cstdint>

namespace dtensor::graph::detail {
namespace {

void append_int(std::string& key, int64_t v) {
  key += std::to_string(v);
  key += ',';
}

// Doubles by their bits: two calls differing in the last bit of a constant are different calls.
void append_double(std::string& key, double v) { append_int(key, static_cast<int64_t>(std::bit_cast<uint64_t>(v))); }

void append_ints(std::string& key, c10::IntArrayRef values) {
  key += '[';
  for (int64_t v : values) append_int(key, v);
  key += ']';
}

// A real (not Meta) tensor is spelled by its value only when it holds one real number (a wrapped
// number); any other real tensor leaves the node uncached rather than keyed by its shape alone.
bool append_tensor(std::string& key, const at::Tensor& t) {
  if (!t.is_meta() && (t.numel() != 1 || t.is_complex())) return false;
  key += 't';
  append_int(key, static_cast<int64_t>(t.scalar_type()));
  append_ints(key, t.sizes());
  append_ints(key, t.strides());
  if (!t.is_meta()) append_double(key, t.item().toDouble());
  return true;
}

bool append_value(std::string& key, const c10::IValue& v);

bool append_list(std::string& key, const c10::List<c10::IValue>& list) {
  key += '(';
  for (const c10::IValue& item : list)
    if (!append_value(key, item)) return false;
  key += ')';
  return true;
}

bool append_value(std::string& key, const c10::IValue& v) {
  if (v.isNone()) {
    key += 'N';
  } else if (v.isBool()) {
    key += v.toBool() ? 'T' : 'F';
  } else if (v.isInt()) {  // also dtypes, layouts and memory formats
    key += 'i';
    append_int(key, v.toInt());
  } else if (v.isDouble()) {
    key += 'd';
    append_double(key, v.toDouble());
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    key += 's';
    append_int(key, static_cast<int64_t>(s.size()));
    key += s;
  } else if (v.isDevice()) {
    key += 'D' + v.toDevice().str() + ',';
  } else if (v.isTensor()) {
    return append_tensor(key, v.toTensor());
  } else if (v.isList()) {  // int, double, bool, tensor and optional-tensor lists
    return append_list(key, v.toList());
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> strategy_key(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                        const std::vector<const Placements*>& input_placements,
                                        const std::vector<Placements>* possible_input_placements) {
  std::string key = op.operator_name().name + "." + op.operator_name().overload_name + "|";
  for (const c10::IValue& a : args)
    if (!append_value(key, a)) return std::nullopt;
  key += '|';
  for (const Placements* p : input_placements) key += to_string(*p) + ';';
  if (possible_input_placements) {
    key += '|';
    for (const Placements& p : *possible_input_placements) key += to_string(p) + ';';
  }
  return key;
}

}  // namespace dtensor::graph::detail
