// libFuzzer target: a .pt2 archive, mutated as bytes (the zip structure, the records), loaded with
// graph::load_program and run on inputs made from its user inputs' metas. Seeds: the suite's exported
// archives (./dev fuzz copies them). pt2_graph_fuzzer mutates model.json alone.

#include <cstdint>
#include <fstream>

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = dtensor::fuzz::scratch_path("program.pt2");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  dtensor::fuzz::load_and_run(path);
  return 0;
}
