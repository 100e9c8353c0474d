#pragma once
// What the generated decoders (pt2_schema_decoder.cpp) are made of: the schema's primitive types,
// its containers, and the readers of a struct's members and a union's member. Every decoder takes a
// Reader, a type of this namespace, so that the templates here find the generated decoders by
// argument-dependent lookup wherever they are instantiated.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "pt2_decoding.h"

namespace dtensor::graph::detail::decoding {

using io::JsonPull;

class Reader : public io::JsonPull {
 public:
  using JsonPull::JsonPull;
};

// The records' roots (the rest are declared in the generated file).
void decode(Reader& in, ex::ExportedProgram& out);
void decode(Reader& in, ex::PayloadConfig& out);

void decode(Reader& in, int64_t& out);
void decode(Reader& in, bool& out);
void decode(Reader& in, std::string& out);
void decode(Reader& in, ex::F64& out);
// std::vector<bool>'s elements are bits, which the template below cannot decode into.
void decode(Reader& in, std::vector<bool>& out);

// An enum's code, one of `values`; `type` names the enum in the error.
int64_t decode_enum_code(Reader& in, std::span<const int64_t> values, const char* type);

template <class T>
void decode(Reader& in, std::vector<T>& out) {
  in.begin_array();
  while (in.next_element()) decode(in, out.emplace_back());
}

template <class T>
void decode(Reader& in, std::optional<T>& out) {
  if (in.read_null()) return out.reset();
  decode(in, out.emplace());
}

[[noreturn]] void fail_repeated_key(size_t object_at, std::string_view key);

template <class T>
void decode(Reader& in, std::unordered_map<std::string, T>& out) {
  const size_t at = in.offset();
  in.begin_object();
  std::string_view key;
  while (in.next_member(key)) {
    const auto [entry, inserted] = out.try_emplace(std::string(key));
    if (!inserted) fail_repeated_key(at, key);
    decode(in, entry->second);
  }
}

template <class T>
void decode(Reader& in, ex::ForwardRef<T>& out) {
  T value;
  decode(in, value);
  out.emplace(std::move(value));
}

// The members of a struct, one by one: next() gives the index of the next member in `names`, and -1
// after the last, having refused an unknown member, one given twice, or a required one absent
// (`required`: a bit per name).
class StructMembers {
 public:
  StructMembers(Reader& in, std::span<const std::string_view> names, uint64_t required);
  int next();

 private:
  Reader& in_;
  std::span<const std::string_view> names_;
  uint64_t required_, seen_ = 0;
  size_t object_at_;
};

// The one member of a union: index() is its index in `names`. The constructor refuses a union that is
// not an object, or whose first member is none of `names`; finish(), after the member's value, one
// with a second member.
class UnionMember {
 public:
  UnionMember(Reader& in, std::span<const std::string_view> names);
  int index() const { return index_; }
  void finish();

 private:
  Reader& in_;
  size_t object_at_;
  int index_ = -1;
};

// Decodes the next value as the type of `out`'s member `name` (what its getter returns) and sets it.
#define DTENSOR_DECODE_MEMBER(in, out, name)                    \
  {                                                             \
    std::remove_cvref_t<decltype(out.get_##name())> value{};    \
    decode(in, value);                                          \
    out.set_##name(std::move(value));                           \
  }

}  // namespace dtensor::graph::detail::decoding
