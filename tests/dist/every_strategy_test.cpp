// Every strategy a rule offers is checked, not only the one propagation picks: for each, the inputs
// are laid out as it asks (Partial ones holding random per-rank contributions), the op (or the rule's
// local kernel) runs on the local shards with the rule's local arguments, and the outputs, assembled
// under the strategy's output placements, must equal the op on the full tensors on one device.
//
// This is how the rules of composite ops are tested: linear, matmul, layer_norm, softmax.int, reshape,
// contiguous, to and scaled_dot_product_attention decompose before eager dispatch sees them, so the op-db cannot
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
  for (const auto& v : stack) {
    if (!v.isTensorList()) {
      out.push_back(v.toTensor());
      continue;
    }
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);  // split's pieces
  }
  return out;
}

// Checks every strategy the rule of `op` offers when its tensor arguments are placed as `current`
// (one Placements per tensor argument, in order; the current layout changes what mesh rules offer).
// Returns the strategies checked.
std::vector<OutputSharding> check_every_strategy(const std::string& op, const std::vector<c10::IValue>& args, const MeshPtr& mesh,
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
  return decisions;
}

// Whether one of `strategies` takes its first input as it is.
bool keeps_input(const std::vector<OutputSharding>& strategies, const Placements& current) {
  return std::any_of(strategies.begin(), strategies.end(), [&](const OutputSharding& d) { return d.chosen.inputs.at(0) == current; });
}

at::Tensor values(const Shape& shape, uint64_t seed) { return test_tensor(shape, at::kFloat, seed); }
// Softmax-friendly values: small, so exp() neither overflows nor flattens the differences.
at::Tensor small(const Shape& shape, uint64_t seed) { return values(shape, seed) / 8; }

// Strategies are per mesh dim: a rule offering n on a 1-d mesh offers n^2 on the 2x2 one.
size_t per_mesh(const MeshPtr& m, size_t n) { return m->ndim() == 1 ? n : n * n; }

class StrategyTest : public DistTest {};

// The number of strategies checked pins each rule, so a lost strategy is noticed.
TEST_F(StrategyTest, EveryLinearStrategy) {
  const at::Tensor x = values({3, 5, 7}, 1), w = values({6, 7}, 2), b = values({6}, 3);
  for (const auto& m : meshes()) {
    // R, S(0), S(1) of x, S(last) of the output, the contracted dim, Partial x and Partial weight (sum,
    // avg each): 9 per mesh dim.
    EXPECT_EQ(check_every_strategy("aten::linear", {x, w, b}, m).size(), per_mesh(m, 9));
    check_every_strategy("aten::linear", {x, w, c10::IValue()}, m);
    check_every_strategy("aten::linear", {values({7}, 4), w, b}, m);
  }
}

TEST_F(StrategyTest, EveryMatmulStrategy) {
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
  EXPECT_EQ(check_every_strategy("aten::matmul", {values({2, 5, 6, 4}, 1), values({2, 5, 4, 6}, 2)}, mesh({4})).size(), 10u);
}

TEST_F(StrategyTest, EveryLayerNormAndSoftmaxStrategy) {
  const at::Tensor x = values({3, 5, 6}, 1), w = values({6}, 2), b = values({6}, 3);
  for (const auto& m : meshes()) {
    // The input replicated or sharded on any dim that is not normalized (weight and bias replicated).
    EXPECT_EQ(check_every_strategy("aten::layer_norm", {x, std::vector<int64_t>{6}, w, b, 1e-5, false}, m).size(), per_mesh(m, 3));
    EXPECT_EQ(check_every_strategy("aten::layer_norm", {x, std::vector<int64_t>{5, 6}, values({5, 6}, 4), c10::IValue(), 1e-5, false}, m).size(),
              per_mesh(m, 2));
    // Softmax: replicated, or sharded on either dim it does not reduce.
    EXPECT_EQ(check_every_strategy("aten::softmax.int", {small({3, 5, 6}, 5), int64_t{-1}, c10::IValue()}, m).size(), per_mesh(m, 3));
    EXPECT_EQ(check_every_strategy("aten::softmax.int", {small({3, 5, 6}, 5), int64_t{1}, c10::IValue(at::kDouble)}, m).size(), per_mesh(m, 3));
  }
}

// reshape's rule keeps a sharded dim where the shards line up with the new shape, so it is checked
// from every sharded layout of its input (sharded on the last mesh dim: 4 ranks on the 1-d mesh, 2 on
// the 2x2 one). What it must offer, case by case:
//  - a dim the reshape leaves alone stays sharded (1 strategy, keeping the input);
//  - a dim split or merged stays sharded when every shard is whole rows of an output dim, which
//    depends on the shard count (1 strategy keeping it), else only Replicate (1 strategy);
//  - an inner dim of a merge becomes a StridedShard of the merged dim, or Replicate (2 strategies).
TEST_F(StrategyTest, EveryReshapeStrategy) {
  struct Case {
    Shape from, to;
    int64_t dim;        // sharded input dim, -1: replicated
    bool kept_on_4, kept_on_2;  // a strategy keeps the input as it is
    size_t strategies;
  };
  const std::vector<Case> cases = {
      {{3, 5, 8}, {3, 5, 2, 4}, -1, true, true, 1},   {{3, 5, 8}, {3, 5, 2, 4}, 0, true, true, 1},
      {{3, 5, 8}, {3, 5, 2, 4}, 1, true, true, 1},    {{3, 5, 8}, {3, 5, 2, 4}, 2, false, true, 1},  // 8 = 2 x 4: 4 ranks split the 2
      {{3, 5, 2, 4}, {3, 5, 8}, -1, true, true, 1},   {{3, 5, 2, 4}, {3, 5, 8}, 0, true, true, 1},
      {{3, 5, 2, 4}, {3, 5, 8}, 1, true, true, 1},    {{3, 5, 2, 4}, {3, 5, 8}, 2, false, true, 1},
      {{3, 5, 2, 4}, {3, 5, 8}, 3, true, true, 2},                                                   // inner: strided
      {{5, 6}, {30}, -1, true, true, 1},              {{5, 6}, {30}, 0, false, false, 1},            // 5 rows: uneven
      {{5, 6}, {30}, 1, true, true, 2},
      {{3, 5, 8}, {-1, 8}, -1, true, true, 1},        {{3, 5, 8}, {-1, 8}, 0, false, false, 1},
      {{3, 5, 8}, {-1, 8}, 1, true, true, 2},         {{3, 5, 8}, {-1, 8}, 2, true, true, 1},
      {{8, 4}, {2, 16}, -1, true, true, 1},           {{8, 4}, {2, 16}, 0, false, true, 1},          // 2 ranks: a row each
      {{8, 4}, {2, 16}, 1, false, false, 1},
  };
  for (const Case& c : cases)
    for (const auto& m : meshes()) {
      SCOPED_TRACE(shape_str(c.from) + " -> " + shape_str(c.to) + ", input dim " + std::to_string(c.dim) + " sharded");
      Placements current(m->ndim(), Replicate());
      if (c.dim >= 0) current.back() = Shard(c.dim);
      const auto strategies = check_every_strategy("aten::reshape", {values(c.from, 1), c.to}, m, {current});
      EXPECT_EQ(strategies.size(), c.strategies);
      EXPECT_EQ(keeps_input(strategies, current), m->ndim() == 1 ? c.kept_on_4 : c.kept_on_2);
    }
}

// contiguous and to(dtype), which training-IR graphs keep whole (Hugging Face attention and norms), on
// an uneven transposed tensor: Replicate, a shard of each dim, and the Partials each passes through.
TEST_F(StrategyTest, EveryContiguousAndCastStrategy) {
  const at::Tensor x = small({5, 3, 6}, 1).transpose(0, 2);
  const c10::IValue none;
  for (const auto& m : meshes()) {
    // contiguous passes Partial sums and averages on as clone does; a cast to another dtype no Partial.
    EXPECT_EQ(check_every_strategy("aten::contiguous", {x, c10::MemoryFormat::Contiguous}, m).size(), per_mesh(m, 6));
    EXPECT_EQ(check_every_strategy("aten::to.dtype", {x, at::kDouble, false, false, none}, m).size(), per_mesh(m, 4));
    EXPECT_EQ(check_every_strategy("aten::to.dtype_layout", {x, at::kDouble, none, none, none, false, false, none}, m).size(),
              per_mesh(m, 4));
    EXPECT_EQ(check_every_strategy("aten::to.device", {x, at::Device(at::kCPU), at::kDouble, false, false, none}, m).size(),
              per_mesh(m, 4));
  }
}

// A packed layer (q, k and v fused, as GPT-2's c_attn): its product with the packed weight comes out
// StridedShard where the weight is (each rank holds its piece of every block); split into its three
// blocks (split_with_sizes, split and chunk) each block is a Shard where it is; the three joined again (cat,
// as the backward does) make the StridedShard. Uneven pieces (10 over 4 ranks), 1-d and 2x2 meshes.
TEST_F(StrategyTest, PackedBlocksSplitAndJoinInPlace) {
  const at::Tensor x = small({2, 3, 30}, 1);
  const std::vector<at::Tensor> blocks = x.split(10, 2);
  for (const auto& m : meshes()) {
    // On 2x2 the packed dim is sharded along the second mesh dim (a StridedShard's dim is sharded once).
    Placements packed(m->ndim(), Replicate()), block(m->ndim(), Replicate());
    packed.back() = StridedShard(2, 3);
    block.back() = Shard(2);
    auto has = [](const std::vector<OutputSharding>& all, const Placements& in, const Placements& out) {
      return std::any_of(all.begin(), all.end(),
                         [&](const OutputSharding& d) { return d.chosen.inputs[0] == in && d.chosen.outputs[0] == out; });
    };
    const std::vector<int64_t> sizes = {10, 10, 10};
    EXPECT_TRUE(has(check_every_strategy("aten::split_with_sizes", {x, sizes, int64_t{2}}, m, {packed}), packed, block));
    EXPECT_TRUE(has(check_every_strategy("aten::split.Tensor", {x, int64_t{10}, int64_t{2}}, m, {packed}), packed, block));
    EXPECT_TRUE(has(check_every_strategy("aten::chunk", {x, int64_t{3}, int64_t{2}}, m, {packed}), packed, block));
    // cat takes a tensor list, which check_every_strategy does not lay out: through eager dispatch,
    // which picks the strategy that moves nothing.
    std::vector<at::Tensor> pieces;
    for (const at::Tensor& b : blocks) pieces.push_back(distribute_tensor(b, m, block));
    const at::Tensor joined = at::cat(pieces, 2);
    EXPECT_EQ(placements_of(joined), packed);
    EXPECT_TRUE(at::equal(full_tensor(joined), x));
    // The product (GPT-2's Conv1D: addmm(bias, x, weight [in, out])).
    const at::Tensor bias = small({30}, 3), in = small({6, 4}, 4), weight = small({4, 30}, 5);
    Placements packed_bias(m->ndim(), Replicate()), packed_weight(m->ndim(), Replicate());
    packed_bias.back() = StridedShard(0, 3);
    packed_weight.back() = StridedShard(1, 3);
    const Placements& packed_out = packed_weight;
    const auto products = check_every_strategy("aten::addmm", {bias, in, weight, 1, 1}, m,
                                               {packed_bias, Placements(m->ndim(), Replicate()), packed_weight});
    EXPECT_TRUE(std::any_of(products.begin(), products.end(), [&](const OutputSharding& d) {
      return d.chosen.inputs[2] == packed_weight && d.chosen.outputs[0] == packed_out;
    }));
  }
}

TEST_F(StrategyTest, EveryAttentionStrategy) {
  // 5 heads and 6 queries over 4 ranks: uneven, one rank without heads.
  const at::Tensor q = small({2, 5, 6, 4}, 1), k = small({2, 5, 7, 4}, 2), v = small({2, 5, 7, 4}, 3);
  const at::Tensor mask = small({6, 7}, 4), causal_k = small({2, 5, 6, 4}, 5), causal_v = small({2, 5, 6, 4}, 6);
  const c10::IValue none;
  for (const auto& m : meshes()) {
    // R, batch, heads, queries.
    EXPECT_EQ(check_every_strategy("aten::scaled_dot_product_attention", {q, k, v, mask, 0.0, false, none, false}, m).size(), per_mesh(m, 4));
    // Causal: queries stay whole.
    EXPECT_EQ(check_every_strategy("aten::scaled_dot_product_attention", {q, causal_k, causal_v, none, 0.0, true, 0.3, false}, m).size(),
              per_mesh(m, 3));
    // The CPU flash kernel (its logsumexp sharded like the output): the same strategies.
    EXPECT_EQ(check_every_strategy("aten::_scaled_dot_product_flash_attention_for_cpu", {q, k, v, 0.0, false, mask, none}, m).size(),
              per_mesh(m, 4));
    // Without a mask, over one sequence: the ring too (keys and values sharded along the sequence),
    // but not on both dims of a 2-d mesh.
    const size_t ring_on_both = m->ndim() == 2 ? 1 : 0;
    EXPECT_EQ(check_every_strategy("aten::_scaled_dot_product_flash_attention_for_cpu", {q, causal_k, causal_v, 0.0, true, none, none}, m).size(),
              per_mesh(m, 4) - ring_on_both);
  }
  // The backward kernel, on the forward's own outputs: R, batch, heads, queries (key and value
  // gradients then Partial sums), and the two Partial incoming gradients (sum, avg) that pass through.
  auto fwd = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, mask);
  const at::Tensor grad = small({2, 5, 6, 4}, 7);
  for (const auto& m : meshes())
    EXPECT_EQ(check_every_strategy("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                                   {grad, q, k, v, std::get<0>(fwd), std::get<1>(fwd), 0.0, false, mask, none}, m, {}, 1e-4, 1e-5).size(),
              per_mesh(m, 6));
  // Its ring too, without a mask over one sequence; on a 2-d mesh less the combinations the ring
  // cannot run (on both dims, or with the queries' sequence sharded on the other dim as well).
  auto causal_fwd = at::_scaled_dot_product_flash_attention_for_cpu(q, causal_k, causal_v, 0.0, false);
  for (const auto& m : meshes())
    EXPECT_EQ(check_every_strategy("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                                   {grad, q, causal_k, causal_v, std::get<0>(causal_fwd), std::get<1>(causal_fwd), 0.0, false, none, none}, m, {},
                                   1e-4, 1e-5).size(),
              m->ndim() == 2 ? 7 * 7 - 3 : 7);
}

// The CUDA fused kernels (flash, memory-efficient, cuDNN) cannot run here, so their strategies are
// checked through shapes: meta tensors in, every decision's placements and global output metas out.
// The output and logsumexp shapes are checked against the CPU kernel's on real tensors; tests/cuda
// runs the kernels themselves against one device.
std::vector<OutputSharding> decisions_on_metas(const std::string& op, const std::vector<c10::IValue>& args, const MeshPtr& mesh) {
  std::vector<TensorInput> inputs;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].isTensor() && args[i].toTensor().defined()) {
      const at::Tensor& t = args[i].toTensor();
      inputs.push_back({i, -1, std::make_shared<const DTensorSpec>(DTensorSpec{mesh, Placements(mesh->ndim(), Replicate()),
                                                                              TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}})});
    }
  return detail::every_decision(op_named(op), args, inputs, mesh);
}

TEST_F(StrategyTest, FusedAttentionStrategiesThroughShapes) {
  const auto meta = at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta);
  const at::Tensor q = at::empty({2, 4, 24, 64}, meta), k = at::empty({2, 4, 24, 64}, meta), v = at::empty({2, 4, 24, 64}, meta);
  const at::Tensor gqa_k = at::empty({2, 2, 24, 64}, meta);
  const c10::IValue none;
  const auto cpu = at::_scaled_dot_product_flash_attention_for_cpu(at::zeros({2, 4, 24, 64}), at::zeros({2, 4, 24, 64}), at::zeros({2, 4, 24, 64}));
  const Shape output_shape = std::get<0>(cpu).sizes().vec(), lse_shape = std::get<1>(cpu).sizes().vec();
  const Placements expected_each[] = {{Replicate()}, {Shard(0)}, {Shard(1)}};
  const auto m = mesh({4});
  struct Case {
    std::string op;
    std::vector<c10::IValue> args;
    size_t outputs;
  };
  const std::vector<Case> forwards = {
      {"aten::_scaled_dot_product_flash_attention", {q, k, v, 0.0, true, false, none}, 5},
      {"aten::_scaled_dot_product_efficient_attention", {q, k, v, none, true, 0.0, true, none}, 4},
      {"aten::_scaled_dot_product_cudnn_attention", {q, k, v, none, true, 0.0, true, false, none}, 4}};
  for (const Case& c : forwards) {
    SCOPED_TRACE(c.op);
    const auto decisions = decisions_on_metas(c.op, c.args, m);
    ASSERT_EQ(decisions.size(), 3u);  // R, batch, heads
    for (size_t i = 0; i < decisions.size(); ++i) {
      const OutputSharding& d = decisions[i];
      ASSERT_EQ(d.outputs.size(), c.outputs);
      EXPECT_EQ(d.chosen.inputs, std::vector<Placements>(3, expected_each[i]));
      EXPECT_EQ(d.chosen.outputs[0], expected_each[i]);
      EXPECT_EQ(d.chosen.outputs[1], expected_each[i]);
      for (size_t k = 2; k < c.outputs; ++k) EXPECT_EQ(d.chosen.outputs[k], Placements{Replicate()}) << "aux output " << k;
      EXPECT_EQ(d.outputs[0].meta.shape, output_shape);
      EXPECT_EQ(Shape(d.outputs[1].meta.shape.begin(), d.outputs[1].meta.shape.begin() + 2), Shape(lse_shape.begin(), lse_shape.begin() + 2));
    }
    // Grouped-query attention (2 key heads for 4 query heads): heads stay whole. Dropout: replicated.
    std::vector<c10::IValue> gqa = c.args;
    gqa[1] = gqa_k;
    gqa[2] = gqa_k;
    EXPECT_EQ(decisions_on_metas(c.op, gqa, m).size(), 2u);
    std::vector<c10::IValue> dropout = c.args;
    dropout[*op_named(c.op).schema().argumentIndexWithName("dropout_p")] = 0.1;
    EXPECT_EQ(decisions_on_metas(c.op, dropout, m).size(), 1u);
  }
  // The backward kernels: the three gradients sharded like q, k, v.
  const at::Tensor out = at::empty({2, 4, 24, 64}, meta), lse = at::empty({2, 4, 24}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  const at::Tensor seed = at::empty({2}, at::TensorOptions().dtype(at::kUInt64).device(at::kMeta));
  const at::Tensor offset = at::empty({}, at::TensorOptions().dtype(at::kUInt64).device(at::kMeta));
  const std::vector<Case> backwards = {
      {"aten::_scaled_dot_product_flash_attention_backward", {q, q, k, v, out, lse, none, none, 24, 24, 0.0, true, seed, offset, none}, 3},
      {"aten::_scaled_dot_product_efficient_attention_backward",
       {q, q, k, v, none, out, lse, offset, offset, 0.0, c10::List<bool>({true, true, true, false}), true, none}, 3},
      {"aten::_scaled_dot_product_cudnn_attention_backward",
       {q, q, k, v, out, lse, offset, offset, none, none, none, 24, 24, 0.0, true, none}, 3}};
  for (const Case& c : backwards) {
    SCOPED_TRACE(c.op);
    const auto decisions = decisions_on_metas(c.op, c.args, m);
    ASSERT_EQ(decisions.size(), 3u);
    for (size_t i = 0; i < decisions.size(); ++i) {
      ASSERT_EQ(decisions[i].outputs.size(), c.outputs);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(decisions[i].chosen.outputs[k], expected_each[i]);
        EXPECT_EQ(decisions[i].outputs[k].meta.shape, q.sizes().vec());
      }
    }
  }
}

// _fused_rms_norm (in graphs exported on CUDA; eager DTensors decompose it) shards like layer_norm:
// run on CPU, where it is a composite. Its backward has only a CUDA kernel: checked through shapes.
TEST_F(StrategyTest, FusedRmsNormStrategies) {
  const at::Tensor x = values({5, 3, 16}, 1), w = values({16}, 2);
  for (const auto& m : meshes())
    EXPECT_EQ(check_every_strategy("aten::_fused_rms_norm", {x, std::vector<int64_t>{16}, w, 1e-6}, m).size(), per_mesh(m, 3));
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor mx = at::empty({5, 3, 16}, meta), mw = at::empty({16}, meta), rstd = at::empty({5, 3, 1}, meta);
  const auto decisions = decisions_on_metas("aten::_fused_rms_norm_backward",
                                            {mx, mx, std::vector<int64_t>{16}, rstd, mw, c10::List<bool>({true, true})}, mesh({4}));
  ASSERT_EQ(decisions.size(), 5u);  // R, rows, the middle dim, and Partial(sum|avg) incoming gradients
  for (const OutputSharding& d : decisions) {
    ASSERT_EQ(d.outputs.size(), 2u);
    EXPECT_EQ(d.outputs[0].meta.shape, mx.sizes().vec());
    EXPECT_EQ(d.outputs[1].meta.shape, mw.sizes().vec());
  }
  EXPECT_EQ(decisions[1].chosen.outputs[0], Placements{Shard(0)});
  EXPECT_EQ(decisions[1].chosen.outputs[1], Placements{Partial()});  // the weight's gradient sums over the rows
  EXPECT_EQ(decisions[1].chosen.inputs[2], Placements{Shard(0)});    // rstd
  EXPECT_EQ(decisions[1].chosen.inputs[3], Placements{Replicate()});  // the weight
}

}  // namespace
}  // namespace dtensor::testing
