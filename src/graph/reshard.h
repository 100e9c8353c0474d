#pragma once
// Reshard subgraphs: the nodes that move a value from one set of placements to another on this
// rank, made of _c10d_functional collectives (each followed by wait_tensor) and local ops, following
// the redistribution planner's steps (the same plan eager redistribute runs).

#include <string>

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

// Inserts before `before` the nodes that take `value` (this rank's part of a tensor of meta `global`
// under its placements in program.annotations, with its local meta) to `to`, and returns the value
// holding this rank's part under `to` (marked `to`, local meta). Each inserted node's note says why it
// is there (`why`).
Value* insert_reshard(Program& program, const MeshPtr& mesh, Node* before, Value* value, const TensorMeta& global,
                      const Placements& to, const std::string& why);

// The meta of a node's output computed by its op's Meta kernel from its inputs' (local) metas.
void infer_local_metas(Node& node);

}  // namespace dtensor::graph::detail
