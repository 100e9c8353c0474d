#pragma once
// Reads the graph of a .pt2's models/model.json (torch/_export/serde/schema.yaml, schema 8.x) into a
// Program: graph inputs, nodes with their arguments, graph outputs, and tensor metas. The record has
// been decoded into torch's generated types (pt2_decoding.h); here its meaning is checked, every
// refusal naming the file, the node and the field. Arguments left at their schema default are absent
// from the file.

#include "dtensor/graph/program.h"
#include "pt2_decoding.h"
#include "pt2_records.h"

namespace dtensor::graph::detail {

// A tensor meta (`field` is where it sits) into `v`: dtype, sizes and strides (static or symbolic),
// storage offset, requires_grad. Sizes, strides and the offset must be non-negative, and the view's
// element count and extent must fit int64.
void read_tensor_meta(const torch::_export::TensorMeta& meta, const RecordField& field, Value& v);

// Reads the decoded graph_module.graph (`field` is where it sits) into `program.graph`.
void read_graph(const torch::_export::Graph& graph, const RecordField& field, Program& program);

}  // namespace dtensor::graph::detail
