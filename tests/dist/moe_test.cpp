// The MoE layer (dtensor/moe.h) against an oracle written here on the whole tensors of one process
// (routing by hand, token by token, each expert's SwiGLU MLP as three matrix products): in one
// process, and under expert parallelism over the 1-d mesh of 4 and over a dim of the 2x2 mesh, on MPI
// and Gloo, with token counts that do not divide by the ranks. Routings where some experts (and so
// some ranks) receive no token and one expert receives all of them, top-1 and top-2, dropless and with
// a capacity that drops (the same assignments the oracle drops, group by group), the load-balancing
// loss, every gradient, and AdamW steps; bad input refused naming the layer and the mesh dim.

#include <ATen/ATen.h>

#include <chrono>
#include <torch/nn/functional.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "../support/test_models.h"
#include "dtensor/checkpoint.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/moe.h"
#include "dtensor/parallel.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHidden = 8, kIntermediate = 4;

enum class Skew { None, AllToExpertZero };

MoEOptions moe_options(int64_t experts, int64_t top_k, std::optional<double> capacity = std::nullopt,
                       RouterScores scores = RouterScores::SoftmaxThenTopK) {
  MoEOptions o;
  o.scores = scores;
  o.hidden = kHidden;
  o.intermediate = kIntermediate;
  o.experts = experts;
  o.top_k = top_k;
  o.normalize_top_k = top_k > 1;
  o.capacity_factor = capacity;
  return o;
}

struct Weights {
  at::Tensor gate, gate_up, down;  // whole, [E, H], [E, 2I, H], [E, H, I]
};

// Deterministic weights; with AllToExpertZero the gate scores expert 0 far above the rest for every
// token (the inputs' feature 0 is large and positive), so it receives every first choice.
Weights weights_for(int64_t experts, Skew skew) {
  at::manual_seed(7);
  Weights w{at::randn({experts, kHidden}, at::kDouble).mul(0.5), at::randn({experts, 2 * kIntermediate, kHidden}, at::kDouble).mul(0.3),
            at::randn({experts, kHidden, kIntermediate}, at::kDouble).mul(0.3)};
  if (skew == Skew::AllToExpertZero) w.gate.select(1, 0).zero_().select(0, 0).fill_(10.0);
  return w;
}

at::Tensor tokens_for(int64_t batch, int64_t sequence) {
  at::manual_seed(11);
  at::Tensor x = at::randn({batch, sequence, kHidden}, at::kDouble);
  x.select(2, 0).abs_().add_(3.0);
  return x;
}

// The oracle: one token group at a time (the tokens of one rank), each token's top-k by the softmax,
// GShard's capacity taken by hand (first choices first, in token order), each kept expert's MLP on
// the token alone. Returns the output [tokens, H] and the number of dropped assignments.
std::pair<at::Tensor, int64_t> oracle_group(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& gate_up,
                                            const at::Tensor& down, const MoEOptions& o) {
  const int64_t tokens = x.size(0), experts = gate.size(0);
  const at::Tensor logits = at::matmul(x, gate.t());
  at::Tensor top_values, top_index;
  if (o.scores == RouterScores::SoftmaxThenTopK) {
    std::tie(top_values, top_index) = at::topk(at::softmax(logits, -1), o.top_k, -1);
  } else {
    std::tie(top_values, top_index) = at::topk(logits, o.top_k, -1);
    top_values = at::softmax(top_values, -1);
  }
  const int64_t capacity = o.capacity_factor ? int64_t(std::ceil(*o.capacity_factor * tokens * o.top_k / double(experts))) : tokens * o.top_k;
  std::vector<int64_t> taken(static_cast<size_t>(experts), 0);
  std::vector<std::vector<bool>> kept(static_cast<size_t>(tokens), std::vector<bool>(static_cast<size_t>(o.top_k)));
  int64_t dropped = 0;
  for (int64_t choice = 0; choice < o.top_k; ++choice)
    for (int64_t t = 0; t < tokens; ++t) {
      auto& count = taken[static_cast<size_t>(top_index[t][choice].item<int64_t>())];
      kept[t][choice] = count < capacity;
      count += kept[t][choice] ? 1 : 0;
      dropped += kept[t][choice] ? 0 : 1;
    }
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < tokens; ++t) {
    at::Tensor row = at::zeros({kHidden}, x.options());
    const at::Tensor total = top_values[t].sum();
    for (int64_t choice = 0; choice < o.top_k; ++choice) {
      if (!kept[t][choice]) continue;
      const int64_t e = top_index[t][choice].item<int64_t>();
      const at::Tensor g = at::matmul(gate_up[e].narrow(0, 0, kIntermediate), x[t]);
      const at::Tensor u = at::matmul(gate_up[e].narrow(0, kIntermediate, kIntermediate), x[t]);
      const at::Tensor weight = o.normalize_top_k ? top_values[t][choice] / total : top_values[t][choice];
      row = row + weight * at::matmul(down[e], g * at::sigmoid(g) * u);
    }
    rows.push_back(row);
  }
  return {at::stack(rows), dropped};
}

struct OracleResult {
  at::Tensor output;                // [batch, sequence, H]
  std::vector<int64_t> dropped;     // per group
  std::vector<at::Tensor> grads;    // of x, gate, gate_up, down for the test's loss
};

// The test's loss: the output against fixed weights, plus the load-balancing loss times 0.1 (by default).
at::Tensor output_weights(const at::Tensor& output) {
  return at::arange(output.numel(), output.options()).reshape(output.sizes()).remainder(7).sub(3).mul(0.25);
}

OracleResult oracle(const at::Tensor& x, const Weights& w, const MoEOptions& o, int64_t groups, double aux_weight = 0.1) {
  std::vector<at::Tensor> leaves{x.clone().requires_grad_(), w.gate.clone().requires_grad_(), w.gate_up.clone().requires_grad_(),
                                 w.down.clone().requires_grad_()};
  OracleResult r;
  std::vector<at::Tensor> outputs;
  for (const at::Tensor& group : leaves[0].chunk(groups, 0)) {
    auto [out, dropped] = oracle_group(group.reshape({-1, kHidden}), leaves[1], leaves[2], leaves[3], o);
    outputs.push_back(out.reshape(group.sizes()));
    r.dropped.push_back(dropped);
  }
  r.output = at::cat(outputs);
  // transformers' load_balancing_loss_func on every token, written out.
  const at::Tensor probabilities = at::softmax(at::matmul(leaves[0].reshape({-1, kHidden}), leaves[1].t()), -1);
  const at::Tensor chosen = std::get<1>(at::topk(probabilities, o.top_k, -1));
  const at::Tensor share = at::zeros({o.experts}, x.options()).index_add(0, chosen.reshape(-1), at::ones({chosen.numel()}, x.options()));
  const double n = double(probabilities.size(0));
  const at::Tensor aux = (share / n * probabilities.sum(0) / n).sum() * o.experts;
  ((r.output * output_weights(r.output)).sum() + aux_weight * aux).backward();
  for (const at::Tensor& leaf : leaves) r.grads.push_back(leaf.grad());
  r.output = r.output.detach();
  return r;
}

MoE module_with(const Weights& w, const MoEOptions& o) {
  MoE moe(o);
  torch::NoGradGuard no_grad;
  moe->to(at::kDouble);
  moe->gate->weight.copy_(w.gate);
  moe->experts->gate_up_proj.copy_(w.gate_up);
  moe->experts->down_proj.copy_(w.down);
  return moe;
}

struct Case {
  std::string name;
  int64_t experts, top_k;
  Skew skew;
  std::optional<double> capacity;
  RouterScores scores = RouterScores::SoftmaxThenTopK;
};

const Case kCases[] = {
    {"top2", 8, 2, Skew::None, std::nullopt},
    {"top1", 4, 1, Skew::None, std::nullopt},
    {"top1 all to expert 0", 4, 1, Skew::AllToExpertZero, std::nullopt},
    {"top2 all first choices to expert 0", 8, 2, Skew::AllToExpertZero, std::nullopt},
    {"top2 capacity 1.0 drops", 8, 2, Skew::AllToExpertZero, 1.0},
    {"top1 capacity 1.5 drops", 4, 1, Skew::None, 1.5},
    {"top2 capacity 4.0 (room for every token)", 8, 2, Skew::None, 4.0},
    {"top2 softmax after top-k", 8, 2, Skew::None, std::nullopt, RouterScores::TopKThenSoftmax},
};

class MoELayerTest : public DistTest {};  // one process's layer, run on every rank alike

TEST_F(MoELayerTest, OneProcessMatchesTheOracle) {
  const at::Tensor x = tokens_for(3, 5);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const MoEOptions o = moe_options(c.experts, c.top_k, c.capacity, c.scores);
    const Weights w = weights_for(c.experts, c.skew);
    const OracleResult expected = oracle(x, w, o, 1);
    MoE moe = module_with(w, o);
    const at::Tensor input = x.clone().requires_grad_();
    const MoEOutput out = moe->forward_with_routing(input);
    EXPECT_EQ(out.routing.dropped, expected.dropped[0]);
    EXPECT_EQ(expected.dropped[0] > 0, c.name.find("drops") != std::string::npos);  // the cases test what they say
    if (c.skew == Skew::AllToExpertZero && !c.capacity) EXPECT_TRUE(out.routing.experts.select(-1, 0).eq(0).all().item<bool>());
    EXPECT_TRUE(tensors_close(out.output, expected.output, 1e-10, 1e-12));
    ((out.output * output_weights(out.output)).sum() + 0.1 * load_balancing_loss(out.routing.logits, c.top_k)).backward();
    EXPECT_TRUE(tensors_close(input.grad(), expected.grads[0], 1e-10, 1e-12));
    EXPECT_TRUE(tensors_close(moe->gate->weight.grad(), expected.grads[1], 1e-10, 1e-12));
    EXPECT_TRUE(tensors_close(moe->experts->gate_up_proj.grad(), expected.grads[2], 1e-10, 1e-12));
    EXPECT_TRUE(tensors_close(moe->experts->down_proj.grad(), expected.grads[3], 1e-10, 1e-12));
  }
}

TEST_F(MoELayerTest, FloatRunsTheGroupedKernelAndMatchesPerExpertProducts) {
  const MoEOptions o = moe_options(4, 2);
  const Weights w = weights_for(4, Skew::None);
  MoE moe = module_with(w, o);
  moe->to(at::kFloat);
  const at::Tensor x = tokens_for(2, 7).to(at::kFloat);
  const OracleResult expected = oracle(x.to(at::kDouble), w, o, 1);
  EXPECT_TRUE(tensors_close(moe->forward(x).to(at::kDouble), expected.output, 1e-5, 1e-5));
}

TEST_F(MoELayerTest, BadInputIsRefusedNamingTheLayer) {
  EXPECT_THAT(error_of([] { MoE moe(moe_options(4, 2, 0.0)); }), HasSubstr("gives every expert a capacity of 0"));
  EXPECT_THAT(error_of([] { MoE moe(moe_options(4, 5)); }), HasSubstr("top_k 5 must be in [1, experts = 4]"));
  MoEExperts experts(moe_options(4, 2));
  const at::Tensor hidden = at::ones({3, kHidden});
  const at::Tensor chosen = at::tensor({0, 1, 2, 9, 1, 1}, at::kLong).reshape({3, 2});
  EXPECT_THAT(error_of([&] { experts->forward(hidden, chosen, at::ones({3, 2})); }),
              HasSubstr("MoE layer 'experts': the router chose expert 9, outside [0, 4)"));
  EXPECT_THAT(error_of([&] { experts->forward(hidden, chosen.narrow(0, 0, 2), at::ones({2, 2})); }),
              HasSubstr("MoE layer 'experts': the experts take hidden states [tokens, hidden] with their routing [tokens, k]"));
}

class ExpertParallelTest : public DistTest {};

// The meshes and the dim experts spread over: the 1-d mesh of 4, and each dim of the 2x2 one.
std::vector<std::pair<MeshPtr, int64_t>> expert_meshes() {
  return {{mesh({4}), 0}, {mesh({2, 2}), 0}, {mesh({2, 2}), 1}};
}

TEST_F(ExpertParallelTest, TokensReachTheirExpertsAndGradientsMatchTheOracle) {
  const at::Tensor x = tokens_for(7, 3);  // 7 sequences: 2, 2, 2, 1 per rank over 4, 4 and 3 over 2
  for (const auto& [m, ep] : expert_meshes()) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(m->str() + " ep dim " + std::to_string(ep) + ": " + c.name);
      const MoEOptions o = moe_options(c.experts, c.top_k, c.capacity, c.scores);
      const Weights w = weights_for(c.experts, c.skew);
      const OracleResult expected = oracle(x, w, o, m->size(ep));
      MoE moe = module_with(w, o);
      expert_parallel(*moe, m, ep);
      distribute_module(*moe, m);  // the gate weight Replicate: its gradient summed over the token shards
      Placements tokens(static_cast<size_t>(m->ndim()), Replicate());
      tokens[static_cast<size_t>(ep)] = Shard(0);
      const at::Tensor input = distribute_tensor(x.clone().requires_grad_(), m, tokens);
      const MoEOutput out = moe->forward_with_routing(input);
      EXPECT_EQ(out.routing.dropped, expected.dropped[static_cast<size_t>(m->local_rank(ep))]);
      const at::Tensor whole = full_tensor(out.output);
      EXPECT_TRUE(tensors_close(whole, expected.output, 1e-10, 1e-12));
      ((whole * output_weights(whole)).sum() + 0.1 * load_balancing_loss(out.routing.logits, c.top_k)).backward();
      EXPECT_TRUE(tensors_close(full_tensor(input.grad()), expected.grads[0], 1e-10, 1e-12));
      EXPECT_TRUE(tensors_close(full_tensor(moe->gate->weight.grad()), expected.grads[1], 1e-10, 1e-12));
      EXPECT_TRUE(tensors_close(full_tensor(moe->experts->gate_up_proj.grad()), expected.grads[2], 1e-10, 1e-12));
      EXPECT_TRUE(tensors_close(full_tensor(moe->experts->down_proj.grad()), expected.grads[3], 1e-10, 1e-12));
    }
  }
}

// Each rank its own rows as plain tensors (EP inside data parallelism, as torchtitan runs it): every
// rank's output is the oracle's for its rows, and the gradients summed over the ranks are the oracle's.
TEST_F(ExpertParallelTest, PlainTokensOfEveryRankReachTheirExperts) {
  const at::Tensor x = tokens_for(7, 3);
  const int64_t me = world()->rank();
  const MeshPtr everyone = mesh({4});
  for (const auto& [m, ep] : expert_meshes()) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(m->str() + " ep dim " + std::to_string(ep) + ": " + c.name);
      const MoEOptions o = moe_options(c.experts, c.top_k, c.capacity, c.scores);
      const Weights w = weights_for(c.experts, c.skew);
      const OracleResult expected = oracle(x, w, o, 4);
      MoE moe = module_with(w, o);
      expert_parallel(*moe, m, ep);
      const at::Tensor mine = x.chunk(4, 0)[static_cast<size_t>(me)].clone().requires_grad_();
      const MoEOutput out = moe->forward_with_routing(mine);
      EXPECT_EQ(out.routing.dropped, expected.dropped[static_cast<size_t>(me)]);
      const at::Tensor rows = expected.output.chunk(4, 0)[static_cast<size_t>(me)];
      EXPECT_TRUE(tensors_close(out.output, rows, 1e-10, 1e-12));
      (out.output * output_weights(expected.output).chunk(4, 0)[static_cast<size_t>(me)]).sum().backward();
      const OracleResult without_aux = oracle(x, w, o, 4, /*aux_weight=*/0.0);
      EXPECT_TRUE(tensors_close(mine.grad(), without_aux.grads[0].chunk(4, 0)[static_cast<size_t>(me)], 1e-10, 1e-12));
      const at::Tensor gate_sum = full_tensor(from_local(moe->gate->weight.grad(), everyone, {Partial()}));
      EXPECT_TRUE(tensors_close(gate_sum, without_aux.grads[1], 1e-10, 1e-12));
      EXPECT_TRUE(tensors_close(full_tensor(moe->experts->gate_up_proj.grad()), without_aux.grads[2], 1e-10, 1e-12));
      EXPECT_TRUE(tensors_close(full_tensor(moe->experts->down_proj.grad()), without_aux.grads[3], 1e-10, 1e-12));
    }
  }
}

// In float the experts run as LibTorch's grouped matrix multiply (at::_grouped_mm): under EP=4, with a
// rank holding no tokens (3 sequences over 4 ranks), its outputs and gradients against the oracle.
TEST_F(ExpertParallelTest, FloatRunsTheGroupedKernelWithARankWithoutTokens) {
  const MoEOptions o = moe_options(8, 2);
  const Weights w = weights_for(8, Skew::None);
  const at::Tensor x = tokens_for(3, 5);
  const OracleResult expected = oracle(x, w, o, 1, /*aux_weight=*/0.0);
  MoE moe = module_with(w, o);
  moe->to(at::kFloat);
  expert_parallel(*moe, mesh({4}), 0);
  const int64_t me = world()->rank(), rows = me < 3 ? 1 : 0, from = std::min<int64_t>(me, 3);
  const at::Tensor mine = x.narrow(0, from, rows).to(at::kFloat).requires_grad_();
  const at::Tensor out = moe->forward(mine);
  ASSERT_EQ(out.size(0), rows);
  EXPECT_TRUE(tensors_close(out.to(at::kDouble), expected.output.narrow(0, from, rows), 1e-4, 1e-5));
  (out * output_weights(expected.output).narrow(0, from, rows).to(at::kFloat)).sum().backward();
  EXPECT_TRUE(tensors_close(mine.grad().to(at::kDouble), expected.grads[0].narrow(0, from, rows), 1e-4, 1e-5));
  EXPECT_TRUE(tensors_close(full_tensor(moe->experts->gate_up_proj.grad()).to(at::kDouble), expected.grads[2], 1e-4, 1e-5));
  EXPECT_TRUE(tensors_close(full_tensor(moe->experts->down_proj.grad()).to(at::kDouble), expected.grads[3], 1e-4, 1e-5));
}

// Five AdamW steps under EP=4 follow the same layer trained in one process (checked above against the
// oracle) on the same batches.
TEST_F(ExpertParallelTest, AdamWStepsFollowOneProcess) {
  const MoEOptions o = moe_options(8, 2);
  const Weights w = weights_for(8, Skew::None);
  const MeshPtr m = mesh({4});
  MoE single = module_with(w, o), parallel = module_with(w, o);
  expert_parallel(*parallel, m, 0);
  distribute_module(*parallel, m);
  torch::optim::AdamW single_opt(single->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW parallel_opt(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = tokens_for(6, 3).add(step);
    auto loss_of = [&](MoE& moe, const at::Tensor& input) {
      const MoEOutput out = moe->forward_with_routing(input);
      const at::Tensor whole = is_dtensor(out.output) ? full_tensor(out.output) : out.output;
      return (whole * output_weights(whole)).sum() + 0.1 * load_balancing_loss(out.routing.logits, o.top_k);
    };
    single_opt.zero_grad();
    parallel_opt.zero_grad();
    const at::Tensor expected = loss_of(single, x);
    const at::Tensor actual = loss_of(parallel, distribute_tensor(x, m, Placements{Shard(0)}));
    EXPECT_TRUE(tensors_close(actual, expected, 1e-10, 1e-12)) << "step " << step;
    expected.backward();
    actual.backward();
    single_opt.step();
    parallel_opt.step();
  }
  EXPECT_TRUE(tensors_close(full_tensor(parallel->experts->down_proj), single->experts->down_proj, 1e-9, 1e-12));
  EXPECT_TRUE(tensors_close(full_tensor(parallel->gate->weight), single->gate->weight, 1e-9, 1e-12));
}

// A block with a tensor-parallel MLP and a MoE: EP x TP puts the experts on the tp dim's ranks.
class TpThenMoEImpl : public torch::nn::Module {
 public:
  explicit TpThenMoEImpl(const MoEOptions& o)
      : up(register_module("up", torch::nn::Linear(kHidden, 4 * kHidden))),
        down(register_module("down", torch::nn::Linear(4 * kHidden, kHidden))),
        moe(register_module("moe", MoE(o))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = x + call(down, at::gelu(call(up, x)));
    return h + moe->forward(h);
  }
  torch::nn::Linear up, down;
  MoE moe;
};
TORCH_MODULE(TpThenMoE);

// EP x TP and DP on the 2x2 mesh ("dp", "tp"): the MLP column- then row-parallel over tp, the experts
// spread over the same tp ranks (the MLP's replicated output re-sharded on its tokens to route them),
// the batch over dp. Five AdamW steps follow one process.
TEST_F(ExpertParallelTest, ExpertsOnTheTensorParallelRanksTrainLikeOneProcess) {
  const MoEOptions o = moe_options(4, 2);
  const MeshPtr m = mesh({2, 2}, {}, {"dp", "tp"});
  torch::manual_seed(5);
  TpThenMoE single(o);
  single->to(at::kDouble);
  TpThenMoE parallel(o);
  parallel->to(at::kDouble);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < single->parameters().size(); ++i) parallel->parameters()[i].copy_(single->parameters()[i]);
  }
  parallelize_module(*parallel, m, {{"up", ColwiseParallel{.use_local_output = false}}, {"down", RowwiseParallel{.use_local_output = false}}},
                     {.tp_dim = "tp"});
  expert_parallel(*parallel->moe, m, 1);
  distribute_module(*parallel, m);
  torch::optim::AdamW single_opt(single->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW parallel_opt(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = tokens_for(5, 4).add(0.1 * step);  // 5 sequences: 3 and 2 over dp
    auto loss_of = [&](const at::Tensor& out) {
      const at::Tensor whole = is_dtensor(out) ? full_tensor(out) : out;
      return (whole * output_weights(whole)).sum();
    };
    single_opt.zero_grad();
    parallel_opt.zero_grad();
    const at::Tensor expected = loss_of(single->forward(x));
    const at::Tensor actual = loss_of(parallel->forward(distribute_tensor(x, m, Placements{Shard(0), Replicate()})));
    EXPECT_TRUE(tensors_close(actual, expected, 1e-10, 1e-12)) << "step " << step;
    expected.backward();
    actual.backward();
    single_opt.step();
    parallel_opt.step();
  }
  const auto trained = parallel->named_parameters();
  for (const auto& p : single->named_parameters())
    EXPECT_TRUE(tensors_close(full_tensor(trained[p.key()]), p.value(), 1e-7, 1e-8)) << p.key();
}

// transformers' Mixtral module paths (model.layers.N.mlp, the MoE block), without attention: what its
// expert-parallel plan names.
class MoELayerImpl : public torch::nn::Module {
 public:
  explicit MoELayerImpl(const MoEOptions& o) : mlp(register_module("mlp", MoE(o))) {}
  MoE mlp;
};
TORCH_MODULE(MoELayer);

class MixtralShapedImpl : public torch::nn::Module {
 public:
  explicit MixtralShapedImpl(const MoEOptions& o) : model(register_module("model", std::make_shared<torch::nn::Module>())) {
    layers = model->register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) layers->push_back(MoELayer(o));
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& layer : *layers) x = x + layer->as<MoELayerImpl>()->mlp->forward(x);
    return x;
  }
  std::shared_ptr<torch::nn::Module> model;
  torch::nn::ModuleList layers;
};
TORCH_MODULE(MixtralShaped);

// Mixtral's own expert-parallel plan, as transformers writes it (model.ep_plan, exported with the
// test models), applied by parallelize_module over EP=4: every layer's experts are spread, and each
// rank's tokens give what one process gives them, with the gradients it gives.
TEST_F(ExpertParallelTest, MixtralsOwnPlanSpreadsEveryLayersExperts) {
  const MoEOptions o = moe_options(4, 2);
  torch::manual_seed(3);
  MixtralShaped single(o), parallel(o);
  single->to(at::kDouble);
  parallel->to(at::kDouble);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < single->parameters().size(); ++i) parallel->parameters()[i].copy_(single->parameters()[i]);
  }
  const MeshPtr m = mesh({4});
  parallelize_module(*parallel, m, graph::hugging_face_ep_plan(graph_model_text("hf/mixtral_ep_plan.json"), "", "mixtral_ep_plan.json"));
  for (const auto& p : parallel->named_parameters())
    EXPECT_EQ(is_dtensor(p.value()), p.key().find(".experts.") != std::string::npos) << p.key();
  const at::Tensor x = tokens_for(8, 3);
  const int64_t me = world()->rank();
  const at::Tensor expected = single->forward(x);
  (expected * output_weights(expected)).sum().backward();
  const at::Tensor mine = x.chunk(4, 0)[static_cast<size_t>(me)];
  const at::Tensor out = parallel->forward(mine);
  EXPECT_TRUE(tensors_close(out, expected.chunk(4, 0)[static_cast<size_t>(me)], 1e-10, 1e-12));
  (out * output_weights(expected).chunk(4, 0)[static_cast<size_t>(me)]).sum().backward();
  const auto trained = parallel->named_parameters();
  for (const auto& p : single->named_parameters()) {
    const at::Tensor grad = trained[p.key()].grad();
    const at::Tensor whole = is_dtensor(grad) ? full_tensor(grad) : full_tensor(from_local(grad, m, {Partial()}));
    EXPECT_TRUE(tensors_close(whole, p.value().grad(), 1e-10, 1e-12)) << p.key();
  }
}

checkpoint::State state_of(torch::nn::Module& module) {
  checkpoint::State state;
  for (const auto& p : module.named_parameters()) state[p.key()] = p.value();
  return state;
}

// An EP=4 layer's checkpoint loads into EP=2 (a dim of the 2x2 mesh) and into one process bit for bit,
// and the loaded layers compute what the saved one does.
TEST_F(ExpertParallelTest, CheckpointsMoveAcrossExpertParallelDegrees) {
  const MoEOptions o = moe_options(8, 2);
  auto values_to_save = [&] {
    MoE moe = module_with(weights_for(8, Skew::None), o);
    torch::NoGradGuard no_grad;
    moe->experts->down_proj.mul_(1.5);  // not what a fresh layer holds
    return moe;
  };
  MoE saved = values_to_save(), whole = values_to_save();  // `whole` keeps them whole, for comparison
  expert_parallel(*saved, mesh({4}), 0);
  const std::string dir = shared_directory("moe_ep4").string();
  checkpoint::save(state_of(*saved), dir, {.world = world()});
  MoE ep2(o), single(o);  // freshly initialised: other values than the saved ones
  ep2->to(at::kDouble);
  single->to(at::kDouble);
  expert_parallel(*ep2, mesh({2, 2}), 1);
  checkpoint::load(state_of(*ep2), dir, {.world = world()});
  checkpoint::load(state_of(*single), dir, {.world = world()});
  for (const auto& [name, value] : state_of(*whole)) {
    SCOPED_TRACE(name);
    const at::Tensor loaded = state_of(*ep2).at(name);  // the experts DTensors, the gate plain
    EXPECT_TRUE(tensors_equal(is_dtensor(loaded) ? full_tensor(loaded) : loaded, value));
    EXPECT_TRUE(tensors_equal(state_of(*single).at(name), value));
  }
  const at::Tensor x = tokens_for(4, 3);
  EXPECT_TRUE(tensors_close(full_tensor(ep2->forward(distribute_tensor(x, mesh({2, 2}), Placements{Replicate(), Shard(0)}))), whole->forward(x), 1e-12, 1e-12));
}

// Megatron's global auxiliary loss: each rank's own tokens (one rank none), the loss and its gradient
// those of one process on all of them (transformers' formula written out), on a 1-d and a 2-d mesh.
TEST_F(ExpertParallelTest, GlobalLoadBalancingLossIsOneProcessesOnEveryRanksTokens) {
  constexpr int64_t kExperts = 4, kTopK = 2;
  const std::vector<int64_t> tokens_of = {3, 0, 5, 2};
  const at::Tensor all = test_tensor({10, kExperts}, at::kDouble, 31) / 7;
  const at::Tensor whole = all.clone().requires_grad_();
  const at::Tensor probabilities = at::softmax(whole, -1);
  const at::Tensor chosen = std::get<1>(at::topk(probabilities, kTopK, -1));
  const at::Tensor share = at::zeros({kExperts}, all.options()).index_add(0, chosen.reshape(-1), at::ones({chosen.numel()}, all.options()));
  const at::Tensor expected = (share / 10 * probabilities.sum(0) / 10).sum() * kExperts;
  expected.backward();
  const int64_t rank = world()->rank();
  int64_t offset = 0;
  for (int64_t r = 0; r < rank; ++r) offset += tokens_of[static_cast<size_t>(r)];
  const int64_t count = tokens_of[static_cast<size_t>(rank)];
  for (const MeshPtr& m : {mesh({4}), mesh({2, 2})}) {
    const at::Tensor mine = all.narrow(0, offset, count).clone().requires_grad_();
    const at::Tensor got = load_balancing_loss(mine, kTopK, m);
    EXPECT_TRUE(tensors_close(got, expected.detach(), 1e-12, 1e-14));
    got.backward();
    if (count > 0) EXPECT_TRUE(tensors_close(mine.grad(), whole.grad().narrow(0, offset, count), 1e-10, 1e-13));
  }
  EXPECT_THAT(error_of([&] { load_balancing_loss(all, kTopK, nullptr); }), HasSubstr("load_balancing_loss over a mesh takes"));
}

// A router gone wrong on one rank (a hand-made routing into the experts' module) stops every rank of the
// ep dim with the same error naming that rank, at once: no rank is left waiting in the exchange.
TEST_F(ExpertParallelTest, AnOutOfRangeExpertOnOneRankStopsEveryRankNamingIt) {
  MoE moe(moe_options(4, 2));
  expert_parallel(*moe, mesh({4}), 0, "layers.1.mlp");
  const at::Tensor hidden = at::ones({3, kHidden});
  at::Tensor chosen = at::tensor({0, 1, 2, 3, 1, 0}, at::kLong).reshape({3, 2});
  if (world()->rank() == 2) chosen[1][1] = 7;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(error_of([&] { moe->experts->forward(hidden, chosen, at::full({3, 2}, 0.5)); }),
              HasSubstr("MoE layer 'layers.1.mlp.experts' (experts spread over mesh dim 0; on rank 2): the router chose expert 7, "
                        "outside [0, 4)"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The group still works: the same call with a good routing runs everywhere.
  chosen[1][1] = 3;
  EXPECT_EQ(moe->experts->forward(hidden, chosen, at::full({3, 2}, 0.5)).sizes(), hidden.sizes());
}

TEST_F(ExpertParallelTest, ExpertsThatDoNotDivideOverTheDimAreRefused) {
  MoE moe(moe_options(6, 2));
  EXPECT_THAT(error_of([&] { expert_parallel(*moe, mesh({4}), 0, "layers.3.mlp"); }),
              HasSubstr("expert_parallel('layers.3.mlp.experts'): its 6 experts do not divide over the 4 ranks of mesh dim 0"));
  MoE fine(moe_options(4, 2));
  expert_parallel(*fine, mesh({4}), 0, "layers.0.mlp");
  EXPECT_THAT(error_of([&] { fine->forward(at::ones({4, 5})); }),
              HasSubstr("MoE layer 'layers.0.mlp.experts': hidden states must end in the layer's hidden size 8 (got shape [4, 5])"));
  MoE local(moe_options(4, 2));
  EXPECT_THAT(error_of([&] { local->forward(distribute_tensor(at::ones({4, kHidden}), mesh({4}), Placements{Shard(0)})); }),
              HasSubstr("hidden states are a DTensor but the experts are not spread over a mesh dim; call expert_parallel first"));
}

}  // namespace
}  // namespace dtensor::testing
