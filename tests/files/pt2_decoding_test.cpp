// The .pt2 records' decoder (src/graph/pt2_decoding.h, generated from torch's export schema) against
// torch's own generated from_json as the oracle: on every record of the suite's archives, PyTorch's
// and the Hugging Face models' exports included, both decode the same values.

#include "../../src/graph/pt2_decoding.h"

#include <gmock/gmock.h>

#include "../../src/io/zip_archive.h"
#include "file_helpers.h"

namespace dtensor::testing {
namespace {

namespace ex = torch::_export;

template <class T>
void expect_decoded_as_torch_does(const io::ZipArchive& archive, const std::string& name) {
  const io::ZipEntry* entry = archive.find(name);
  if (!entry) return;  // an archive without constants
  SCOPED_TRACE(archive.path() + ": " + name);
  const std::string text = archive.read_text(*entry, int64_t{1} << 30);
  T ours;
  graph::detail::decode_record(text, name, ours);
  const T torchs = nlohmann::json::parse(text).get<T>();
  EXPECT_EQ(nlohmann::json(ours), nlohmann::json(torchs));
}

TEST(Pt2Decoding, DecodesEverySuiteRecordAsTorchsGeneratedTypesDo) {
  std::vector<std::string> archives = {"mlp.pt2", "mlp_extras.pt2", "gpt_aten_dynamic.pt2", "gpt_joint.pt2", "gpt_train_ir_static.pt2"};
  for (const std::string hf : {"llama", "mistral", "qwen2", "mixtral", "gpt2"}) archives.push_back("hf/" + hf + "_joint.pt2");
  for (const std::string& name : archives) {
    const io::ZipArchive archive(graph_model(name));
    expect_decoded_as_torch_does<ex::ExportedProgram>(archive, "models/model.json");
    expect_decoded_as_torch_does<ex::PayloadConfig>(archive, "data/weights/model_weights_config.json");
    expect_decoded_as_torch_does<ex::PayloadConfig>(archive, "data/constants/model_constants_config.json");
  }
}

// Where torch's from_json is lenient and the decoder is not: each refusal names its place.
TEST(Pt2Decoding, RefusesWhatTorchsFromJsonWouldReadWrongly) {
  auto error = [](const std::string& text) { return error_of([&] { ex::PayloadConfig c; graph::detail::decode_record(text, "cfg", c); }); };
  const std::string rest = R"("is_param": true, "tensor_meta": null)";
  const std::string entry = R"({"path_name": "a", "use_pickle": false, )" + rest + "}";
  EXPECT_THAT(error(R"({"config": {"w": {"path_name": "a", "use_pickle": false, )" + rest + R"(, "path_name": "b"}}})"),
              ::testing::HasSubstr("cfg: field 'config.w': an object holds the key 'path_name' twice"));
  EXPECT_THAT(error(R"({"config": {"w": {"use_pickle": false, )" + rest + "}}}"),
              ::testing::HasSubstr("cfg: field 'config.w.path_name': the member is missing"));
  EXPECT_THAT(error(R"({"config": {"w": {"path_name": "a", "use_pickle": 1, )" + rest + "}}}"),
              ::testing::HasSubstr("field 'config.w.use_pickle': does not fit torch's export schema (expected true or false): found an integer 1"));
  EXPECT_THAT(error(R"({"config": {"w": )" + entry + R"(, "w": )" + entry + "}}"),
              ::testing::HasSubstr("cfg: field 'config': an object holds the key 'w' twice"));
  EXPECT_THAT(error(R"({"config": {}} [])"), ::testing::HasSubstr("text after the JSON value"));
}

}  // namespace
}  // namespace dtensor::testing
