#pragma once
// Reads the graph of a .pt2's models/model.json (torch/_export/serde/schema.yaml, schema 8.x) into a
// Program: graph inputs, nodes with their arguments, graph outputs, and tensor metas. Every field
// goes through io::JsonField, so a missing, mistyped or out-of-range value is a DTensorError naming
// the file, the node and the field. A union is an object with exactly one key, enums are numbers
// (see serialized_enums.h), and arguments left at their schema default are absent.

#include "../io/untrusted_json.h"
#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

// A tensor_meta / tensor_values entry into `v`: dtype, sizes and strides (static or symbolic),
// storage offset, requires_grad. Sizes, strides and the offset must be non-negative, and the view's
// element count and extent must fit int64.
void read_tensor_meta(const io::JsonField& meta, Value& v);

// Reads graph_module.graph (`graph`) into `program.graph`.
void read_graph(const io::JsonField& graph, Program& program);

}  // namespace dtensor::graph::detail
