#pragma once
// The uneven all-to-all of expert parallelism (torch.distributed's all_to_all_single and its
// functional, differentiable form all_to_all_single_autograd), on the process group of one mesh dim:
// each member cuts the rows (dim 0) of its input into one block per member, of any sizes (zero
// included), and receives one block from each. Tokens travel to their experts' ranks this way and back.
// It runs under the collectives' time limit (MeshOptions::timeout, DTENSOR_TIMEOUT_S) and a failure is
// a DTensorError naming this rank, the operation and the mesh dim.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/device_mesh.h"

namespace dtensor {

// What every member of `mesh`'s dim `dim` sends this one: its input_split_sizes[this member's
// coordinate], in coordinate order (one small all-to-all of the counts). Every member calls it.
std::vector<int64_t> exchange_split_sizes(const std::vector<int64_t>& input_split_sizes, const MeshPtr& mesh,
                                          int64_t dim);

// input's rows [sum of input_split_sizes[0..i-1], + input_split_sizes[i]) go to the member at coordinate
// i; the result holds, back to back in coordinate order, the output_split_sizes[i] rows that member i
// sent this one, with input's trailing shape, dtype and device. Empty split sizes mean equal blocks (the
// rows must divide by the group size); output_split_sizes omitted are exchanged first
// (exchange_split_sizes). Given ones must be what the peers send (as with PyTorch, a mismatch is the
// caller's error, which the backend may or may not detect). Every member calls it.
//
// Differentiable: the gradient of the input is the output's gradient sent back the same way (the split
// sizes swapped).
at::Tensor all_to_all_single(const at::Tensor& input, std::optional<std::vector<int64_t>> output_split_sizes,
                             std::vector<int64_t> input_split_sizes, const MeshPtr& mesh, int64_t dim);

}  // namespace dtensor
