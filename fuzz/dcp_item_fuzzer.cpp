// libFuzzer target: one item of a PyTorch DCP checkpoint (a torch.save'd zip, as FileSystemWriter writes
// each chunk or bytes entry into a .distcp file), read both ways: by checkpoint::dcp::read_tensor_item
// (the zip reader confined to the item's byte range, the restricted unpickler with the torch.save table
// on its data.pkl, and the checks of the storage and the tensor against the metadata's chunk) and by
// read_object_item (the unpickler with builtins only, its value walked into a c10::IValue). The input
// is the item's bytes, written to a scratch file and read whole, as the chunk [2, 3] of float32 that the
// tensor seeds hold. Seeds: scripts/write_dcp_checkpoints.py's dcp_bad_items/*.item (good, transposed and
// _rebuild_tensor_v3 items, and damaged ones), dcp_single's items and dcp_objects' bytes entries, copied
// by scripts/fuzz_seeds.py (./dev fuzz runs it).

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "dtensor/dcp.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (size_t{1} << 20)) return 0;
  static const std::string path = dtensor::fuzz::scratch_path("item.distcp");
  static const std::filesystem::path file(path);
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return 0;
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  namespace dcp = dtensor::checkpoint::dcp;
  const dcp::DcpStorage storage{file.filename().string(), 0, static_cast<int64_t>(size), {}};
  try {
    const at::Tensor t = dcp::read_tensor_item(file.parent_path().string(), storage, "w", dcp::DcpChunk{{0, 0}, {2, 3}}, at::kFloat);
    (void)t;
  } catch (const dtensor::DTensorError& e) {
    dtensor::fuzz::check_error_text(e, path);
  }
  try {
    const c10::IValue value = dcp::read_object_item(file.parent_path().string(), storage, "w");
    (void)value;
  } catch (const dtensor::DTensorError& e) {
    dtensor::fuzz::check_error_text(e, path);
  }
  return 0;
}
