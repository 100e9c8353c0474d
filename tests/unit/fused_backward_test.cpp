// Folding a joint graph's decomposed backward into ATen's fused kernels (src/graph/fused_backward.h):
// what folds, and that the folded program computes the same loss and gradients as the decomposed one
// (which the graph interpreter tests hold to PyTorch's own).

#include <ATen/ATen.h>

#include <gmock/gmock.h>

#include "../../src/graph/fused_backward.h"
#include "../support/tensor_assertions.h"
#include "goldens.h"
#include "../support/test_models.h"
#include "dtensor/graph/program.h"

namespace dtensor::testing {
namespace {

namespace g = dtensor::graph;

int count_op(const g::Program& program, const std::string& op) {
  int n = 0;
  for (const g::Node* node : program.graph.nodes()) n += node->op && node->op_name() == op;
  return n;
}

TEST(FusedBackwardTest, GptJointBackwardFoldsAndComputesTheSame) {
  g::Program decomposed = g::load_program(graph_model("gpt_joint.pt2"));
  g::Program folded = g::load_program(graph_model("gpt_joint.pt2"));
  const size_t nodes_before = folded.graph.size();
  const auto counts = g::detail::fold_decomposed_backward(folded.graph);
  // Two blocks of (ln1, attention softmax, ln2, MLP GELU), and the final layer norm.
  EXPECT_EQ(counts.layer_norm, 5);
  EXPECT_EQ(counts.softmax, 2);
  EXPECT_EQ(counts.gelu, 2);
  EXPECT_EQ(count_op(folded, "aten::native_layer_norm_backward"), 5);
  EXPECT_EQ(count_op(folded, "aten::_softmax_backward_data"), 2);
  EXPECT_EQ(count_op(folded, "aten::gelu_backward"), 2);
  EXPECT_EQ(count_op(folded, "aten::erf"), 0);  // only the GELU backwards used it
  EXPECT_EQ(folded.graph.verify(), "");
  EXPECT_LE(folded.graph.size() + 90, nodes_before) << nodes_before << " nodes before, " << folded.graph.size() << " after";
  // The whole folded program, to read as a diff when the pass changes (the GPT's export by torch 2.15).
  EXPECT_TRUE(matches_golden("fold_backward/gpt_joint.txt", folded.str()));
  // PyTorch reads it (scripts/check_saved_programs.py loads what the unit tests save): the layer
  // norms' fused node has three outputs, saved beside its getitems.
  g::save_program(folded, graph_saved("gpt_joint_folded.pt2"));
  // Nothing left to fold.
  const auto again = g::detail::fold_decomposed_backward(folded.graph);
  EXPECT_EQ(again.layer_norm + again.softmax + again.gelu, 0);

  const auto io = tensor_map("gpt_joint_io");
  const std::vector<c10::IValue> inputs = {io.at("input0"), io.at("input1")};
  const auto expected = g::run(decomposed, inputs), got = g::run(folded, inputs);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(tensors_close(got[i].toTensor(), expected[i].toTensor(), 1e-5, 1e-6)) << "output " << i;
}

// A form that differs from the decomposition's (here the layer norm's N is not its normalized size)
// is left as it is.
TEST(FusedBackwardTest, FormsThatDifferAreLeftAlone) {
  g::Program program = g::load_program(graph_model("gpt_joint.pt2"));
  for (g::Node* node : program.graph.nodes())
    if (node->op && node->op_name() == "aten::div.Tensor" && node->args()[1].kind == g::Arg::Kind::Number)
      program.graph.set_arg(node, 1, g::Arg{g::Arg::Kind::Number, 127.0});
  const auto counts = g::detail::fold_decomposed_backward(program.graph);
  EXPECT_EQ(counts.layer_norm, 0);
  EXPECT_EQ(counts.softmax, 2);
  EXPECT_EQ(counts.gelu, 2);
}

}  // namespace
}  // namespace dtensor::testing
