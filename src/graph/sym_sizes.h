#pragma once
// DSymInt (seed 001): a size read from a sharded dim (aten::sym_size.int of a value sharded along that
// dim, in dynamic-shape exports) has two values: the global one the program was traced with, and the
// local one the same nodes compute on this rank's shard at run time. Every consumer must get the one
// it needs:
//  - a view or expand of a value sharded along that dim wants the local size (its rule's local
//    arguments say so) and gets the symbol as is;
//  - a factory whose size is sharded makes this rank's part: its output is Shard(i) along the mesh
//    dims that shard the size, sized by the symbol (as the seed's factory rules);
//  - a consumer that wants the global value (arange(B), an expand to a whole dim) gets the symbol
//    times the number of shards, an integer node inserted before it.
// Local values are chunks of the global one, which needs every sharded dynamic dim divisible by its
// shard count: SPMD expansion checks that of the inputs (see spmd.h).

#include <map>
#include <optional>
#include <vector>

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

class ShardedSizes {
 public:
  explicit ShardedSizes(MeshPtr mesh) : mesh_(std::move(mesh)) {}

  // In graph order, once the node's inputs are marked (in `marks`): what its SymInt output is
  // (sym_size of a sharded dim, or an integer operator on such sizes).
  void record(const Node& node, const Annotations& marks);

  // For a node without tensor inputs (a factory): the placements its output takes from its sharded
  // sizes, and the index of its size argument; nullopt when no size is sharded.
  std::optional<std::pair<Placements, size_t>> factory_placements(const Node& node) const;

  // Once every value has its local meta (in graph order): the local values of the SymInts (sizes
  // read from local shards, and integer operators on them).
  void compute_local_hints(const Graph& graph);

  // Rewrites size argument `index` of `node` so that it gives `wanted` (global sizes turned local by
  // a rule, or the global sizes where the op wants those): constants become the wanted value,
  // symbols stay where their local value is the wanted one, and become their global value (a node
  // inserted before `node`) where that is. Anything else is an error naming the node.
  void localize_argument(Program& program, Node* node, size_t index, const c10::IValue& wanted);

 private:
  struct Info {
    std::vector<int64_t> mesh_dims;  // the mesh dims whose shards make it a local size
    int64_t shards = 1;              // global = local * shards (sizes read from a divisible dim)
    bool scalable = true;            // false once an operator (add, floordiv, ...) breaks that relation
  };
  const Info* info(const Value* v) const;
  Value* global_value(Program& program, Node* before, Value* symbol);

  MeshPtr mesh_;
  std::map<const Value*, Info> sharded_;
  std::map<const Value*, int64_t> local_hint_;
  std::map<const Value*, Value*> global_of_;
};

}  // namespace dtensor::graph::detail
