#include "pickle_writer.h"

#include "dtensor/errors.h"

namespace dtensor::io {
namespace {

void little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

PickleWriter::PickleWriter() : bytes_("\x80\x02", 2) {}

PickleWriter& PickleWriter::none() {
  bytes_ += 'N';
  return *this;
}

PickleWriter& PickleWriter::boolean(bool value) {
  bytes_ += value ? '\x88' : '\x89';  // NEWTRUE, NEWFALSE
  return *this;
}

PickleWriter& PickleWriter::integer(int64_t value) {
  if (value >= INT32_MIN && value <= INT32_MAX) {
    bytes_ += 'J';  // BININT: 4 bytes, signed
    little_endian(bytes_, static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
    return *this;
  }
  bytes_ += '\x8a';  // LONG1: length, then two's complement little-endian
  bytes_ += '\x08';
  little_endian(bytes_, static_cast<uint64_t>(value), 8);
  return *this;
}

PickleWriter& PickleWriter::string(std::string_view utf8) {
  if (utf8.size() > UINT32_MAX) throw DTensorError("PickleWriter: a string of " + std::to_string(utf8.size()) + " bytes is too long");
  bytes_ += 'X';  // BINUNICODE: 4-byte length, UTF-8
  little_endian(bytes_, utf8.size(), 4);
  bytes_ += utf8;
  return *this;
}

PickleWriter& PickleWriter::global(std::string_view module, std::string_view name) {
  bytes_ += 'c';  // GLOBAL: "module\nname\n"
  bytes_ += module;
  bytes_ += '\n';
  bytes_ += name;
  bytes_ += '\n';
  return *this;
}

PickleWriter& PickleWriter::mark() {
  bytes_ += '(';
  return *this;
}

PickleWriter& PickleWriter::empty_tuple() {
  bytes_ += ')';
  return *this;
}

PickleWriter& PickleWriter::tuple_from_mark() {
  bytes_ += 't';
  return *this;
}

PickleWriter& PickleWriter::empty_list() {
  bytes_ += ']';
  return *this;
}

PickleWriter& PickleWriter::appends() {
  bytes_ += 'e';
  return *this;
}

PickleWriter& PickleWriter::empty_dict() {
  bytes_ += '}';
  return *this;
}

PickleWriter& PickleWriter::setitems() {
  bytes_ += 'u';
  return *this;
}

PickleWriter& PickleWriter::newobj() {
  bytes_ += '\x81';
  return *this;
}

PickleWriter& PickleWriter::reduce() {
  bytes_ += 'R';
  return *this;
}

PickleWriter& PickleWriter::build() {
  bytes_ += 'b';
  return *this;
}

std::string PickleWriter::finish() { return bytes_ + '.'; }

}  // namespace dtensor::io
