// PyTorch DCP's .metadata (a pickle) through dtensor's restricted unpickler: what dcp.save of PyTorch
// 2.15 wrote at build time (scripts/write_dcp_checkpoints.py) reads field for field as PyTorch itself
// reads it (expected.json), and crafted or damaged pickles are refused with a DTensorError naming the
// file, the byte and what was found, never executed.

#include <gmock/gmock.h>

#include <filesystem>

#include "../../src/io/restricted_pickle.h"
#include "../support/build_paths.h"
#include "dtensor/dcp.h"
#include "file_helpers.h"

namespace dtensor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::string_literals;
namespace dcp = dtensor::checkpoint::dcp;

std::string dcp_dir(const std::string& name) { return std::string(build_paths::checkpoint_interop) + "/dcp_written/" + name; }

c10::ScalarType dtype_named(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> dtypes = {
      {"float32", c10::kFloat}, {"bfloat16", c10::kBFloat16}, {"float16", c10::kHalf}, {"int64", c10::kLong},
      {"float64", c10::kDouble}, {"bool", c10::kBool},        {"int32", c10::kInt}};
  return dtypes.at(name);
}

std::vector<int64_t> json_ints(const json& j) { return j.get<std::vector<int64_t>>(); }

// Every field of `md` against the metadata as PyTorch read it.
void expect_as_pytorch_read(const dcp::DcpMetadata& md, const json& want) {
  ASSERT_EQ(md.entries.size(), want["state_dict_metadata"].size());
  for (const auto& [fqn, e] : want["state_dict_metadata"].items()) {
    SCOPED_TRACE(fqn);
    ASSERT_TRUE(md.entries.count(fqn));
    const dcp::DcpEntry& entry = md.entries.at(fqn);
    if (e["kind"] == "bytes") {
      EXPECT_TRUE(std::holds_alternative<dcp::DcpBytes>(entry));
      continue;
    }
    ASSERT_TRUE(std::holds_alternative<dcp::DcpTensor>(entry));
    const auto& t = std::get<dcp::DcpTensor>(entry);
    EXPECT_EQ(t.dtype, dtype_named(e["dtype"]));
    EXPECT_EQ(t.size, json_ints(e["size"]));
    EXPECT_EQ(t.requires_grad, e["requires_grad"].get<bool>());
    EXPECT_EQ(t.pin_memory, e["pin_memory"].get<bool>());
    ASSERT_EQ(t.strides.has_value(), !e["strides"].is_null());
    if (t.strides) EXPECT_EQ(*t.strides, json_ints(e["strides"]));
    ASSERT_EQ(t.chunks.size(), e["chunks"].size());
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      EXPECT_EQ(t.chunks[i].offsets, json_ints(e["chunks"][i]["offsets"]));
      EXPECT_EQ(t.chunks[i].sizes, json_ints(e["chunks"][i]["sizes"]));
    }
  }
  ASSERT_EQ(md.storage.size(), want["storage_data"].size());
  for (size_t i = 0; i < md.storage.size(); ++i) {
    const auto& [index, storage] = md.storage[i];
    const json& s = want["storage_data"][i];
    SCOPED_TRACE(s.dump());
    EXPECT_EQ(index.fqn, s["fqn"].get<std::string>());
    ASSERT_EQ(index.offset.has_value(), !s["offset"].is_null());
    if (index.offset) EXPECT_EQ(*index.offset, json_ints(s["offset"]));
    ASSERT_EQ(index.index.has_value(), !s["index"].is_null());
    if (index.index) EXPECT_EQ(*index.index, s["index"].get<int64_t>());
    EXPECT_EQ(storage.relative_path, s["relative_path"].get<std::string>());
    EXPECT_EQ(storage.offset, s["file_offset"].get<int64_t>());
    EXPECT_EQ(storage.length, s["length"].get<int64_t>());
    EXPECT_TRUE(storage.transform_descriptors.empty());
  }
  ASSERT_TRUE(md.version);
  EXPECT_EQ(*md.version, want["version"].get<std::string>());
  ASSERT_TRUE(md.storage_meta);
  const json& sm = want["storage_meta"];
  ASSERT_EQ(md.storage_meta->checkpoint_id.has_value(), !sm["checkpoint_id"].is_null());
  if (md.storage_meta->checkpoint_id) EXPECT_EQ(*md.storage_meta->checkpoint_id, sm["checkpoint_id"].get<std::string>());
  EXPECT_EQ(md.storage_meta->save_id, sm["save_id"].get<std::string>());
  EXPECT_EQ(md.storage_meta->modules, sm["modules"].get<std::vector<std::string>>());
}

TEST(DcpPickledMetadata, ReadsWhatPyTorchWrote) {
  for (const std::string name : {"dcp_single", "dcp_sharded"}) {
    SCOPED_TRACE(name);
    const json want = json::parse(read_bytes(dcp_dir(name) + "/expected.json"));
    expect_as_pytorch_read(dcp::read_metadata(dcp_dir(name)), want);
    expect_as_pytorch_read(dcp::read_metadata(dcp_dir(name) + "/.metadata"), want);
  }
}

TEST(DcpPickledMetadata, RecordsWhatTheSavedTensorsWere) {
  const dcp::DcpMetadata md = dcp::read_metadata(dcp_dir("dcp_single"));
  EXPECT_TRUE(std::get<dcp::DcpTensor>(md.entries.at("bias")).requires_grad);  // an nn.Parameter
  EXPECT_FALSE(std::get<dcp::DcpTensor>(md.entries.at("w")).requires_grad);
  EXPECT_EQ(std::get<dcp::DcpTensor>(md.entries.at("nested.inner")).dtype, c10::kInt);  // a nested dict's, flattened
}

TEST(DcpPickledMetadata, ShardedTensorsHaveTheirChunks) {
  const dcp::DcpMetadata md = dcp::read_metadata(dcp_dir("dcp_sharded"));
  // w (7, 5) as [Shard(0), Shard(1)] on 2 x 2: rows 4 + 3, columns 3 + 2.
  const auto& w = std::get<dcp::DcpTensor>(md.entries.at("w"));
  EXPECT_EQ(w.chunks.size(), 4u);
  EXPECT_EQ(w.dtype, c10::kFloat);
  EXPECT_EQ(w.size, (std::vector<int64_t>{7, 5}));
  EXPECT_TRUE(std::holds_alternative<dcp::DcpBytes>(md.entries.at("step")));
  std::set<std::string> files;
  for (const auto& [index, storage] : md.storage) files.insert(storage.relative_path);
  EXPECT_EQ(files.size(), 4u);  // each rank wrote its own file
}

// Protocols 2 and 3 write GLOBAL, BINPUT and BINUNICODE where dcp.save's protocol 4 writes STACK_GLOBAL,
// MEMOIZE and SHORT_BINUNICODE; 5 is 4's.
TEST(DcpPickledMetadata, ReadsEveryProtocolFromTwo) {
  const json want = json::parse(read_bytes(dcp_dir("dcp_single") + "/expected.json"));
  for (int protocol : {2, 3, 5}) {
    SCOPED_TRACE(protocol);
    expect_as_pytorch_read(dcp::read_metadata(dcp_dir("dcp_single") + "/metadata_protocol_" + std::to_string(protocol) + ".pickle"), want);
  }
}

// Refused: `bytes` as a .metadata file, with an error naming it and saying `what` and `at` (the byte).
void expect_metadata_refused(const std::string& name, const std::string& bytes, const std::string& what, const std::string& at = "") {
  SCOPED_TRACE(name);
  const std::string path = scratch(name + ".metadata");
  write_bytes(path, bytes);
  EXPECT_THAT(error_of([&] { dcp::read_metadata(path); }), AllOf(HasSubstr(path), HasSubstr(what), HasSubstr(at)));
}

std::string pickle4(const std::string& body) { return std::string("\x80\x04", 2) + body; }
std::string short_unicode(const std::string& s) { return std::string(1, '\x8c') + static_cast<char>(s.size()) + s; }

TEST(DcpPickledMetadata, RefusesGlobalsOutsideItsTable) {
  // pickle.dumps of os.system("ls") at protocol 2: GLOBAL then REDUCE.
  expect_metadata_refused("os_system", "\x80\x02" "cos\nsystem\n" "X\x02\x00\x00\x00" "ls" "\x85R."s, "global 'os.system'", "byte 2:");
  // builtins.eval through STACK_GLOBAL (protocol 4), to be REDUCE'd.
  expect_metadata_refused("eval", pickle4(short_unicode("builtins") + short_unicode("eval") + "\x93" + short_unicode("1+1") + "\x85R."),
                 "global 'builtins.eval'", "byte 18:");
  // An allowed class in a role the table does not give it: REDUCE of a dataclass, NEWOBJ of torch.Size.
  expect_metadata_refused("reduce_class",
                 pickle4(short_unicode("torch.distributed.checkpoint.metadata") + short_unicode("Metadata") + "\x93)R."),
                 "REDUCE of torch.distributed.checkpoint.metadata.Metadata");
  expect_metadata_refused("newobj_size", pickle4(short_unicode("torch") + short_unicode("Size") + "\x93)\x81."), "NEWOBJ of torch.Size");
  // REDUCE of something not a global, and BUILD on a container.
  expect_metadata_refused("reduce_string", pickle4(short_unicode("x") + ")R."), "REDUCE of a string 'x'");
  expect_metadata_refused("build_list", pickle4("]}b."), "BUILD on a list of 0");
}

TEST(DcpPickledMetadata, RefusesOpcodesOutsideTheSubset) {
  expect_metadata_refused("inst", pickle4("(ios\nsystem\n."), "opcode 0x69 (INST)", "byte 3:");
  // BINFLOAT runs (a bytes entry's learning rate needs it), but no float belongs in a .metadata.
  expect_metadata_refused("float", pickle4("G\x3f\xf0\x00\x00\x00\x00\x00\x00."s), "expected a torch.distributed.checkpoint.metadata.Metadata object, found a float 1");
  expect_metadata_refused("persid", pickle4("N\x51."), "(BINPERSID)");
  expect_metadata_refused("not_an_opcode", pickle4("\xff"), "opcode 0xff (not a pickle opcode)", "byte 2:");
  expect_metadata_refused("protocol_1", std::string("]."), "does not start with PROTO", "byte 0:");
  expect_metadata_refused("protocol_6", "\x80\x06N."s, "PROTO 6");
}

TEST(DcpPickledMetadata, RefusesBrokenMachineStates) {
  expect_metadata_refused("memo_out_of_range", pickle4("N\x94h\x05."), "memo index 5 is out of range (the memo holds 1)", "byte 4:");
  expect_metadata_refused("memo_gap", pickle4("Nq\x07."), "memo index 7 leaves a gap");
  expect_metadata_refused("underflow", pickle4("a."), "APPEND needs a value", "byte 2:");
  expect_metadata_refused("underflow_above_mark", pickle4("](a."), "APPEND needs a value, and the stack is empty above its MARK");
  expect_metadata_refused("odd_setitems", pickle4("}(NNNu."), "SETITEMS with an odd number of values (3)");
  expect_metadata_refused("two_values", pickle4("NN."), "STOP with 2 values on the stack");
  expect_metadata_refused("open_mark", pickle4("(N."), "STOP with 1 MARK(s) still open");
  expect_metadata_refused("trailing", pickle4("]." "junk"), "4 bytes after STOP", "byte 4:");
  expect_metadata_refused("no_stop", pickle4("]"), "ends without STOP");
  expect_metadata_refused("not_utf8", pickle4("\x8c\x02\xc3\x28."), "a string that is not UTF-8");
  expect_metadata_refused("long_past_64_bits", pickle4("\x8a\x09" + std::string(9, '\x01') + "."), "LONG1 of 9 bytes");
}

TEST(DcpPickledMetadata, RefusesHugeLengthsAndDeepNesting) {
  expect_metadata_refused("huge_string", pickle4("X\xf0\xff\xff\xff" "abc."), "a string of 4294967280 bytes runs past the end of the file (4 left)", "byte 2:");
  expect_metadata_refused("huge_frame", pickle4("\x95\x00\x00\x00\x00\x00\x00\x00\x10N."s), "a FRAME of 1152921504606846976 bytes runs past the end");
  expect_metadata_refused("deep_marks", pickle4(std::string(100, '(')), "more than 64 MARKs open", "byte 66:");
  // ]]]]...aaaa: lists in lists, built from the inside out.
  expect_metadata_refused("deep_lists", pickle4(std::string(100, ']') + std::string(99, 'a') + "."), "nested deeper than 64 levels");
  expect_metadata_refused("deep_tuples", pickle4("N" + std::string(100, '\x85') + "."), "nested deeper than 64 levels");
}

TEST(DcpPickledMetadata, RefusesEveryTruncation) {
  const std::string good = read_bytes(dcp_dir("dcp_single") + "/.metadata");
  for (size_t n = 0; n < good.size(); n += 7) {
    const std::string path = scratch("truncated.metadata");
    write_bytes(path, good.substr(0, n));
    EXPECT_THAT(error_of([&] { dcp::read_metadata(path); }), HasSubstr(path)) << n << " bytes";
  }
}

TEST(DcpPickledMetadata, RefusesAChangedName) {
  std::string bytes = read_bytes(dcp_dir("dcp_single") + "/.metadata");
  const size_t at = bytes.find("TensorStorageMetadata");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 20] = 'X';
  expect_metadata_refused("renamed_class", bytes, "global 'torch.distributed.checkpoint.metadata.TensorStorageMetadatX'");
}

// dcp_single's metadata with one field made wrong, pickled by Python (scripts/write_dcp_checkpoints.py).
TEST(DcpPickledMetadata, RefusesWrongFields) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"chunk_outside", {"state_dict_metadata['w'].chunks", "chunk 0 at [0, 0] of sizes [8, 5] lies outside the tensor's size [7, 5]"}},
      {"chunks_overlap", {"state_dict_metadata['w'].chunks", "chunks 0 at [0, 0] and 1 at [3, 0] overlap"}},
      {"chunks_gap", {"state_dict_metadata['w'].chunks", "the chunks hold 15 of the tensor's 35 elements"}},
      {"chunk_rank", {"state_dict_metadata['w'].chunks[0].offsets", "1 offsets for a tensor of 2 dims"}},
      {"path_escapes", {"relative_path", "the path '../escape.distcp' is not a file of the checkpoint's directory"}},
      {"negative_offset", {"storage_data[", ".offset", "integer -1 is outside [0, "}},
      {"storage_missing", {"storage_data", "the entry 'step' has storage for 0 of its 1 items"}},
      {"storage_unknown", {"storage_data{key ", "storage for 'ghost', which state_dict_metadata does not list"}},
      {"entry_not_metadata", {"state_dict_metadata['w']", "expected a TensorStorageMetadata or BytesStorageMetadata object, found a list of 2"}},
      // Each empty chunk overlaps none: the overlap sweep leaves them out rather than comparing 200000^2 pairs.
      {"many_empty_chunks", {"storage_data", "the entry 'w' has storage for 1 of its 200000 items"}},
  };
  for (const auto& [name, parts] : cases) {
    SCOPED_TRACE(name);
    const std::string path = dcp_dir("dcp_bad") + "/" + name + ".metadata";
    const std::string error = error_of([&] { dcp::read_metadata(path); });
    EXPECT_THAT(error, AllOf(HasSubstr(path + ": field '"), HasSubstr("(byte ")));
    for (const std::string& part : parts) EXPECT_THAT(error, HasSubstr(part));
  }
}

// Found by dcp_metadata_fuzzer under ASan on its first seed: STACK_GLOBAL read its module and name from
// strings of the value store while adding the global to it, and NEWOBJ / REDUCE their argument list,
// so that a store growing at that moment left them reading freed memory. Here the store grows at every
// point around them (each count of filler values before the global); under ASan (./dev test --sanitize)
// the old code fails at once, elsewhere the names still come out right.
TEST(DcpPickledMetadata, GlobalsSurviveTheValueStoreGrowing) {
  for (int filler = 0; filler < 70; ++filler) {
    SCOPED_TRACE(filler);
    std::string body = "(" + std::string(static_cast<size_t>(filler), 'N') + "t";  // a tuple of `filler` Nones
    body += short_unicode("torch") + short_unicode("Size") + "\x93" + "K\x02K\x03\x86\x85R" + "\x86.";
    const io::PickleTree tree = io::unpickle_restricted(pickle4(body), "grow.metadata");
    const io::PickleValue& size = tree.at(tree.at(tree.root()).items[1]);
    EXPECT_EQ(size.kind, io::PickleKind::Object);
    EXPECT_EQ(size.text, "torch.Size");
    ASSERT_EQ(size.items.size(), 1u);
    EXPECT_EQ(tree.at(size.items[0]).items.size(), 2u);
  }
}

TEST(DcpPickledMetadata, RefusesWhatIsNotThere) {
  EXPECT_THAT(error_of([] { dcp::read_metadata(scratch("no_such_checkpoint")); }), HasSubstr("no_such_checkpoint"));
}

}  // namespace
}  // namespace dtensor::testing
