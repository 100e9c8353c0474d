// libFuzzer target: a checkpoint directory read by checkpoint::contents, then loaded with
// checkpoint::load into plain tensors of the shapes and dtypes it lists.
//
// An input is the directory's files joined by kSeparator: first the Hugging Face / dtensor index
// (model.safetensors.index.json; none when empty), then the safetensors files, named
// model-0000K-of-0000N.safetensors in order. The directory always holds dtensor's commit marker, so
// that dtensor's own metadata is read rather than refused. Seeds: scripts/fuzz_seeds.py
// packs the suite's checkpoints this way (./dev fuzz runs it).

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "dtensor/checkpoint.h"
#include "dtensor/layout.h"
#include "fuzz_common.h"

namespace {

using namespace dtensor;
namespace fs = std::filesystem;

constexpr std::string_view kSeparator = "\n--dtensor-fuzz-next-file--\n";  // as in scripts/fuzz_seeds.py

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Lays the input out as a directory (replacing the previous execution's).
void unpack(std::string_view input, const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_file(dir / "dtensor.commit", "{\"version\": 1}\n");
  std::vector<std::string_view> parts;
  for (size_t at = 0;;) {
    const size_t next = input.find(kSeparator, at);
    parts.push_back(input.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) break;
    at = next + kSeparator.size();
  }
  if (!parts[0].empty()) write_file(dir / "model.safetensors.index.json", parts[0]);
  const size_t files = parts.size() - 1;
  for (size_t k = 1; k <= files; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, files);
    write_file(dir / name, parts[k]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path dir = fuzz::scratch_path("checkpoint");
  unpack(std::string_view(reinterpret_cast<const char*>(data), size), dir);
  try {
    checkpoint::State state;
    constexpr int64_t kMaxElements = int64_t{1} << 22;
    for (const auto& [name, info] : checkpoint::contents(dir.string())) {
      if (dtensor::numel(info.shape) > kMaxElements) return 0;  // valid but too large to be worth loading here
      state[name] = at::empty(info.shape, at::TensorOptions().dtype(info.dtype));
    }
    checkpoint::load(state, dir.string(), {.strict = false});
  } catch (const DTensorError& e) {
    fuzz::check_error_text(e, dir.string());
  }
  return 0;
}
