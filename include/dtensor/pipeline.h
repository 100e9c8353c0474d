#pragma once
// Running a pipeline schedule (dtensor/pipeline_schedule.h) along a mesh dim, as PyTorch's
// torch.distributed.pipelining runs its schedules: each rank of the `pp` dim holds its stages, splits
// the batch into the schedule's microbatches, and runs its list of actions; activations and their
// gradients travel between stages by point-to-point transfers on that dim (dtensor/p2p.h).
//
// Gradients are PyTorch's: each microbatch's loss is computed on the last stage and weighs
// 1 / microbatches (PyTorch's scale_grads), gradients accumulate into the stages' parameters across
// microbatches. With microbatches of uneven size (a batch of 10 in 4: 3, 3, 2, 2, torch.tensor_split's
// sizes, as PyTorch splits) that is the mean of the microbatches' losses, not the batch's mean.
//
// A backward split in two (I, then W: the zero-bubble schedules) runs the graph down to the stage's
// input first, keeping the gradients that reach the nodes where the parameters' subgraphs join it, and
// later runs from those nodes down to the parameters alone, as PyTorch's pipelining does: I and W
// together cost one backward. On the first stage, whose input needs no gradient, W is a whole backward.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/pipeline_schedule.h"

namespace torch::nn {
class Module;
}

namespace dtensor::pipeline {

// One stage of the model, held by the rank the schedule places it on.
struct PipelineStage {
  int index = 0;                                          // the stage's global index
  std::function<at::Tensor(const at::Tensor&)> forward;  // its part of the model: input -> output
  std::vector<at::Tensor> parameters;                     // what its gradients accumulate into
  // The modules whose parameters it holds, at the granularity fully_shard was applied (a GPT's: the
  // root for its embeddings and head, each block). Those fully sharded reduce their gradients once a
  // step, as FSDP2 under PyTorch's schedules: their backwards of the step accumulate the whole
  // gradients and keep the parameters gathered, and the last one on this rank (of any of its stages
  // holding the module) reduces the sum (set_requires_gradient_sync, set_reshard_after_backward).
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
};

// The loss of one microbatch: the last stage's output against the microbatch's targets.
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& targets)>;

class PipelineRunner {
 public:
  // `stages`: the stages `schedule` places on this rank (this rank's coordinate along `pp_dim`), each
  // once. The schedule is validated and, when compute-only, lowered with with_communication.
  PipelineRunner(const Schedule& schedule, std::vector<PipelineStage> stages, MeshPtr mesh, int64_t pp_dim, LossFunction loss);
  ~PipelineRunner();
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  // One step's forwards and backwards. `inputs` (read by the first stage) and `targets` (by the last)
  // are split into the schedule's microbatches along dim 0; every rank passes both. Gradients
  // accumulate into the parameters' .grad (zero them between steps, as with any optimizer). Returns
  // the mean of the microbatches' losses on the rank holding the last stage, an undefined tensor on
  // the others.
  at::Tensor step(const at::Tensor& inputs, const at::Tensor& targets);

  // This rank's coordinate along the pp dim.
  int rank() const;

  // The seconds this rank spent computing in the last step: its forwards (the loss included) and
  // backwards (B, I, W). The rest of the step is its bubble: waiting for peers and transfers.
  double compute_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtensor::pipeline
