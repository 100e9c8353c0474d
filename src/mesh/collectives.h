#pragma once
// The collectives dtensor runs, on the process group of one mesh dim. Every call goes through one
// choke point that waits for completion and turns any failure (a timeout, a dead peer) into a
// DTensorError naming this rank, the operation and the mesh dim.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/placement.h"

namespace dtensor::detail {

// A collective started without waiting for it (async_op): wait() completes it and returns its
// result, a failure becoming the blocking form's DTensorError; until then it holds its buffers. Other
// collectives on the group may be started meanwhile (in the same order on every rank, as always).
class StartedCollective {
 public:
  // A result there was nothing to wait for (a group of one).
  explicit StartedCollective(at::Tensor result) : result_(std::move(result)) {}
  // Waits once (for this and every copy of it); later calls return the result at once.
  const at::Tensor& wait();

  // What the start_ functions launched (defined in collectives.cpp).
  struct InFlight;
  explicit StartedCollective(std::shared_ptr<InFlight> in_flight);

 private:
  std::shared_ptr<InFlight> in_flight_;
  at::Tensor result_;
};

// The started forms of all_gather, reduce_scatter and all_reduce (the input is not changed). The
// all-gather's result goes into `output` when one is given (contiguous, the group size times the
// input's elements).
StartedCollective start_all_gather(const MeshPtr& mesh, int64_t dim, const at::Tensor& input, const at::Tensor& output = {});
StartedCollective start_reduce_scatter(const MeshPtr& mesh, int64_t dim, const at::Tensor& input, ReduceOp op);
StartedCollective start_all_reduce(const MeshPtr& mesh, int64_t dim, const at::Tensor& input, ReduceOp op);

// Concatenation along dim 0 of every member's `input` (equal shapes, contiguous), in coordinate order.
at::Tensor all_gather(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input);
// In place; Avg is a sum divided by the group size (truncating for integers, as NCCL does).
void all_reduce_(const DeviceMesh& mesh, int64_t dim, at::Tensor& tensor, ReduceOp op);
// The all-reduce of `input` into a new contiguous tensor, `input` unchanged: on MPI the reduction reads
// `input` and writes the result (no copy first); elsewhere a copy is reduced in place.
at::Tensor all_reduce(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, ReduceOp op);
// all_reduce_ over each of `dims` in turn (the mesh dims a local kernel's partial results span).
void all_reduce_over(const DeviceMesh& mesh, const std::vector<int64_t>& dims, at::Tensor& tensor, ReduceOp op);
// `input` holds n equal blocks along dim 0 (contiguous); member i gets the reduction of everyone's block i.
at::Tensor reduce_scatter(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, ReduceOp op);
// Flat contiguous `input`; send_counts[i] elements go to member i, recv_counts[i] come from it.
at::Tensor all_to_all(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, std::vector<int64_t> send_counts,
                      std::vector<int64_t> recv_counts);
// pieces[i] (any layout) goes to member i; what arrives, flattened and back to back in member order,
// the piece from member i of recv_shapes[i]. On MPI the pieces go to its list all-to-all as they are
// (through shared memory it copies them straight into the slots); on Gloo they are first packed into
// one contiguous send buffer, unless they lie back to back already (a contiguous tensor cut along its
// leading dim).
at::Tensor all_to_all_pieces(const DeviceMesh& mesh, int64_t dim, const std::vector<at::Tensor>& pieces,
                             const std::vector<Shape>& recv_shapes);
// In place, from the member at coordinate `root` along `dim`; `tensor` must be contiguous.
void broadcast_(const DeviceMesh& mesh, int64_t dim, at::Tensor& tensor, int64_t root = 0);
// The member at coordinate 0 sends chunks[i] to member i; everyone receives into `output` (shaped like
// every chunk). `chunks` is ignored on other members.
void scatter_(const DeviceMesh& mesh, int64_t dim, const std::vector<at::Tensor>& chunks, at::Tensor& output);
// Whether `flag` is true on any rank of the mesh (a decision every rank must take alike).
bool any_rank(const DeviceMesh& mesh, bool flag);
// Every member's `values` (equal lengths), concatenated in coordinate order.
std::vector<int64_t> all_gather_values(const DeviceMesh& mesh, int64_t dim, const std::vector<int64_t>& values);

}  // namespace dtensor::detail
