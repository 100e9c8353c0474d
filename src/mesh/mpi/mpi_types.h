#pragma once
// How tensors map onto MPI: the datatype and operation that reduce a dtype, and the unit that moves
// any number of bytes within MPI's int counts.

#include <c10/core/ScalarType.h>
#include <mpi.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

namespace dtensor::detail::mpi {

struct Reduction {
  MPI_Datatype type;
  MPI_Op op;
};

// What reduces `dtype` with `op`: MPI's own types and operations, and operations of dtensor's own for
// float16 and bfloat16 (combined in float, as Gloo does). Throws DTensorError naming the operation,
// the dtype and the reduction when MPI cannot do it. The caller holds call_lock().
Reduction reduction_for(at::ScalarType dtype, const c10d::ReduceOp& op, const char* operation);

// A block of bytes that divides every one of `byte_counts` and brings each below MPI's int limit
// (single bytes unless a count passes 2 GiB). The caller holds call_lock().
struct ByteUnit {
  MPI_Datatype type;
  int64_t bytes;
  int count(int64_t byte_count) const { return static_cast<int>(byte_count / bytes); }
};
ByteUnit unit_for(const std::vector<int64_t>& byte_counts, const char* operation);

// "MPI_ERR_TRUNCATE: message truncated" for an MPI return code.
std::string error_text(int code);

}  // namespace dtensor::detail::mpi
