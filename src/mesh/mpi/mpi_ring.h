#pragma once
// Ring reductions for large tensors on one host: MPI moves the blocks (point to point, a single copy
// through shared memory), ATen does the arithmetic (vectorized; MPI's own reductions of large
// buffers run several times slower here). n-1 steps of passing one block to the next member and
// reducing the one received from the previous; for an all-reduce, n-1 more steps pass the reduced
// blocks around. Every block is reduced once, by one chain, so every member ends with the same bits.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>
#include <vector>

#include "mpi_work.h"

namespace dtensor::detail::mpi {

// Whether the ring does `op` on `dtype` (else MPI reduces it): the arithmetic reductions of numbers.
// The shared-memory all-reduce does the same ones.
bool ring_reduces(at::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// dest = a (op) b, elementwise, for the reductions above; dest may be a or b.
void combine(c10d::ReduceOp::RedOpType op, const at::Tensor& a, const at::Tensor& b, at::Tensor dest);

// The stages of a reduce-scatter of flat `input` (split into `block_sizes` elements per member): the
// reduction of everyone's block r lands in `output` on member r. `input` stays as it was.
std::vector<Stage> ring_reduce_scatter(const std::shared_ptr<Communicator>& comm, const at::Tensor& input,
                                       const at::Tensor& output, std::vector<int64_t> block_sizes,
                                       c10d::ReduceOp::RedOpType op);

// The stages of an all-reduce of flat contiguous `input` into `output` (the same tensor, or a flat
// contiguous one of its size, leaving `input` as it was).
std::vector<Stage> ring_all_reduce(const std::shared_ptr<Communicator>& comm, const at::Tensor& input,
                                   const at::Tensor& output, c10d::ReduceOp::RedOpType op);

}  // namespace dtensor::detail::mpi
