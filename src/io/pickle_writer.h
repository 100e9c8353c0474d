#pragma once
// Writes Python pickles (protocol 2) opcode by opcode, for files Python reads: PyTorch DCP's .metadata
// (src/checkpoint/dcp_save.cpp). The caller builds values in pickle's postfix order, as pickle.dumps
// would: containers with mark() ... then the opcode that collects, objects as a class, its arguments
// and then newobj() / reduce(), and build() with the state. No memo: a value used twice is written twice.

#include <cstdint>
#include <string>
#include <string_view>

namespace dtensor::io {

class PickleWriter {
 public:
  PickleWriter();  // PROTO 2

  PickleWriter& none();
  PickleWriter& boolean(bool value);
  PickleWriter& integer(int64_t value);
  PickleWriter& string(std::string_view utf8);
  // A module-level name: "torch.distributed.checkpoint.metadata", "Metadata".
  PickleWriter& global(std::string_view module, std::string_view name);

  PickleWriter& mark();
  PickleWriter& empty_tuple();
  PickleWriter& tuple_from_mark();  // the values since the last mark, as a tuple
  PickleWriter& empty_list();
  PickleWriter& appends();          // appends the values since the last mark to the list before it
  PickleWriter& empty_dict();
  PickleWriter& setitems();         // sets the key, value pairs since the last mark into the dict before it
  PickleWriter& newobj();           // class, argument tuple -> cls.__new__(cls, *args)
  PickleWriter& reduce();           // callable, argument tuple -> callable(*args)
  PickleWriter& build();            // object, state -> the object with its __setstate__ or __dict__ set

  // The pickle, ended with STOP.
  std::string finish();

 private:
  std::string bytes_;
};

}  // namespace dtensor::io
