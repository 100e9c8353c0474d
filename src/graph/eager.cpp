#include "dtensor/graph/eager.h"

#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "experts_fusion.h"

namespace dtensor::graph {

std::vector<at::Tensor> distribute_program(Program& program, const MeshPtr& mesh, const std::map<std::string, Placements>& placements) {
  std::map<std::string, Placements> valid;
  for (const auto& [name, placed] : placements) {
    const auto state = program.state.find(name);
    if (state == program.state.end())
      throw DTensorError("distribute_program: placements for '" + name + "', which is not a parameter, buffer or constant of " +
                         program.source + "; name the program's state by its FQN");
    valid[name] = validate_placements(placed, mesh->ndim(), static_cast<int64_t>(state->second.meta().shape.size()),
                                      ("distribute_program: " + name).c_str());
  }
  // The experts' fusion finds spread experts by their weights' placements, given as the transforms give them.
  for (const InputSpec& spec : program.inputs)
    if (const auto placed = valid.find(spec.target); spec.kind != InputSpec::Kind::UserInput && placed != valid.end())
      program.annotations.set_placements(*spec.value, placed->second);
  detail::fuse_spread_experts(program);
  std::vector<at::Tensor> parameters;
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind == InputSpec::Kind::UserInput) continue;
    program.annotations.clear_placements(*spec.value);  // the program stays global: its values hold whole shapes
    const auto placed = valid.find(spec.target);
    at::Tensor t = distribute_tensor(program.state.at(spec.target).tensor(), mesh,
                                     placed == valid.end() ? Placements(static_cast<size_t>(mesh->ndim()), Replicate()) : placed->second);
    if (spec.kind == InputSpec::Kind::Parameter) parameters.push_back(t.requires_grad_(true));
    program.state[spec.target] = StateTensor(t);
  }
  return parameters;
}

}  // namespace dtensor::graph
