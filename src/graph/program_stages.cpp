#include "dtensor/graph/program_stages.h"

#include <set>

#include "dtensor/errors.h"
#include "stage_assignment.h"

namespace dtensor::graph {
namespace {

using detail::kEveryStage;
using detail::StageAssignment;

// The nodes of `part` in graph order, with the buffer-and-constant ops they read (every stage that
// reads one computes it).
std::vector<const Node*> nodes_of(const StageAssignment& a, int part) {
  std::set<const Node*> picked;
  std::vector<const Node*> todo;
  for (const Node* n : a.forward_part)
    if (a.node_stage.at(n) == part) todo.push_back(n);
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!picked.insert(n).second) continue;
    for (const Value* v : n->inputs())
      if (const Node* p = v->producer(); p && a.node_stage.at(p) == kEveryStage) todo.push_back(p);
  }
  std::vector<const Node*> out;
  for (const Node* n : a.forward_part)
    if (picked.count(n)) out.push_back(n);
  return out;
}

// Part `part` of `program` as a program: its state inputs (what its nodes read, in the program's
// order), then what the part before hands it, then the user inputs it reads (stage 0: the model's
// input; the loss: the labels); its nodes; its result.
std::shared_ptr<Program> part_program(const Program& program, const StageAssignment& a, int part) {
  const std::vector<const Node*> nodes = nodes_of(a, part);
  std::set<const Value*> read;
  for (const Node* n : nodes)
    for (const Value* v : n->inputs()) read.insert(v);
  auto out = std::make_shared<Program>();
  out->source = program.source + (part == a.num_stages ? " (loss)" : " (stage " + std::to_string(part) + ")");
  out->range_constraints = program.range_constraints;
  out->verifiers = program.verifiers;
  out->schema_major = program.schema_major;
  out->schema_minor = program.schema_minor;
  std::map<const Value*, Value*> mapped;
  Value* handed_in = part > 0 ? a.handed[static_cast<size_t>(part - 1)] : nullptr;
  auto add_handed_in = [&] {
    if (!handed_in || mapped.count(handed_in)) return;
    mapped[handed_in] = out->graph.add_input_like(*handed_in);
    out->inputs.push_back({InputSpec::Kind::UserInput, mapped[handed_in], ""});
  };
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind == InputSpec::Kind::UserInput) add_handed_in();
    if (!read.count(spec.value)) continue;
    mapped[spec.value] = out->graph.add_input_like(*spec.value);
    out->inputs.push_back({spec.kind, mapped[spec.value], spec.target, spec.persistent});
    // The program's own tensors (read now): training the stages trains the program.
    if (spec.kind != InputSpec::Kind::UserInput) out->state.emplace(spec.target, StateTensor(program.state.at(spec.target).tensor()));
  }
  add_handed_in();
  for (const Node* n : nodes) out->graph.append_copy(*n, mapped);
  const bool last = part + 1 == a.num_parts();
  Value* result = last ? a.result : a.handed[static_cast<size_t>(part)];
  out->graph.add_output(Arg::tensor(mapped.at(result)));
  out->outputs.push_back({part == a.num_stages ? OutputSpec::Kind::LossOutput : OutputSpec::Kind::UserOutput, ""});
  if (std::string wrong = out->graph.verify(); !wrong.empty())
    throw DTensorError("split_program(" + out->source + "): internal error, the stage's graph is malformed: " + wrong);
  return out;
}

// Refuses a tensor that is not what `program`'s user input `index` was exported with (a static dim of
// another size, another dtype), naming the stage: an exported program runs only the shapes it was
// traced at, so the microbatches must be those.
void check_input(const Program& program, size_t index, const at::Tensor& input, const std::string& what) {
  const std::vector<Value*> inputs = program.user_inputs();
  if (index >= inputs.size()) throw DTensorError(program.source + ": " + what + " is given, but the program takes no such input");
  const Value& v = *inputs[index];
  bool fits = input.defined() && input.dim() == static_cast<int64_t>(v.meta.shape.size()) && input.scalar_type() == v.meta.dtype;
  for (size_t d = 0; fits && d < v.meta.shape.size(); ++d)
    fits = (d < v.symbolic_sizes.size() && !v.symbolic_sizes[d].empty()) || input.size(static_cast<int64_t>(d)) == v.meta.shape[d];
  if (!fits)
    throw DTensorError(program.source + ": " + what + " is " + (input.defined() ? shape_str(input.sizes().vec()) + " " + std::string(c10::toString(input.scalar_type())) : "undefined") +
                       ", but the program was exported for " + shape_str(v.meta.shape) + " " + c10::toString(v.meta.dtype) +
                       ": give microbatches of the exported size (split the batch into batch / exported rows)");
}

}  // namespace

ProgramStages split_program(const Program& program, const std::vector<std::string>& split_points) {
  const StageAssignment a = detail::assign_stages(program, split_points);
  ProgramStages out;
  for (int stage = 0; stage < a.num_stages; ++stage) out.stages.push_back(part_program(program, a, stage));
  if (a.has_loss) out.loss = part_program(program, a, a.num_stages);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> stage_parameters(Program& program) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const InputSpec& spec : program.inputs)
    if (spec.kind == InputSpec::Kind::Parameter) out.emplace_back(spec.target, program.state.at(spec.target).tensor().requires_grad_(true));
  return out;
}

pipeline::PipelineStage pipeline_stage(std::shared_ptr<Program> stage, int index) {
  if (!stage) throw DTensorError("pipeline_stage: no program for stage " + std::to_string(index));
  std::vector<at::Tensor> parameters;
  for (auto& [name, tensor] : stage_parameters(*stage)) parameters.push_back(tensor);
  return {index,
          [stage, what = "stage " + std::to_string(index) + "'s input"](const at::Tensor& input) {
            check_input(*stage, 0, input, what);
            return run(*stage, {input}).at(0).toTensor();
          },
          std::move(parameters)};
}

pipeline::LossFunction pipeline_loss(std::shared_ptr<Program> loss) {
  if (!loss) throw DTensorError("pipeline_loss: no loss program (a forward program's stages have none: give the runner a loss of your own)");
  return [loss](const at::Tensor& output, const at::Tensor& targets) {
    check_input(*loss, 1, targets, "the loss's labels");
    return run(*loss, {output, targets}).at(0).toTensor();
  };
}

}  // namespace dtensor::graph
