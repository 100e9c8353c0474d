// Checkpoints from outside are untrusted: damaged copies of the checkpoints PyTorch wrote at build time
// (safetensors' save_file, a Hugging Face index, DCP's sharded output) are refused by contents() and
// load() with a DTensorError naming the file and the field: never a crash, a raw library error, or a
// load that succeeds with wrong values.

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <filesystem>

#include "dtensor/checkpoint.h"
#include "file_helpers.h"

namespace dtensor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;
namespace ckpt = dtensor::checkpoint;
namespace fs = std::filesystem;

// A state to load `dir` into: plain tensors of its dtypes and shapes (taken from a good copy).
ckpt::State state_like(const std::string& good_dir) {
  ckpt::State state;
  for (const auto& [name, info] : ckpt::contents(good_dir)) state[name] = at::zeros(info.shape, at::TensorOptions().dtype(info.dtype));
  return state;
}

// Both readers refuse `dir`, naming `file` and saying `what`.
void expect_refused(const std::string& dir, const std::string& good_dir, const std::string& file, const std::string& what) {
  EXPECT_THAT(error_of([&] { ckpt::contents(dir); }), AllOf(HasSubstr(file), HasSubstr(what)));
  ckpt::State state = state_like(good_dir);
  EXPECT_THAT(error_of([&] { ckpt::load(state, dir); }), AllOf(HasSubstr(file), HasSubstr(what)));
}

// save_file's single file with its header (text) and data edited.
std::string save_file_edited(const std::string& name, const std::function<void(std::string& header, std::string& data)>& edit) {
  auto [header, data] = safetensors_parts(read_bytes(pytorch_checkpoint("save_file") + "/model.safetensors"));
  edit(header, data);
  return checkpoint_dir(name, {{"model.safetensors", safetensors_bytes(header, data)}});
}

// The same, editing the header as JSON (re-padded with spaces to 8 bytes, as writers do).
std::string save_file_with_header(const std::string& name, const std::function<void(json&)>& edit) {
  return save_file_edited(name, [&](std::string& header, std::string&) {
    json h = json::parse(header);
    edit(h);
    header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');
  });
}

const std::string kSaveFile = "model.safetensors";

TEST(SafetensorsHeader, TheSuiteCheckpointsLoad) {
  for (const std::string dir : {"save_file", "hf_index", "dcp_whole", "dcp_sharded"}) {
    SCOPED_TRACE(dir);
    ckpt::State state = state_like(pytorch_checkpoint(dir));
    EXPECT_EQ(state.size(), 5u);
    EXPECT_EQ(ckpt::load(state, pytorch_checkpoint(dir)).bytes_read, 1040);
  }
}

TEST(SafetensorsHeader, OffsetsThatWouldWrapAreRefused) {
  const std::string good = pytorch_checkpoint("save_file");
  const auto huge = save_file_with_header("wrap", [](json& h) { h["counter"]["data_offsets"] = {INT64_MAX - 8, INT64_MAX}; });
  expect_refused(huge, good, "field 'counter.data_offsets'", "lies beyond any file");
  const auto far = save_file_with_header("far", [](json& h) { h["counter"]["data_offsets"] = {INT64_MAX - 1000, INT64_MAX - 992}; });
  expect_refused(far, good, "tensor 'counter'", "the file is truncated");
}

TEST(SafetensorsHeader, HeaderLengthsAreChecked) {
  const std::string good = pytorch_checkpoint("save_file");
  const std::string original = read_bytes(good + "/" + kSaveFile);
  std::string all_ones = original;
  for (size_t i = 0; i < 8; ++i) all_ones[i] = '\xff';
  expect_refused(checkpoint_dir("all_ones", {{kSaveFile, all_ones}}), good, kSaveFile,
                 "the header claims 18446744073709551615 bytes, more than the format's limit");
  // One byte short of a header padded with spaces: the JSON still parses, and every tensor would be
  // read one byte early.
  const auto [header, data] = safetensors_parts(original);
  ASSERT_EQ(header.back(), ' ');
  expect_refused(checkpoint_dir("short", {{kSaveFile, safetensors_bytes(header.substr(0, header.size() - 1), " " + data)}}), good,
                 kSaveFile, "its header length is wrong or bytes were added");
  expect_refused(checkpoint_dir("tab", {{kSaveFile, safetensors_bytes(header + "\t", data)}}), good, kSaveFile,
                 "padded with spaces only");
  expect_refused(checkpoint_dir("cut", {{kSaveFile, original.substr(0, 8 + header.size() / 2)}}), good, kSaveFile,
                 "it is truncated or not a safetensors file");
}

TEST(SafetensorsHeader, TensorsTileTheDataExactly) {
  const std::string good = pytorch_checkpoint("save_file");
  // blocks.0.fc1.bias is [8, 48): point it at counter's bytes [0, 8) and its own.
  expect_refused(save_file_with_header("neighbour", [](json& h) { h["blocks.0.fc1.bias"]["data_offsets"] = {0, 40}; }), good, kSaveFile,
                 "their bytes overlap");
  expect_refused(save_file_edited("trailing", [](std::string&, std::string& data) { data += "1234"; }), good, kSaveFile,
                 "bytes were added");
  expect_refused(save_file_edited("truncated", [](std::string&, std::string& data) { data.resize(data.size() - 4); }), good,
                 "tensor 'blocks.0.fc1.weight'", "the file is truncated");
  // counter moved 8 bytes later: a gap before it.
  const auto gap = save_file_edited("gap", [](std::string& header, std::string& data) {
    json h = json::parse(header);
    for (auto& [name, t] : h.items())
      if (name != "__metadata__") t["data_offsets"] = {t["data_offsets"][0].get<int64_t>() + 8, t["data_offsets"][1].get<int64_t>() + 8};
    header = h.dump();
    data = std::string(8, '\0') + data;
  });
  expect_refused(gap, good, kSaveFile, "a gap lies between them");
}

TEST(SafetensorsHeader, FieldsAreCheckedOneByOne) {
  const std::string good = pytorch_checkpoint("save_file");
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::string field, what;
  };
  const std::vector<Case> cases = {
      {"fraction", [](json& h) { h["blocks.0.fc1.bias"]["data_offsets"] = {8.0, 48}; }, "field 'blocks.0.fc1.bias.data_offsets[0]'",
       "expected an integer, found a fractional number 8.0"},
      {"negative_dim", [](json& h) { h["blocks.0.fc1.bias"]["shape"] = {-10}; }, "field 'blocks.0.fc1.bias.shape[0]'", "found -10"},
      {"length", [](json& h) { h["blocks.0.fc1.bias"]["shape"] = {11}; }, "field 'blocks.0.fc1.bias.data_offsets'",
       "spans 40 bytes, but shape [11] of F32 needs 44"},
      {"dtype", [](json& h) { h["blocks.0.fc1.bias"]["dtype"] = "F31"; }, "field 'blocks.0.fc1.bias.dtype'", "'F31' is not a dtype"},
      {"missing", [](json& h) { h["blocks.0.fc1.bias"].erase("shape"); }, "field 'blocks.0.fc1.bias.shape'", "the member is missing"},
      {"one_offset", [](json& h) { h["blocks.0.fc1.bias"]["data_offsets"] = {8}; }, "field 'blocks.0.fc1.bias.data_offsets'",
       "expected [begin, end] with begin <= end"},
      {"metadata", [](json& h) { h["__metadata__"]["format"] = 1; }, "field '__metadata__.format'", "expected a string, found an integer 1"},
      {"wrapping_shape", [](json& h) { h["blocks.0.fc1.bias"]["shape"] = {int64_t{1} << 40, int64_t{1} << 24}; },
       "field 'blocks.0.fc1.bias.shape'", "holds more bytes than a file can"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_refused(save_file_with_header(c.name, c.edit), good, kSaveFile + ": header: " + c.field, c.what);
  }
}

TEST(SafetensorsHeader, DuplicateKeysAreRefused) {
  const auto dir = save_file_edited("duplicate", [](std::string& header, std::string&) {
    header.insert(1, R"("counter":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)");
  });
  expect_refused(dir, pytorch_checkpoint("save_file"), kSaveFile, "an object holds the key 'counter' twice");
}

// ---- DCP's sharding info and dtensor's metadata ----------------------------------------------------------------

const std::string kShard1 = "shard-00001-model-00001-of-00001.safetensors";
const std::string kShard2 = "shard-00002-model-00001-of-00001.safetensors";

// dcp_sharded with the __metadata__ of file `which` edited.
std::string dcp_sharded_with(const std::string& name, const std::string& which, const std::function<void(json& metadata)>& edit,
                             const std::vector<std::pair<std::string, std::string>>& more_files = {}) {
  const std::string dir = copy_dir(pytorch_checkpoint("dcp_sharded"), name, [&](const std::string& file, const std::string& bytes) {
    if (file != which) return bytes;
    auto [header, data] = safetensors_parts(bytes);
    json h = json::parse(header);
    edit(h["__metadata__"]);
    header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');
    return safetensors_bytes(header, data);
  });
  for (const auto& [file, bytes] : more_files) write_bytes(dir + "/" + file, bytes);
  return dir;
}

// Edits the JSON text DCP keeps under DCP_SHARDING_INFO.
std::function<void(json&)> sharding_info(const std::function<void(json&)>& edit) {
  return [edit](json& metadata) {
    json info = json::parse(metadata["DCP_SHARDING_INFO"].get<std::string>());
    edit(info);
    metadata["DCP_SHARDING_INFO"] = info.dump();
  };
}

TEST(DcpMetadata, PiecesMustTileTheirTensor) {
  const std::string good = pytorch_checkpoint("dcp_sharded");
  // File 1 holds tok_emb.weight rows [0, 7), file 2 rows [7, 13): moved to 6, they overlap.
  expect_refused(dcp_sharded_with("overlap", kShard2, sharding_info([](json& i) { i["tok_emb.weight"]["saved_offsets"] = {6, 0}; })),
                 good, "tensor 'tok_emb.weight'", "overlap: the checkpoint is corrupted");
  expect_refused(dcp_sharded_with("huge", kShard2, sharding_info([](json& i) {
                                    i["tok_emb.weight"]["saved_offsets"] = {INT64_MAX - 1, 0};
                                  })),
                 good, "tensor 'tok_emb.weight'", "lies beyond any tensor");
  expect_refused(dcp_sharded_with("rank", kShard2, sharding_info([](json& i) { i["tok_emb.weight"]["saved_offsets"] = {7}; })), good,
                 kShard2 + ": tensor 'tok_emb.weight' has saved_offsets [7] for its shape [6, 8]", "corrupted");
  fs::path missing = dcp_sharded_with("missing_file", kShard2, [](json&) {});
  fs::remove(missing / kShard1);
  EXPECT_THAT(error_of([&] { ckpt::contents(missing.string()); }),
              AllOf(HasSubstr("the saved pieces hold 5 of its 10 elements"), HasSubstr("a file of the checkpoint is missing")));
}

TEST(DcpMetadata, ShardingInfoIsValidated) {
  const std::string good = pytorch_checkpoint("dcp_sharded");
  const std::string info = kShard2 + ": __metadata__ DCP_SHARDING_INFO";
  expect_refused(dcp_sharded_with("array", kShard2, [](json& m) { m["DCP_SHARDING_INFO"] = "[1, 2]"; }), good, info,
                 "expected an object, found an array of 2 elements");
  expect_refused(dcp_sharded_with("not_json", kShard2, [](json& m) { m["DCP_SHARDING_INFO"] = "{{"; }), good, info, "invalid JSON");
  expect_refused(dcp_sharded_with("no_entry", kShard2, sharding_info([](json& i) { i.erase("counter"); })), good, info,
                 "tensor 'counter' has no saved_offsets");
  expect_refused(dcp_sharded_with("ghost", kShard2, sharding_info([](json& i) { i["ghost"] = {{"saved_offsets", {0}}}; })), good, kShard2,
                 "its __metadata__ describes tensor 'ghost', which the file does not hold");
  expect_refused(dcp_sharded_with("negative", kShard2, sharding_info([](json& i) { i["counter"]["saved_offsets"] = {-1}; })), good,
                 info + ": field 'counter.saved_offsets[0]'", "found -1");
}

TEST(DtensorMetadata, GlobalShapesAreValidatedAndAgree) {
  const std::string good = pytorch_checkpoint("dcp_sharded");
  const auto with_global_shapes = [](int64_t rows, int64_t version = 1) {
    return [rows, version](json& m) {
      m["dtensor"] = json{{"version", version}, {"global_shapes", {{"tok_emb.weight", {rows, 8}}}}}.dump();
    };
  };
  const std::vector<std::pair<std::string, std::string>> commit = {{"dtensor.commit", "{\"version\": 1}\n"}};
  const std::string both = dcp_sharded_with("agree", kShard1, with_global_shapes(13), commit);
  fs::copy_file(dcp_sharded_with("agree2", kShard2, with_global_shapes(13)) + "/" + kShard2, both + "/" + kShard2,
                fs::copy_options::overwrite_existing);
  EXPECT_EQ(ckpt::contents(both).at("tok_emb.weight").shape, (std::vector<int64_t>{13, 8}));
  const std::string conflict = dcp_sharded_with("conflict", kShard1, with_global_shapes(13), commit);
  fs::copy_file(dcp_sharded_with("conflict2", kShard2, with_global_shapes(14)) + "/" + kShard2, conflict + "/" + kShard2,
                fs::copy_options::overwrite_existing);
  expect_refused(conflict, good, "tensor 'tok_emb.weight' has global shape [13, 8] in", "but [14, 8] in");
  expect_refused(dcp_sharded_with("newer", kShard1, with_global_shapes(13, 2), commit), good, kShard1 + ": __metadata__ dtensor: field 'version'",
                 "format version 2 is not one this dtensor reads");
}

// ---- the Hugging Face index -----------------------------------------------------------------------------------

std::string hf_index_with(const std::string& name, const std::string& index_text) {
  return copy_dir(pytorch_checkpoint("hf_index"), name, [&](const std::string& file, const std::string& bytes) {
    return file == "model.safetensors.index.json" ? index_text : bytes;
  });
}

TEST(HfIndex, IsValidatedAndMatchesTheFiles) {
  const std::string good = pytorch_checkpoint("hf_index");
  json index = json::parse(read_bytes(good + "/model.safetensors.index.json"));
  json wrong = index;
  wrong["weight_map"]["counter"] = "model-00001-of-00002.safetensors";
  expect_refused(hf_index_with("wrong_file", wrong.dump()), good, "model.safetensors.index.json: weight_map puts tensor 'counter' in",
                 "which does not hold it");
  json escaping = index;
  escaping["weight_map"]["counter"] = "../model-00002-of-00002.safetensors";
  expect_refused(hf_index_with("escaping", escaping.dump()), good, "field 'weight_map.counter'", "is not a file of this directory");
  expect_refused(hf_index_with("array", "[]"), good, "model.safetensors.index.json", "expected a JSON object, found an array");
  expect_refused(hf_index_with("deep", nested_arrays(100000)), good, "model.safetensors.index.json", "JSON nested deeper than 128 levels");
}

}  // namespace
}  // namespace dtensor::testing
