// libFuzzer target: PyTorch DCP's .metadata (a pickle) read by checkpoint::dcp::parse_metadata, the
// restricted unpickler and the typed mapping behind read_metadata. The input is the file's bytes.
// Seeds: the .metadata files scripts/write_dcp_checkpoints.py wrote with PyTorch (one process, 4 ranks,
// protocols 2/3/5, damaged copies), copied by scripts/fuzz_seeds.py (./dev fuzz runs it).

#include <cstdint>
#include <string_view>

#include "dtensor/dcp.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader is linear in its input, but under ASan a megabyte of memo references (10^5 chunks, ~1 s
  // each) is slow enough that a larger input, on a loaded machine, would pass libFuzzer's -timeout
  // (./dev fuzz gives every target -max_len=4000000); the seeds are at most 400 kB.
  if (size > (size_t{1} << 20)) return 0;
  static const std::string source = "fuzz-input/.metadata";
  try {
    const auto md = dtensor::checkpoint::dcp::parse_metadata(std::string_view(reinterpret_cast<const char*>(data), size), source);
    (void)md;
  } catch (const dtensor::DTensorError& e) {
    dtensor::fuzz::check_error_text(e, source);
  }
  return 0;
}
