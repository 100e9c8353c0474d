// .pt2 archives from outside are untrusted: every damaged copy of the suite's own archives below is
// refused at load (or, for weight bytes read on demand, when read) with a DTensorError that names the
// file and the field, never a crash, a raw library error or a program that loads with wrong values.

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include "dtensor/graph/program.h"
#include "file_helpers.h"

namespace dtensor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace g = dtensor::graph;
using json = nlohmann::json;

// Inputs for a program's user inputs, from their metas (tensors of ones; sizes at their example value).
std::vector<c10::IValue> example_inputs(const g::Program& program) {
  std::vector<c10::IValue> out;
  for (const g::Value* v : program.user_inputs()) {
    if (!v->is_tensor()) out.emplace_back(v->sym_hint);
    else if (c10::isIntegralType(v->meta.dtype, true)) out.emplace_back(at::zeros(v->meta.shape, at::TensorOptions().dtype(v->meta.dtype)));
    else out.emplace_back(at::ones(v->meta.shape, at::TensorOptions().dtype(v->meta.dtype)));
  }
  return out;
}

// The error loading `path` gives: it names the file and `field`, and says `what`.
void expect_load_error(const std::string& path, const std::string& field, const std::string& what) {
  const std::string error = error_of([&] { g::load_program(path); });
  EXPECT_THAT(error, AllOf(HasSubstr(path), HasSubstr(field), HasSubstr(what)));
}

json& node_named(json& model, const std::string& name) {
  for (json& n : model["graph_module"]["graph"]["nodes"])
    if (n["name"] == name) return n;
  throw std::runtime_error("no node " + name);
}

TEST(Pt2Reader, EverySuiteArchiveLoads) {
  for (const std::string archive : {"mlp.pt2", "mlp_extras.pt2", "mlp_extras_aten.pt2", "mlp_head.pt2", "gpt_aten_dynamic.pt2",
                                    "gpt_aten_static.pt2", "gpt_joint.pt2", "gpt_train_ir_dynamic.pt2", "gpt_train_ir_static.pt2"}) {
    SCOPED_TRACE(archive);
    g::Program program = g::load_program(graph_model(archive));
    for (const auto& [name, state] : program.state) EXPECT_EQ(state.tensor().sizes().vec(), state.meta().shape) << name;
  }
}

TEST(Pt2Reader, NotAnArchive) {
  const std::string text = scratch("text.pt2");
  write_bytes(text, "hello");
  EXPECT_THAT(error_of([&] { g::load_program(text); }), AllOf(HasSubstr(text), HasSubstr("not a readable .pt2 archive")));
  const std::string missing = scratch("missing.pt2");
  EXPECT_THAT(error_of([&] { g::load_program(missing); }), AllOf(HasSubstr(missing), HasSubstr("not a readable .pt2 archive")));
}

TEST(Pt2Reader, TruncatedArchive) {
  const std::string bytes = read_bytes(graph_model("mlp.pt2"));
  for (const size_t keep : {bytes.size() * 2 / 3, bytes.size() - 1, size_t{30}}) {
    const std::string cut = scratch("cut.pt2");
    write_bytes(cut, bytes.substr(0, keep));
    EXPECT_THAT(error_of([&] { g::load_program(cut); }), AllOf(HasSubstr(cut), HasSubstr("not a readable .pt2 archive")));
  }
}

TEST(Pt2Reader, RewrittenArchiveStillLoads) {
  // The editing helper itself changes nothing that matters.
  g::Program program = g::load_program(with_model_json("mlp.pt2", "same.pt2", [](json&) {}));
  EXPECT_EQ(program.graph.size(), 3u);
}

TEST(Pt2Reader, UnsupportedSchemaVersion) {
  const auto path = with_model_json("mlp.pt2", "v9.pt2", [](json& m) { m["schema_version"]["major"] = 9; });
  expect_load_error(path, "field 'schema_version'", "schema version 9.20 is not supported");
}

TEST(Pt2Reader, AnotherSchemaMajorIsNamedEvenWhereItsGraphDoesNotDecode) {
  // Another major's graph fails the 8.x decode (here a member 8.x lacks); the version is the error.
  const auto path = with_model_json("mlp.pt2", "v7.pt2", [](json& m) {
    m["schema_version"]["major"] = 7;
    m["graph_module"]["graph"]["nodes"][0]["member_of_v7"] = 1;
  });
  expect_load_error(path, "field 'schema_version'", "schema version 7.20 is not supported");
}

TEST(Pt2Reader, OpUnknownToTheDispatcher) {
  const auto path = with_model_json("mlp.pt2", "unknown_op.pt2", [](json& m) {
    m["graph_module"]["graph"]["nodes"][1]["target"] = "torch.ops.aten.no_such_op.default";
  });
  expect_load_error(path, "models/model.json: node 'gelu': field 'target'", "the op torch.ops.aten.no_such_op.default is unknown");
}

TEST(Pt2Reader, MissingWeightRecord) {
  const std::string path = scratch("no_weight.pt2");
  rewrite_archive(graph_model("mlp.pt2"), path, [](const std::string& record, const std::string& content) {
    return record == "data/weights/weight_0" ? std::nullopt : std::optional<std::string>(content);
  });
  expect_load_error(path, "field 'config.fc1.weight.path_name'", "the weight record data/weights/weight_0 is missing from the archive");
}

// ---- the zip structure --------------------------------------------------------------------------------

// A copy of mlp.pt2 named `name`, its bytes changed by `edit` (which gets the entries' offsets).
std::string mlp_bytes_edited(const std::string& name, const std::function<void(std::string&, const std::vector<RawZipEntry>&)>& edit) {
  std::string bytes = read_bytes(graph_model("mlp.pt2"));
  edit(bytes, raw_zip_entries(bytes));
  const std::string path = scratch(name);
  write_bytes(path, bytes);
  return path;
}

TEST(Pt2ZipStructure, CompressionMethodsMustAgree) {
  // The directory says stored and the local header deflated, and the reverse: either way a reader
  // trusting one of them reads raw bytes as weights (or overflows its buffer).
  const auto local_deflated = mlp_bytes_edited("local_deflated.pt2", [](std::string& b, const std::vector<RawZipEntry>& e) {
    put_u16(b, raw_zip_entry(e, "weights/weight_0").local + kLocalMethod, 8);
  });
  expect_load_error(local_deflated, "zip entry 'mlp/data/weights/weight_0'", "compression method 8 differs from the directory's 0");
  const auto central_deflated = mlp_bytes_edited("central_deflated.pt2", [](std::string& b, const std::vector<RawZipEntry>& e) {
    put_u16(b, raw_zip_entry(e, "weights/weight_0").central + kCentralMethod, 8);
  });
  expect_load_error(central_deflated, "zip entry 'mlp/data/weights/weight_0'", "compression method 0 differs from the directory's 8");
  // ... and cut to a size that is not a whole number of elements (the heap overflow of old).
  const auto cut = mlp_bytes_edited("central_deflated_cut.pt2", [](std::string& b, const std::vector<RawZipEntry>& e) {
    const RawZipEntry& w = raw_zip_entry(e, "weights/weight_0");
    put_u16(b, w.central + kCentralMethod, 8);
    put_u32(b, w.central + kCentralCompressed, w.size - 3);
  });
  expect_load_error(cut, "zip entry 'mlp/data/weights/weight_0'", "differs from the directory's");
}

TEST(Pt2ZipStructure, DeclaredSizesMustAgree) {
  for (const int64_t delta : {64, -4}) {
    const auto path = mlp_bytes_edited("resized.pt2", [&](std::string& b, const std::vector<RawZipEntry>& e) {
      const RawZipEntry& w = raw_zip_entry(e, "weights/weight_0");
      put_u32(b, w.central + kCentralCompressed, static_cast<uint32_t>(w.size + delta));
      put_u32(b, w.central + kCentralSize, static_cast<uint32_t>(w.size + delta));
    });
    expect_load_error(path, "zip entry 'mlp/data/weights/weight_0'", "data descriptor is missing or differs from the directory entry");
  }
}

// Renames entry `suffix` to `name` (of the same length) in both of its headers.
void rename_entry(std::string& bytes, const std::vector<RawZipEntry>& entries, const std::string& suffix, const std::string& name) {
  const RawZipEntry& e = raw_zip_entry(entries, suffix);
  ASSERT_EQ(name.size(), e.name.size());
  bytes.replace(e.central + 46, name.size(), name);
  bytes.replace(e.local + kLocalHeaderSize, name.size(), name);
}

TEST(Pt2ZipStructure, NamesAreUniqueAndStayInTheFolder) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"mlp/data/weights/weight_0", "two entries have this name"},      // weight_1 renamed onto weight_0
      {"mlp/data/weights/../xyz_1", "the name has a '..' component"},
      {"/lp/data/weights/weight_1", "the name has an absolute path"},
      {"mlq/data/weights/weight_1", "lies outside the archive's folder 'mlp'"},
      {"mlp/data\\weights/weight_1", "a backslash"},
      {"mlp/data//eights/weight_1", "an empty path component"},
  };
  for (const auto& [name, why] : cases) {
    SCOPED_TRACE(name);
    const auto path = mlp_bytes_edited("renamed.pt2", [&](std::string& b, const std::vector<RawZipEntry>& e) {
      rename_entry(b, e, "weights/weight_1", name);
    });
    expect_load_error(path, "zip entry '", why);
  }
}

TEST(Pt2ZipStructure, FlippedBytesFailTheirCrc) {
  // In the graph: refused at load.
  const auto model = mlp_bytes_edited("flipped_model.pt2", [](std::string& b, const std::vector<RawZipEntry>& e) {
    b[raw_zip_data(b, raw_zip_entry(e, "models/model.json")) + 100] ^= 0x01;
  });
  expect_load_error(model, "zip entry 'mlp/models/model.json'", "CRC-32 mismatch");
  // In a weight: the program loads (weights are read on demand), and reading the weight fails.
  const auto weight = mlp_bytes_edited("flipped_weight.pt2", [](std::string& b, const std::vector<RawZipEntry>& e) {
    const RawZipEntry& w = raw_zip_entry(e, "weights/weight_0");
    b[raw_zip_data(b, w) + w.size / 2] ^= 0x10;
  });
  g::Program program = g::load_program(weight);
  EXPECT_THAT(error_of([&] { g::run(program, example_inputs(program)); }),
              AllOf(HasSubstr(weight), HasSubstr("zip entry 'mlp/data/weights/weight_0'"), HasSubstr("CRC-32 mismatch")));
}

TEST(Pt2ZipStructure, RecordOfPartialElements) {
  const std::string path = scratch("partial_elements.pt2");
  rewrite_archive(graph_model("mlp.pt2"), path, [](const std::string& record, const std::string& content) {
    return std::optional<std::string>(record == "data/weights/weight_0" ? content + "abc" : content);
  });
  expect_load_error(path, "field 'config.fc1.weight.path_name'", "not a whole number of Float elements");
}

// ---- model.json ------------------------------------------------------------------------------------------

TEST(Pt2Json, DeepNestingIsRefused) {
  // Nested 100,000 deep anywhere: the decoder refuses it where its type is wrong, and the description of
  // what it found stops at the depth limit (no recursion runs on it).
  const std::vector<std::pair<std::string, std::string>> places = {
      {"\"range_constraints\": {}", "\"range_constraints\": @"},
      {"\"verifiers\": [", "\"verifiers\": [@, "},
      {"\"module_call_graph\": [", "\"module_call_graph\": [@, "},
      {"\"inputs\": [{\"as_tensor\"", "\"inputs\": [@, {\"as_tensor\""},
      {"\"arg\": {\"as_tensor\": {\"name\": \"x\"}}", "\"arg\": @"},
  };
  for (const auto& [anchor, replacement] : places) {
    SCOPED_TRACE(anchor);
    const auto path = with_model_text("mlp.pt2", "deep.pt2", [&](std::string& text) {
      const size_t at = text.find(anchor);
      ASSERT_NE(at, std::string::npos);
      std::string deep = replacement;
      deep.replace(deep.find('@'), 1, nested_arrays(100000));
      text.replace(at, anchor.size(), deep);
    });
    expect_load_error(path, "models/model.json", "JSON nested deeper than 128 levels");
  }
}

TEST(Pt2Json, DuplicateKeysAreRefused) {
  const auto path = with_model_text("mlp.pt2", "duplicate_key.pt2", [](std::string& text) {
    const std::string target = "\"target\": \"torch.ops.aten.gelu.default\"";
    const size_t at = text.find(target);
    ASSERT_NE(at, std::string::npos);
    text.insert(at, "\"target\": \"torch.ops.aten.relu.default\", ");
  });
  expect_load_error(path, "models/model.json", "an object holds the key 'target' twice");
}

TEST(Pt2Json, MissingAndMistypedFieldsAreNamed) {
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::string field, what;
  };
  const std::vector<Case> cases = {
      {"hint", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {{"as_expr", {{"expr_str", "s0"}}}}; },
       "field 'graph_module.graph.tensor_values.x.sizes[0].as_expr'", "a dynamic size without an example value (hint)"},
      {"expr_str", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {{"as_expr", {{"hint", {{"as_int", 8}}}}}}; },
       "field 'graph_module.graph.tensor_values.x.sizes[0].as_expr.expr_str'", "the member is missing"},
      {"arg", [](json& m) { node_named(m, "gelu")["inputs"][0].erase("arg"); },
       "node 'gelu': field 'inputs[0].arg'", "the member is missing"},
      {"fraction", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][1] = {{"as_int", 16.5}}; },
       "field 'graph_module.graph.tensor_values.x.sizes[1].as_int'", "expected an integer, found a fractional number 16.5"},
      {"string", [](json& m) { node_named(m, "gelu")["target"] = 7; }, "node 'gelu': field 'target'",
       "does not fit torch's export schema (expected a string): found an integer 7"},
      {"not_a_union", [](json& m) { node_named(m, "gelu")["inputs"][0]["arg"] = {{"as_tensor", {{"name", "linear"}}}, {"as_int", 1}}; },
       "node 'gelu': field 'inputs[0].arg'", "has a second member 'as_tensor', but a union holds exactly one"},
      {"unknown_member", [](json& m) { node_named(m, "gelu")["targte"] = "x"; }, "node 'gelu'",
       "has the member 'targte', which torch 2.15's export schema does not have here"},
      {"unknown_union_member", [](json& m) { node_named(m, "gelu")["inputs"][0]["arg"] = {{"as_tensr", {{"name", "linear"}}}}; },
       "node 'gelu': field 'inputs[0].arg'", "none of its members ('as_tensr', ...) is one torch's export schema allows here"},
      {"bool_as_int", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][1] = {{"as_int", true}}; },
       "field 'graph_module.graph.tensor_values.x.sizes[1].as_int'", "does not fit torch's export schema (expected an integer): found a boolean true"},
      {"unsigned_wraps", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][1] = {{"as_int", UINT64_MAX}}; },
       "field 'graph_module.graph.tensor_values.x.sizes[1].as_int'", "expected an integer, found an integer 18446744073709551615, beyond any 64-bit integer"},
      {"huge_float", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][1] = {{"as_int", 1e300}}; },
       "field 'graph_module.graph.tensor_values.x.sizes[1].as_int'", "beyond any 64-bit integer"},
      {"sizes_missing", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"].erase("sizes"); },
       "field 'graph_module.graph.tensor_values.x.sizes'", "the member is missing"},
      {"dtype_wraps", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["dtype"] = (int64_t{1} << 32) + 7; },
       "field 'graph_module.graph.tensor_values.x.dtype'", "expected a ScalarType code of torch's export schema, found an integer 4294967303"},
      {"unknown_value", [](json& m) { node_named(m, "gelu")["inputs"][0]["arg"]["as_tensor"]["name"] = "nowhere"; },
       "node 'gelu': field 'inputs[0].arg.as_tensor.name'", "refers to 'nowhere', which no earlier node or input defines"},
      {"signature", [](json& m) { m["graph_module"]["signature"]["input_specs"][0]["parameter"]["arg"]["name"] = "linear"; },
       "field 'graph_module.signature.input_specs[0].parameter.arg.name'", "no graph input named 'linear'"},
      {"argument_twice", [](json& m) { node_named(m, "gelu")["inputs"].push_back(node_named(m, "gelu")["inputs"][0]); },
       "node 'gelu': field 'inputs[1].name'", "the argument 'self' is given twice"},
      // Unknown members and second union members are refused at every level.
      {"graph_unknown_member", [](json& m) { m["graph_module"]["graph"]["nodez"] = json::array(); }, "field 'graph_module.graph'",
       "has the member 'nodez', which torch 2.15's export schema does not have here"},
      {"graph_input_two_members", [](json& m) { m["graph_module"]["graph"]["inputs"][0]["as_int"] = 1; },
       "field 'graph_module.graph.inputs[0]'", "has a second member 'as_tensor', but a union holds exactly one"},
      {"tensor_meta_unknown_member", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizez"] = json::array(); },
       "field 'graph_module.graph.tensor_values.x'", "has the member 'sizez', which torch 2.15's export schema does not have here"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_load_error(with_model_json("mlp.pt2", c.name + ".pt2", c.edit), c.field, c.what);
  }
}

TEST(Pt2Json, DeviceWithoutIndexIsTheDefaultDevice) {
  // Serde leaves "index" out for an unindexed device: such an argument is read, not refused.
  const auto path = with_model_json("gpt_joint.pt2", "device.pt2", [](json& m) {
    for (json& n : m["graph_module"]["graph"]["nodes"])
      for (json& a : n["inputs"])
        if (a["arg"].contains("as_device")) a["arg"]["as_device"].erase("index");
  });
  g::Program program = g::load_program(path);
  bool found = false;
  for (const g::Node* n : program.graph.nodes())
    for (const g::Arg& a : n->args())
      if (a.kind == g::Arg::Kind::Constant && a.given && a.constant.isDevice()) {
        EXPECT_EQ(a.constant.toDevice(), c10::Device(c10::kCPU));
        found = true;
      }
  EXPECT_TRUE(found) << "the model has no device argument: pick one that has";
}

TEST(Pt2Json, OutputSpecsNameTheirTargets) {
  const auto path = with_model_json("mlp_extras_aten.pt2", "mutation.pt2", [](json& m) {
    m["graph_module"]["signature"]["output_specs"][0]["buffer_mutation"]["buffer_name"] = "nope";
  });
  expect_load_error(path, "field 'graph_module.signature.output_specs'", "output spec 0 names 'nope', which is not a buffer of the program");
}

TEST(Pt2Run, AnOpReturningAnotherKindThanDeclaredNamesTheNode) {
  // A sym_size node whose integer result the file declares a tensor: it loads (the tensor has a meta,
  // nothing reads it), and running it fails naming the node.
  const auto path = with_model_json("gpt_aten_dynamic.pt2", "kind.pt2", [](json& m) {
    json& graph = m["graph_module"]["graph"];
    json bogus = node_named(m, "sym_size_int_14");
    bogus["name"] = "bogus";
    bogus["outputs"] = json::array({{{"as_tensor", {{"name", "bogus"}}}}});
    graph["tensor_values"]["bogus"] = graph["tensor_values"]["tokens"];
    graph["nodes"].insert(graph["nodes"].begin() + 1, bogus);
  });
  g::Program program = g::load_program(path);
  EXPECT_THAT(error_of([&] { g::run(program, example_inputs(program)); }),
              AllOf(HasSubstr(path), HasSubstr("node 'bogus' (aten::sym_size.int) returned a Int for %bogus, which the file declares a tensor")));
}

// ---- tensor metadata ----------------------------------------------------------------------------------------

TEST(Pt2Metadata, NegativeOrOverflowingSizesStridesAndOffsets) {
  const std::string x = "graph_module.graph.tensor_values.x";
  const std::vector<std::tuple<std::string, std::function<void(json&)>, std::string, std::string>> cases = {
      {"negative_size", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {{"as_int", -8}}; },
       x + ".sizes[0].as_int", "found -8"},
      {"min_stride", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["strides"][0] = {{"as_int", INT64_MIN}}; },
       x + ".strides[0].as_int", "found -9223372036854775808"},
      {"negative_offset", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["storage_offset"] = {{"as_int", -1}}; },
       x + ".storage_offset.as_int", "found -1"},
      {"overflow", [](json& m) {
         auto& sizes = m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"];
         sizes[0] = {{"as_int", int64_t{1} << 40}};
         sizes[1] = {{"as_int", int64_t{1} << 40}};
       },
       x, "overflow a 64-bit element count"},
      {"strides_short", [](json& m) { m["graph_module"]["graph"]["tensor_values"]["x"]["strides"].erase(1); }, x + ".strides",
       "1 strides for 2 sizes"},
  };
  for (const auto& [name, edit, field, what] : cases) {
    SCOPED_TRACE(name);
    expect_load_error(with_model_json("mlp.pt2", name + ".pt2", edit), "field '" + field + "'", what);
  }
}

// mlp.pt2 with the tensor_meta of weight fc1.weight in its weights config changed by `edit`.
std::string mlp_with_weight_meta(const std::string& name, const std::function<void(json&)>& edit) {
  const std::string path = scratch(name);
  rewrite_archive(graph_model("mlp.pt2"), path, [&](const std::string& record, const std::string& content) {
    if (record != "data/weights/model_weights_config.json") return std::optional<std::string>(content);
    json config = json::parse(content);
    edit(config["config"]["fc1.weight"]["tensor_meta"]);
    return std::optional<std::string>(config.dump());
  });
  return path;
}

TEST(Pt2Metadata, WeightViewsLieInsideTheirRecords) {
  const std::string field = "field 'config.fc1.weight.tensor_meta'";
  expect_load_error(mlp_with_weight_meta("enlarged.pt2", [](json& t) { t["sizes"][0] = {{"as_int", 33}}; }), field,
                    "its view needs 528 elements of storage, but the record data/weights/weight_0 holds 512");
  expect_load_error(mlp_with_weight_meta("offset.pt2", [](json& t) { t["storage_offset"] = {{"as_int", 1}}; }), field,
                    "its view needs 513 elements of storage");
  expect_load_error(mlp_with_weight_meta("stride.pt2", [](json& t) { t["strides"][0] = {{"as_int", 17}}; }), field,
                    "its view needs 543 elements of storage");
}

TEST(Pt2Metadata, WeightsMatchTheGraphInputsTheyFeed) {
  const auto path = mlp_with_weight_meta("transposed.pt2", [](json& t) {
    t["sizes"] = json::array({{{"as_int", 16}}, {{"as_int", 32}}});
    t["strides"] = json::array({{{"as_int", 32}}, {{"as_int", 1}}});
  });
  expect_load_error(path, "'fc1.weight' is stored as Float [16, 32]", "the graph input %p_fc1_weight it feeds is Float [32, 16]");
}

// ---- integer operators -------------------------------------------------------------------------------------

// gpt_aten_dynamic.pt2's node mul_4 (sym_size_int_14 * 32) changed by `edit`.
std::string with_integer_node(const std::string& name, const std::function<void(json& node, json& model)>& edit) {
  return with_model_json("gpt_aten_dynamic.pt2", name, [&](json& m) { edit(node_named(m, "mul_4"), m); });
}

TEST(Pt2IntegerOperators, RefusedAtLoad) {
  const std::vector<std::tuple<std::string, std::string, json, json, std::string>> cases = {
      {"floordiv_zero", "_operator.floordiv", {{"as_sym_int", {{"as_name", "sym_size_int_14"}}}}, {{"as_int", 0}}, "by the constant 0"},
      {"mod_zero", "_operator.mod", {{"as_sym_int", {{"as_name", "sym_size_int_14"}}}}, {{"as_int", 0}}, "by the constant 0"},
      {"min_by_minus_one", "_operator.floordiv", {{"as_int", INT64_MIN}}, {{"as_int", -1}}, "of constants has no int64 result"},
      {"unknown", "_operator.pow", {{"as_sym_int", {{"as_name", "sym_size_int_14"}}}}, {{"as_int", 2}}, "unsupported integer operator _operator.pow"},
      {"tensor_operand", "_operator.mul", {{"as_tensor", {{"name", "p_pos_emb"}}}}, {{"as_int", 2}}, "must be an integer or a symbolic integer"},
  };
  for (const auto& [name, target, a, b, what] : cases) {
    SCOPED_TRACE(name);
    const auto path = with_integer_node(name + ".pt2", [&](json& n, json&) {
      n["target"] = target;
      n["inputs"][0]["arg"] = a;
      n["inputs"][1]["arg"] = b;
    });
    expect_load_error(path, "node 'mul_4'", what);
  }
}

TEST(Pt2IntegerOperators, ZeroDivisorAtRunNamesTheNode) {
  // zero = s - s (symbolic, so the load cannot know), then mul_4 = s // zero.
  const auto path = with_integer_node("run_zero.pt2", [](json& n, json& m) {
    json zero = n;
    zero["name"] = "zero";
    zero["target"] = "_operator.sub";
    zero["inputs"][1]["arg"] = {{"as_sym_int", {{"as_name", "sym_size_int_14"}}}};
    zero["outputs"] = json::array({{{"as_sym_int", {{"as_name", "zero"}}}}});
    n["target"] = "_operator.floordiv";
    n["inputs"][1]["arg"] = {{"as_sym_int", {{"as_name", "zero"}}}};
    auto& nodes = m["graph_module"]["graph"]["nodes"];
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i]["name"] == "mul_4") {
        nodes.insert(nodes.begin() + static_cast<std::ptrdiff_t>(i), zero);
        break;
      }
  });
  g::Program program = g::load_program(path);
  EXPECT_THAT(error_of([&] { g::run(program, example_inputs(program)); }),
              AllOf(HasSubstr(path), HasSubstr("node 'mul_4'"), HasSubstr("_operator.floordiv(8, 0): integer division by zero")));
}

}  // namespace
}  // namespace dtensor::testing
