#include "dtensor/graph/eager.h"

#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "experts_fusion.h"

namespace dtensor::graph {

std::vector<at::Tensor> distribute_program(Program& program, const MeshPtr& mesh, const std::map<std::string, Placements>& placements) {
  for (const auto& [name, placed] : placements)
    if (!program.state.count(name))
      throw DTensorError("distribute_program: placements for '" + name + "', which is not a parameter, buffer or constant of " +
                         program.source + "; name the program's state by its FQN");
  // The experts' fusion finds spread experts by their weights' placements, given as the transforms give them.
  for (const InputSpec& spec : program.inputs)
    if (const auto placed = placements.find(spec.target); spec.kind != InputSpec::Kind::UserInput && placed != placements.end())
      program.annotations.set_placements(*spec.value, placed->second);
  detail::fuse_spread_experts(program);
  std::vector<at::Tensor> parameters;
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind == InputSpec::Kind::UserInput) continue;
    program.annotations.clear_placements(*spec.value);  // the program stays global: its values hold whole shapes
    const auto placed = placements.find(spec.target);
    at::Tensor t = distribute_tensor(program.state.at(spec.target).tensor(), mesh,
                                     placed == placements.end() ? Placements(static_cast<size_t>(mesh->ndim()), Replicate()) : placed->second);
    if (spec.kind == InputSpec::Kind::Parameter) parameters.push_back(t.requires_grad_(true));
    program.state[spec.target] = StateTensor(t);
  }
  return parameters;
}

}  // namespace dtensor::graph
