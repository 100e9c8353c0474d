#pragma once
// A c10d backend over MPI for CPU tensors: one MPI communicator per group of ranks. Collectives are
// started non-blocking and completed in Work::wait, which polls MPI (yielding the core when ranks
// outnumber cores) and fails with an error after the group's timeout instead of hanging.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "dtensor/comm_backend.h"  // the c10d types a backend's functions take

namespace dtensor::detail {

// A backend over the sorted world ranks `ranks` (MPI_COMM_WORLD ranks; this rank among them). Every
// member must call it for the same rank set in the same order; the members meet through `store` first,
// so a member that never comes fails the others after `timeout` rather than hanging them.
c10::intrusive_ptr<c10d::Backend> make_mpi_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   const std::vector<int64_t>& ranks, int world_rank,
                                                   std::chrono::milliseconds timeout);

// The all-reduce of `input` written into `output` (contiguous, of input's shape and dtype) on an MPI
// backend made above, `input` left as it was and never copied first (c10d's all-reduce is in place
// only). Throws DTensorError when `backend` is another kind.
c10::intrusive_ptr<c10d::Work> mpi_all_reduce_into(c10d::Backend& backend, at::Tensor& output, const at::Tensor& input,
                                                   const c10d::ReduceOp& op);

}  // namespace dtensor::detail
