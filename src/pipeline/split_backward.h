#pragma once
// A stage's backward in two halves, as PyTorch's pipelining splits it for the zero-bubble schedules
// (torch/distributed/pipelining/_backward.py). The input backward (I) runs the graph from the stage's
// output down to its input alone, and captures the gradients reaching the nodes where the parameters'
// subgraphs join the input's path (a matmul's node, between its activation and its weight: the
// "intermediates"). The weight backward (W) later starts from those nodes with those gradients and
// runs down to the parameters alone, so that it does not traverse the input's path a second time: once
// I is done, the intermediates' edges into the input's path are cut (which also frees what the nodes
// there saved), so that one run from every intermediate reaches the parameters' subgraphs and nothing
// else. (PyTorch runs each group of parameters sharing intermediates apart instead, each run searching
// the graph below its intermediates.)

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <utility>
#include <vector>

namespace dtensor::pipeline::detail {

// What an input backward leaves for its weight backward.
class WeightBackward {
 public:
  WeightBackward() = default;
  // Accumulates the parameters' gradients into their .grad; once (it releases the graph).
  void run();

 private:
  friend std::pair<at::Tensor, WeightBackward> backward_input(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                              const std::vector<at::Tensor>&);
  std::vector<torch::autograd::Edge> parameters_;  // their gradient accumulators
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> intermediates_;
  std::vector<std::vector<at::Tensor>> grads_;  // what reached each intermediate's inputs in I
};

// I: the gradient of `input` (a leaf that requires grad) from `output` and the gradient of `output`
// (undefined for a scalar loss: 1), and what W needs to give `parameters` theirs. The graph below the
// intermediates is kept for W; the caller may drop `output`.
std::pair<at::Tensor, WeightBackward> backward_input(const at::Tensor& output, const at::Tensor& output_grad, const at::Tensor& input,
                                                     const std::vector<at::Tensor>& parameters);

}  // namespace dtensor::pipeline::detail
