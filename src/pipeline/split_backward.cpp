#include "split_backward.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/node.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <unordered_set>

namespace dtensor::pipeline::detail {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;
using NodeSet = std::unordered_set<Node*>;
// Each node's parents: the nodes whose next edges point at it (towards the output).
using Parents = std::unordered_map<Node*, std::vector<Node*>>;

Parents parents_below(Node* root) {
  Parents parents;
  std::deque<Node*> queue{root};
  NodeSet seen{root};
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    for (const Edge& edge : node->next_edges()) {
      Node* child = edge.function.get();
      if (child == nullptr) continue;
      parents[child].push_back(node);
      if (seen.insert(child).second) queue.push_back(child);
    }
  }
  return parents;
}

// The nodes on the way from `roots` up towards the output, and the `targets` where that way stopped.
std::pair<NodeSet, NodeSet> walk_up(const std::vector<Node*>& roots, const NodeSet& targets, const Parents& parents) {
  NodeSet walked, reached;
  std::deque<Node*> queue;
  for (Node* root : roots)
    if (root != nullptr && walked.insert(root).second) queue.push_back(root);
  while (!queue.empty()) {
    const auto up = parents.find(queue.front());
    queue.pop_front();
    if (up == parents.end()) continue;
    for (Node* parent : up->second) {
      if (walked.count(parent)) continue;
      if (targets.count(parent)) {
        reached.insert(parent);
        continue;
      }
      walked.insert(parent);
      queue.push_back(parent);
    }
  }
  return {walked, reached};
}

// Runs `fn` on the gradients reaching a node, before it runs.
class PreHook : public torch::autograd::FunctionPreHook {
 public:
  explicit PreHook(std::function<variable_list(const variable_list&)> fn) : fn_(std::move(fn)) {}
  variable_list operator()(const variable_list& grads) override { return fn_(grads); }

 private:
  std::function<variable_list(const variable_list&)> fn_;
};

// Hooks added to nodes for a while: removed when it goes, whatever happened meanwhile.
class TemporaryPreHooks {
 public:
  void add(Node* node, std::function<variable_list(const variable_list&)> fn) {
    auto hook = std::make_unique<PreHook>(std::move(fn));
    added_.emplace_back(node, hook.get());
    node->add_pre_hook(std::move(hook));
  }
  ~TemporaryPreHooks() {
    for (const auto& [node, hook] : added_) {
      auto& hooks = node->pre_hooks();
      hooks.erase(std::remove_if(hooks.begin(), hooks.end(), [hook = hook](const auto& h) { return h.get() == hook; }), hooks.end());
    }
  }

 private:
  std::vector<std::pair<Node*, torch::autograd::FunctionPreHook*>> added_;
};

}  // namespace

std::pair<at::Tensor, WeightBackward> backward_input(const at::Tensor& output, const at::Tensor& output_grad, const at::Tensor& input,
                                                     const std::vector<at::Tensor>& parameters) {
  namespace impl = torch::autograd::impl;
  const Parents parents = parents_below(output.grad_fn().get());
  const NodeSet input_path = walk_up({impl::gradient_edge(input).function.get()}, {}, parents).first;
  // Each parameter joins the input's path at the nodes its own way up reaches first.
  WeightBackward weight;
  NodeSet intermediates;
  for (const at::Tensor& parameter : parameters) {
    Edge edge = impl::gradient_edge(parameter);
    const NodeSet joins = walk_up({edge.function.get()}, input_path, parents).second;
    if (joins.empty()) continue;  // not reached from the output: no gradient
    intermediates.insert(joins.begin(), joins.end());
    weight.parameters_.push_back(std::move(edge));
  }
  for (Node* node : intermediates) weight.intermediates_.push_back(node->getptr());
  weight.grads_.resize(weight.intermediates_.size());
  at::Tensor input_grad;
  {
    TemporaryPreHooks capture;
    for (size_t k = 0; k < weight.intermediates_.size(); ++k)
      capture.add(weight.intermediates_[k].get(), [into = &weight.grads_[k]](const variable_list& grads) {
        *into = grads;
        return grads;
      });
    input_grad = torch::autograd::grad({output}, {input}, {output_grad}, /*retain_graph=*/true)[0];
  }
  // The input's path below the intermediates is done with: W runs the parameters' side alone. Only the
  // graph of this microbatch's input leads there (its nodes were made by this forward).
  for (const auto& node : weight.intermediates_)
    for (Edge& edge : node->next_edges())
      if (input_path.count(edge.function.get())) edge = Edge();
  return {input_grad, std::move(weight)};
}

void WeightBackward::run() {
  torch::autograd::edge_list roots;
  variable_list grads;
  for (size_t k = 0; k < intermediates_.size(); ++k)
    for (size_t i = 0; i < grads_[k].size(); ++i)
      if (grads_[k][i].defined()) {
        roots.emplace_back(intermediates_[k], static_cast<uint32_t>(i));
        grads.push_back(grads_[k][i]);
      }
  if (!roots.empty())
    torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                          /*accumulate_grad=*/true, parameters_);
  *this = WeightBackward();
}

}  // namespace dtensor::pipeline::detail
