#pragma once
// What a node's sharding strategies depend on, as one string: its operator, its arguments (numbers,
// lists, dtypes, ...; a tensor by its shape, strides and dtype), its tensor inputs' placements and, for
// a node reading one value, the placements that value may take. A model repeats its layers, so a
// graph of N layers asks the rules the same question N times; keyed by this, it is answered once.

#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <vector>

#include "dtensor/placement.h"

namespace c10 {
class OperatorHandle;
}

namespace dtensor::graph::detail {

// Nullopt where an argument is of a kind the key does not spell (the node is then asked itself).
std::optional<std::string> strategy_key(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                        const std::vector<const Placements*>& input_placements,
                                        const std::vector<Placements>* possible_input_placements);

}  // namespace dtensor::graph::detail
