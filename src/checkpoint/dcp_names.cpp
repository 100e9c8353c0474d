// The names PyTorch's DCP gives a trainer's {"model": ..., "optim": ...} state (dcp.h).

#include "dtensor/dcp.h"

namespace dtensor::checkpoint::dcp {

State pytorch_training_state(const State& model, const State& optimizer) {
  State out;
  for (const auto& [name, tensor] : model) out.emplace("model." + name, tensor);
  for (const auto& [name, tensor] : optimizer) out.emplace("optim.state." + name, tensor);
  return out;
}

}  // namespace dtensor::checkpoint::dcp
