// The graph IR's editing API on a real exported program (the MLP: linear -> gelu -> linear): inserting
// a node, replacing uses, erasing, inserting a subgraph, each checked by running the edited program
// against the same computation written with ATen calls, and the live use-lists each edit keeps.

#include <ATen/ATen.h>

#include <gmock/gmock.h>

#include "../support/error_of.h"
#include "../support/tensor_assertions.h"
#include "../support/test_models.h"
#include "dtensor/graph/program.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

struct Mlp {
  g::Program program = g::load_program(graph_model("mlp.pt2"));
  at::Tensor x = tensor_map("mlp_io").at("input0");
  g::Node* gelu = program.graph.nodes()[1];
  g::Node* fc2 = program.graph.nodes()[2];

  at::Tensor hidden() const {
    const auto& s = program.state;
    return at::gelu(at::linear(x, s.at("fc1.weight").tensor(), s.at("fc1.bias").tensor()));
  }
  at::Tensor fc2_of(const at::Tensor& h) const {
    return at::linear(h, program.state.at("fc2.weight").tensor(), program.state.at("fc2.bias").tensor());
  }
  at::Tensor run() { return g::run(program, {x})[0].toTensor(); }
};

TEST(GraphIrTest, EditInsertReplaceErase) {
  Mlp m;
  g::Value* h = m.gelu->outputs[0];
  g::Node* doubled = m.program.graph.insert_after(m.gelu, "aten::mul.Tensor", {g::Arg::tensor(h), g::Arg{g::Arg::Kind::Number, 2.0}},
                                                  "doubled");
  doubled->outputs[0]->meta = h->meta;
  // Use-lists are live: every edit keeps them current, and verify finds them matching.
  EXPECT_EQ(m.program.graph.users(h), (std::vector<g::Node*>{m.fc2, doubled}));
  m.program.graph.replace_all_uses(h, doubled->outputs[0], /*except=*/doubled);
  EXPECT_EQ(m.program.graph.users(h), std::vector<g::Node*>{doubled});
  EXPECT_EQ(m.program.graph.users(doubled->outputs[0]), std::vector<g::Node*>{m.fc2});
  EXPECT_EQ(m.program.graph.verify(), "");
  EXPECT_TRUE(tensors_close(m.run(), m.fc2_of(m.hidden() * 2)));

  EXPECT_THAT(error_of([&] { m.program.graph.erase(doubled); }), HasSubstr("its output doubled is still used"));
  m.program.graph.replace_all_uses(doubled->outputs[0], h);
  m.program.graph.erase(doubled);
  EXPECT_EQ(m.program.graph.users(h), std::vector<g::Node*>{m.fc2});
  EXPECT_EQ(m.program.graph.verify(), "");
  EXPECT_EQ(m.program.graph.size(), 3u);
  EXPECT_TRUE(tensors_close(m.run(), m.fc2_of(m.hidden())));
}

// The graph's outputs are uses of its output node, as in torch.fx: a returned value has a user, so it
// cannot be erased, and replacing its uses changes what the graph returns.
TEST(GraphIrTest, OutputsAreUsesOfTheOutputNode) {
  Mlp m;
  g::Graph& graph = m.program.graph;
  g::Value* y = m.fc2->outputs[0];
  ASSERT_EQ(graph.users(y), std::vector<g::Node*>{graph.output_node()});
  EXPECT_TRUE(y->is_graph_output());
  EXPECT_FALSE(m.gelu->outputs[0]->is_graph_output());
  EXPECT_THAT(error_of([&] { graph.erase(m.fc2); }), HasSubstr("the graph returns it"));

  g::Node* neg = graph.insert_after(m.fc2, "aten::neg", {g::Arg::tensor(y)}, "neg");
  neg->outputs[0]->meta = y->meta;
  graph.replace_all_uses(y, neg->outputs[0], /*except=*/neg);
  EXPECT_EQ(graph.users(y), std::vector<g::Node*>{neg});
  EXPECT_TRUE(neg->outputs[0]->is_graph_output());
  EXPECT_EQ(graph.verify(), "");
  EXPECT_TRUE(tensors_close(m.run(), -m.fc2_of(m.hidden())));
  EXPECT_THAT(graph.str(), HasSubstr("return (%neg)"));
}

// An edit the API allows but that breaks the order of definitions (a node inserted before the
// producer of what it reads) is found by verify, which the pass pipeline runs after every pass.
TEST(GraphIrTest, VerifyFindsAReadBeforeItsDefinition) {
  Mlp m;
  g::Value* h = m.gelu->outputs[0];
  m.program.graph.insert(m.gelu, "aten::neg", {g::Arg::tensor(h)}, "too_early");
  EXPECT_THAT(m.program.graph.verify(), HasSubstr("node too_early reads %" + h->name + " before it is defined"));
}

// Nodes a pass writes for a node take its provenance (module path and type, metadata), so the saved
// program keeps them in that node's module; the bare insert gives none.
TEST(GraphIrTest, AnInsertionScopeCopiesProvenance) {
  Mlp m;
  ASSERT_EQ(m.fc2->module_path, "fc2");
  g::Value* h = m.gelu->outputs[0];
  g::Node* scoped = g::InsertionScope(m.program.graph, m.fc2).insert("aten::neg", {g::Arg::tensor(h)}, "scoped");
  EXPECT_EQ(scoped->module_path, "fc2");
  EXPECT_EQ(scoped->module_type, m.fc2->module_type);
  EXPECT_EQ(scoped->metadata, m.fc2->metadata);
  EXPECT_EQ(m.program.graph.nodes()[2], scoped);  // before fc2
  g::Node* bare = m.program.graph.insert(m.fc2, "aten::neg", {g::Arg::tensor(h)}, "bare");
  EXPECT_EQ(bare->module_path, "");
  EXPECT_TRUE(bare->metadata.empty());
}

TEST(GraphIrTest, EditInsertSubgraph) {
  Mlp m;
  // sub(t) = exp(neg(t)), inserted between gelu and fc2.
  g::Graph sub;
  g::Value* t = sub.add_input("t");
  g::Node* neg = sub.insert(nullptr, "aten::neg", {g::Arg::tensor(t)}, "neg");
  g::Node* exp = sub.insert(nullptr, "aten::exp", {g::Arg::tensor(neg->outputs[0])}, "exp");
  sub.add_output(g::Arg::tensor(exp->outputs[0]));
  g::Value* h = m.gelu->outputs[0];
  const auto out = m.program.graph.insert_subgraph(m.fc2, sub, {h});
  ASSERT_EQ(out.size(), 1u);
  m.program.graph.set_arg(m.fc2, 0, g::Arg::tensor(out[0]));  // fc2 now reads the subgraph's result
  ASSERT_EQ(m.program.graph.users(h).size(), 1u);
  EXPECT_EQ(m.program.graph.users(h)[0]->op_name(), "aten::neg");
  EXPECT_EQ(m.program.graph.users(out[0]), std::vector<g::Node*>{m.fc2});
  EXPECT_EQ(m.program.graph.verify(), "");
  EXPECT_EQ(m.program.graph.size(), 5u);
  EXPECT_TRUE(tensors_close(m.run(), m.fc2_of(m.hidden().neg().exp())));
  EXPECT_THAT(m.program.graph.str(), HasSubstr("aten::exp(%neg)"));
}

// What transforms find is kept beside the graph, in Annotations keyed by ids: a value's placements and
// a node's note show in the program's text, and a node erased takes its note with it (its id is never
// given to a later node, even one the allocator puts at the same address).
TEST(GraphIrTest, AnnotationsStayWithTheirValuesAndNodes) {
  Mlp m;
  g::Value* h = m.gelu->outputs[0];
  m.program.annotations.set_placements(*h, Placements{Shard(1)});
  g::Node* doubled = m.program.graph.insert_after(m.gelu, "aten::mul.Tensor", {g::Arg::tensor(h), g::Arg{g::Arg::Kind::Number, 2.0}},
                                                  "doubled");
  doubled->outputs[0]->meta = h->meta;
  m.program.annotations.set_note(*doubled, "inserted by the test");
  m.program.annotations.set_bytes_per_rank(*doubled, 64);
  EXPECT_THAT(m.program.str(), HasSubstr("S(1)"));
  EXPECT_THAT(m.program.str(), HasSubstr("# inserted by the test"));
  EXPECT_THAT(m.program.graph.str(), ::testing::Not(HasSubstr("inserted by the test")));  // the bare IR

  const uint64_t erased_id = doubled->id;
  m.program.graph.erase(doubled);
  g::Node* again = m.program.graph.insert_after(m.gelu, "aten::neg", {g::Arg::tensor(h)}, "again");
  EXPECT_NE(again->id, erased_id);
  EXPECT_EQ(m.program.annotations.note(*again), "");
  EXPECT_EQ(m.program.annotations.bytes_per_rank(*again), 0);
  EXPECT_EQ(m.program.annotations.placements(*again->outputs[0]), nullptr);
  EXPECT_THAT(error_of([&] { m.program.annotations.placements_of(*again->outputs[0]); }), HasSubstr("%again has no placements yet"));
  m.program.annotations.append_note(*again, "first");
  m.program.annotations.append_note(*again, "second");
  EXPECT_EQ(m.program.annotations.note(*again), "first; second");
}

}  // namespace
}  // namespace dtensor::testing
