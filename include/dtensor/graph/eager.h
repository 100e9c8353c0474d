#pragma once
// A program run eagerly on DTensors, as PyTorch runs a model after parallelize_module: graph::run
// interprets it op by op, each op dispatched on DTensors (its sharding rule, the cost model's
// redistributions) and recorded by autograd, so that loss.backward() fills the parameters' gradients
// and a torch optimizer steps them. Nothing is planned ahead, unlike the transforms
// (tensor_parallel.h, spmd.h): what runs is what eager dispatch chooses, op by op.
//
//   Program llama = load_program("llama_loss_train_ir.pt2");   // forward(input_ids, labels) -> loss
//   auto parameters = distribute_program(llama, mesh, plan_placements(llama, *mesh, plan, {.tp_dim = "tp"}));
//   torch::optim::AdamW adamw(parameters, torch::optim::AdamWOptions(1e-3));
//   at::Tensor loss = run(llama, {ids, labels})[0].toTensor();  // ids and labels DTensors on `mesh`
//   loss.backward();
//   adamw.step();

#include <map>
#include <string>
#include <vector>

#include "dtensor/graph/program.h"

namespace dtensor::graph {

// Makes the program's state (parameters, buffers, constants) DTensors on `mesh` with `placements` (by
// name; Replicate where a name has none) and returns its parameters in input order, requiring
// gradients. Experts whose weights are Shard(0) on some mesh dim (an ExpertParallel plan entry) first
// become dtensor's experts ops (src/graph/experts_fusion.h), so that each rank computes with its own
// experts instead of gathering everyone's. A name that is not the program's state is an error.
std::vector<at::Tensor> distribute_program(Program& program, const MeshPtr& mesh, const std::map<std::string, Placements>& placements);

}  // namespace dtensor::graph
