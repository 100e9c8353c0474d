// libFuzzer target, structure-aware: the input is one byte choosing a template archive (the suite's
// exported models, in the directory DTENSOR_FUZZ_TEMPLATES, sorted by name) and the text of its
// models/model.json. The target writes a well-formed archive of that template with this model.json
// (through LibTorch's writer), then loads and runs it as pt2_fuzzer does. Byte-level mutation of whole
// archives spends most mutations on weight bytes; this one spends them on the graph, the signature
// and the metas. Seeds: scripts/fuzz_seeds.py writes one per template.

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "fuzz_common.h"

namespace {

namespace fs = std::filesystem;
using Records = std::vector<std::pair<std::string, std::string>>;

// Every template's records but model.json and those LibTorch's writer adds itself, read once.
const std::vector<Records>& templates() {
  static const std::vector<Records> all = [] {
    const char* dir = std::getenv("DTENSOR_FUZZ_TEMPLATES");
    if (!dir) {
      std::fprintf(stderr, "pt2_graph_fuzzer: set DTENSOR_FUZZ_TEMPLATES to a directory of .pt2 archives (./dev fuzz does)\n");
      std::abort();
    }
    std::vector<fs::path> paths;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".pt2") paths.push_back(e.path());
    std::sort(paths.begin(), paths.end());
    std::vector<Records> out;
    for (const fs::path& p : paths) {
      caffe2::serialize::PyTorchStreamReader reader(p.string());
      Records records;
      for (const std::string& name : reader.getAllRecords()) {
        if (name == "models/model.json" || name == ".data/version" || name == "byteorder" || name == ".data/serialization_id" ||
            name == "version" || name.empty() || name.back() == '/')
          continue;
        auto [data, size] = reader.getRecord(name);
        records.emplace_back(name, std::string(static_cast<const char*>(data.get()), size));
      }
      out.push_back(std::move(records));
    }
    if (out.empty()) std::abort();
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string path = dtensor::fuzz::scratch_path("graph.pt2");
  const Records& records = templates()[data[0] % templates().size()];
  {
    caffe2::serialize::PyTorchStreamWriter writer(path);
    writer.setMinVersion(6);
    for (const auto& [name, content] : records) writer.writeRecord(name, content.data(), content.size());
    writer.writeRecord("models/model.json", data + 1, size - 1);
    writer.writeEndOfFile();
  }
  dtensor::fuzz::load_and_run(path);
  return 0;
}
