#pragma once
// How tensors travel through c10d: complex ones as real pairs, and the pieces of an all-to-all packed into contiguous bytes: the one send buffer c10d's
// all_to_all_single takes (Gloo's only all-to-all, and MPI's when its members do not share memory),
// or the slots of a shared-memory all-to-all.

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace dtensor::detail {

// Complex tensors travel as their real and imaginary parts: Gloo has no complex types, and moving data
// or summing is the same done componentwise.
at::Tensor as_real(const at::Tensor& t);

// Copies `src` (any strides) into `dst`, which holds src.nbytes() bytes, in src's logical order.
// A tensor whose elements form evenly spaced contiguous rows (a block cut along any dim of a
// contiguous tensor) moves as one memcpy per row: 1.3-2x ATen's strided copy loop here at 2 KiB rows.
void copy_to_bytes(const at::Tensor& src, void* dst);

// One flat view over `parts` when they are contiguous and lie back to back, in order, in one storage
// (a contiguous tensor cut along its leading dim).
std::optional<at::Tensor> back_to_back(const std::vector<at::Tensor>& parts);

// The pieces (any strides), flattened, back to back in member order: their own memory when they lie
// so already, else one new contiguous tensor.
at::Tensor packed_back_to_back(const std::vector<at::Tensor>& pieces);

}  // namespace dtensor::detail
