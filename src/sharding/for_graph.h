#pragma once
// What the graph layer may use of sharding, and all of it: src/graph includes no other header of
// src/sharding (scripts/check_layers.py refuses one). Graph passes decide with the rules and the cost
// model eager dispatch uses, through these calls, and never reach into the rule table or the caches.

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <vector>

#include "dtensor/op_schema.h"

namespace dtensor::detail {

// The dispatcher's op named "ns::name.overload" ("ns::name": the default overload); nullopt if none.
std::optional<c10::OperatorHandle> operator_named(const std::string& qualified);

// Whether the op has a sharding rule (registered or built in).
bool has_sharding_rule(const c10::OperatorHandle& op);

// Every strategy the op's rule offers for this call, each as the decision propagation would make had
// it chosen that one (uncached). Rule tests run each of them against single-device results.
std::vector<OutputSharding> every_decision(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                           const std::vector<TensorInput>& inputs, const MeshPtr& mesh);

// Whether any mesh dim of `placements` is a StridedShard or HeadTailShard (rules say what they make of one: StridedShards
// in registry.h; graph programs keep to strategies without them).
bool holds_strided(const Placements& placements);

// Cost of moving a tensor with `spec` to `placements`: the bytes its plan moves per rank (as seen by
// the mesh's first coordinate, so that every rank agrees) plus a fixed latency per collective, and
// one per local step so that a strategy needing no change at all beats one needing a free local chunk.
double redistribute_cost(const DTensorSpec& spec, const Placements& placements);

}  // namespace dtensor::detail
