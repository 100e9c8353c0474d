#pragma once
// An exported program cut into pipeline stages (dtensor/pipeline.h), as torch.distributed.pipelining's
// pipeline() cuts a traced model at split points, each stage a program of its own that saves, loads
// and runs alone:
//
//   auto program = dtensor::graph::load_program("llama_joint.pt2");
//   auto points = dtensor::graph::pp_plan_split_points(program, read_file("pp_plan.json"), 2);
//   dtensor::graph::ProgramStages parts = dtensor::graph::split_program(program, points);
//   std::vector<dtensor::pipeline::PipelineStage> mine = {dtensor::graph::pipeline_stage(parts.stages[rank], rank)};
//   dtensor::pipeline::PipelineRunner runner(schedule, mine, mesh, pp_dim, dtensor::graph::pipeline_loss(parts.loss));
//
// What goes where. A split point is a module path ("model.layers.1"): its stage starts with the first
// parameter under it, in the order the program takes its parameters (the model's registration order,
// which is its forward order at layer boundaries in transformers and torchtitan models, and must be:
// a parameter read in another stage than that order gives it is refused). Each op runs in the latest stage
// of what it reads (its parameters', its inputs') and, where the program records module paths (the
// training IR does), of its module (the innermost one holding parameters): a norm's parameter-free
// statistics run with the norm. Where it records none (the joint programs torch 2.15 writes carry
// none), ops a later stage alone reads move there where that passes no more tensors: the
// parameter-free start of a layer joins the layer. Either way a stage hands the next one tensor, the
// residual stream. Ops that read only buffers and
// constants (rotary tables, masks built from positions) run in every stage that reads them, not sent.
//
// A joint program (forward and backward) is split as pipeline() splits a model: its forward part,
// each stage's backward then run by LibTorch autograd through the stage's ops (PipelineRunner's B, I
// and W), its own backward ops unused. Its loss (the ops reading the labels) is a program of its own,
// run on the last stage.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/graph/program.h"
#include "dtensor/pipeline.h"

namespace dtensor::graph {

struct ProgramStages {
  // Stage k: one user input (stage 0: the program's first user input; after it, the previous stage's
  // output) -> one user output (the next stage's input; the last stage of a forward program: the
  // program's output).
  std::vector<std::shared_ptr<Program>> stages;
  // A joint program's loss: (the last stage's output, the program's other user inputs: the labels) ->
  // its LOSS_OUTPUT. Null for a forward program.
  std::shared_ptr<Program> loss;
};

// Cuts `program` before each of `split_points` (module paths, in forward order): split_points.size() + 1
// stages, which share the program's state tensors. Refuses, naming the stage and what to change: a
// split point under which no parameter lies (listing the program's modules), split points out of order,
// doubled or at the first parameter, a forward program with several user inputs or outputs, a joint
// one with other than (input, labels), a parameter read outside the stage its place among the
// parameters gives it (a split point inside a layer whose modules register in another order than they
// run), a stage left empty, stages that would pass the next one more than one tensor (naming them: a
// value skipping a stage, or a cut inside a block), and a symbolic size crossing stages (dynamic shapes
// are not split yet).
ProgramStages split_program(const Program& program, const std::vector<std::string>& split_points);

// The split points of a Hugging Face pipeline plan as transformers writes it (`model.pp_plan`, or a
// config's `base_model_pp_plan` with `base_model_prefix`): {"model.embed_tokens": [["input_ids"],
// ["inputs_embeds"]], "model.layers": [["hidden_states", "attention_mask"], ["hidden_states"]], ...}.
// Its modules are ordered as the program takes their parameters; the one that is a list of layers
// (parameters under "model.layers.N.") is spread over `num_stages` as evenly as it goes (the first
// stages one more layer), the modules before it joining the first stage and those after the last.
// Refuses a plan that is no object of [[inputs], [outputs]] entries, an entry naming no module of the
// program, a plan without a list of layers, and fewer layers than stages.
std::vector<std::string> pp_plan_split_points(const Program& program, const std::string& json_text, int num_stages,
                                              const std::string& base_model_prefix = "", const std::string& source = "the pipeline plan");

// The program's parameters by name, their tensors set to require grad: running the program under
// autograd (run(), grad mode on) accumulates their gradients; an optimizer over them updates the
// program (and the program the stages were cut from: they share its tensors).
std::vector<std::pair<std::string, at::Tensor>> stage_parameters(Program& program);

// `stage` as the pipeline runner's stage `index`: its forward runs the program (under autograd),
// its parameters are stage_parameters(*stage).
pipeline::PipelineStage pipeline_stage(std::shared_ptr<Program> stage, int index);

// ProgramStages::loss as the pipeline runner's loss: (last stage's output, labels) -> the loss.
pipeline::LossFunction pipeline_loss(std::shared_ptr<Program> loss);

}  // namespace dtensor::graph
