// Every strategy a rule offers is checked, not only the one propagation picks: for each, the inputs
// are laid out as it asks (Partial ones holding random per-rank contributions), the op (or the rule's
// local kernel) runs on the local shards with the rule's local arguments, and the outputs, assembled
// under the strategy's output placements, must equal the op on the full tensors on one device.
//
// This is how the rules of composite ops are tested: linear, matmul, layer_norm, softmax.int, reshape
// and scaled_dot_product_attention decompose before eager dispatch sees them, so the op-db cannot
// reach them, but exported graphs keep them whole and the graph passes rely on these rules. The
// attention kernels' rules (eager too) are checked here as well, uneven heads and queries included.

#include <ATen/ATen.h>

#include "../../src/sharding/propagation.h"
#include "../../src/sharding/registry.h"
#include "dtensor/dtensor.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

c10::OperatorHandle op_named(const std::string& qualified) {
  const auto dot = qualified.find('.', qualified.find("::"));
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      qualified.substr(0, dot).c_str(), dot == std::string::npos ? "" : qualified.substr(dot + 1).c_str());
}

at::Tensor meta_of(const at::Tensor& t) { return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)); }

std::vector<at::Tensor> returned_tensors(const torch::jit::Stack& stack) {
  std::vector<at::Tensor> out;
  for (const auto& v : stack) out.push_back(v.toTensor());
  return out;
}

// Checks every strategy the rule of `op` offers when its tensor arguments are placed as `current`
// (one Placements per tensor argument, in order; the current layout changes what mesh rules offer).
// Returns how many strategies were checked.
size_t check_every_strategy(const std::string& op, const std::vector<c10::IValue>& args, const MeshPtr& mesh,
                            const std::vector<Placements>& current = {}, double rtol = 1e-5, double atol = 1e-6) {
  const c10::OperatorHandle handle = op_named(op);
  torch::jit::Stack stack(args.begin(), args.end());
  handle.callBoxed(stack);
  const std::vector<at::Tensor> expected = returned_tensors(stack);

  std::vector<c10::IValue> metas;
  std::vector<TensorInput> inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].isTensor()) {
      metas.push_back(args[i]);
      continue;
    }
    const at::Tensor& t = args[i].toTensor();
    metas.emplace_back(meta_of(t));
    const Placements placements = current.empty() ? Placements(mesh->ndim(), Replicate()) : current.at(inputs.size());
    inputs.push_back({i, -1, std::make_shared<const DTensorSpec>(DTensorSpec{mesh, placements, TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}})});
  }
  const auto decisions = detail::every_decision(handle, metas, inputs, mesh);
  uint64_t seed = 0;
  for (const OutputSharding& d : decisions) {
    SCOPED_TRACE(op + " under strategy " + d.chosen.str());
    torch::jit::Stack local(args.begin(), args.end());
    for (size_t k = 0; k < inputs.size(); ++k)
      local[inputs[k].arg] = to_local(make_dtensor_holding(args[inputs[k].arg].toTensor(), mesh, d.chosen.inputs[k], ++seed));
    for (const auto& [index, value] : d.local_args) local[index] = value;
    if (d.local_kernel) d.local_kernel(handle, local);
    else handle.callBoxed(local);
    const std::vector<at::Tensor> results = returned_tensors(local);
    EXPECT_EQ(results.size(), expected.size());
    for (size_t k = 0; k < results.size() && k < expected.size(); ++k) {
      const at::Tensor whole = full_tensor(from_local(
          results[k].contiguous(), mesh, d.chosen.outputs[k],
          {.run_check = false, .shape = expected[k].sizes().vec(), .stride = expected[k].contiguous().strides().vec()}));
      EXPECT_TRUE(tensors_close(whole, expected[k], rtol, atol)) << "output " << k;
    }
  }
  return decisions.size();
}

at::Tensor values(const Shape& shape, uint64_t seed) { return test_tensor(shape, at::kFloat, seed); }
// Softmax-friendly values: small, so exp() neither overflows nor flattens the differences.
at::Tensor small(const Shape& shape, uint64_t seed) { return values(shape, seed) / 8; }

std::vector<MeshPtr> meshes() { return {mesh({4}), mesh({2, 2})}; }

// The number of strategies checked pins each rule, so a lost strategy is noticed.
TEST_F(DistTest, EveryLinearStrategy) {
  const at::Tensor x = values({3, 5, 7}, 1), w = values({6, 7}, 2), b = values({6}, 3);
  for (const auto& m : meshes()) {
    // R, S(0), S(1) of x, S(last) of the output, the contracted dim, Partial x and Partial weight (sum,
    // avg each): 9 per mesh dim.
    const size_t n = check_every_strategy("aten::linear", {x, w, b}, m);
    EXPECT_EQ(n, m->ndim() == 1 ? 9u : 81u);
    check_every_strategy("aten::linear", {x, w, c10::IValue()}, m);
    check_every_strategy("aten::linear", {values({7}, 4), w, b}, m);
  }
}

TEST_F(DistTest, EveryMatmulStrategy) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 5, 7}, {7, 6}},          {{2, 1, 5, 7}, {3, 7, 6}},   {{7}, {7}},
      {{5, 7}, {7}},                {{7}, {3, 7, 6}},            {{2, 5, 6, 4}, {2, 5, 4, 6}}};
  for (const auto& m : meshes())
    for (const auto& [a, b] : cases) {
      SCOPED_TRACE(shape_str(a) + " @ " + shape_str(b));
      check_every_strategy("aten::matmul", {values(a, 1), values(b, 2)}, m);
    }
  // The attention product keeps batch and heads sharded: R, both batch dims, rows, columns, contracted,
  // and Partial on either side (sum, avg).
  EXPECT_EQ(check_every_strategy("aten::matmul", {values({2, 5, 6, 4}, 1), values({2, 5, 4, 6}, 2)}, mesh({4})), 10u);
}

TEST_F(DistTest, EveryLayerNormAndSoftmaxStrategy) {
  const at::Tensor x = values({3, 5, 6}, 1), w = values({6}, 2), b = values({6}, 3);
  for (const auto& m : meshes()) {
    check_every_strategy("aten::layer_norm", {x, std::vector<int64_t>{6}, w, b, 1e-5, false}, m);
    check_every_strategy("aten::layer_norm", {x, std::vector<int64_t>{5, 6}, values({5, 6}, 4), c10::IValue(), 1e-5, false}, m);
    check_every_strategy("aten::softmax.int", {small({3, 5, 6}, 5), int64_t{-1}, c10::IValue()}, m);
    check_every_strategy("aten::softmax.int", {small({3, 5, 6}, 5), int64_t{1}, c10::IValue(at::kDouble)}, m);
  }
}

// reshape's rule keeps a sharded dim where the shards line up with the new shape, so it is checked
// from every sharded layout of its input.
TEST_F(DistTest, EveryReshapeStrategy) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 5, 8}, {3, 5, 2, 4}}, {{3, 5, 2, 4}, {3, 5, 8}}, {{5, 6}, {30}}, {{3, 5, 8}, {-1, 8}}, {{8, 4}, {2, 16}}};
  for (const auto& [from, to] : cases)
    for (int64_t d = -1; d < static_cast<int64_t>(from.size()); ++d)
      for (const auto& m : meshes()) {
        SCOPED_TRACE(shape_str(from) + " -> " + shape_str(to));
        Placements current(m->ndim(), Replicate());
        if (d >= 0) current.back() = Shard(d);
        check_every_strategy("aten::reshape", {values(from, 1), to}, m, {current});
      }
}

TEST_F(DistTest, EveryAttentionStrategy) {
  // 5 heads and 6 queries over 4 ranks: uneven, one rank without heads.
  const at::Tensor q = small({2, 5, 6, 4}, 1), k = small({2, 5, 7, 4}, 2), v = small({2, 5, 7, 4}, 3);
  const at::Tensor mask = small({6, 7}, 4), causal_k = small({2, 5, 6, 4}, 5), causal_v = small({2, 5, 6, 4}, 6);
  const c10::IValue none;
  for (const auto& m : meshes()) {
    // R, batch, heads, queries.
    EXPECT_EQ(check_every_strategy("aten::scaled_dot_product_attention", {q, k, v, mask, 0.0, false, none, false}, m),
              m->ndim() == 1 ? 4u : 16u);
    // Causal: queries stay whole.
    EXPECT_EQ(check_every_strategy("aten::scaled_dot_product_attention", {q, causal_k, causal_v, none, 0.0, true, 0.3, false}, m),
              m->ndim() == 1 ? 3u : 9u);
    check_every_strategy("aten::_scaled_dot_product_flash_attention_for_cpu", {q, k, v, 0.0, false, mask, none}, m);
    check_every_strategy("aten::_scaled_dot_product_flash_attention_for_cpu", {q, causal_k, causal_v, 0.0, true, none, none}, m);
  }
  // The backward kernel, on the forward's own outputs: with queries sharded, key and value gradients
  // are Partial sums.
  auto fwd = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, mask);
  const at::Tensor grad = small({2, 5, 6, 4}, 7);
  for (const auto& m : meshes())
    check_every_strategy("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                         {grad, q, k, v, std::get<0>(fwd), std::get<1>(fwd), 0.0, false, mask, none}, m, {}, 1e-4, 1e-5);
}

}  // namespace
}  // namespace dtensor::testing
