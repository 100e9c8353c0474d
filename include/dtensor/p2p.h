#pragma once
// Point-to-point transfers along one mesh dim: torch.distributed's send, recv, P2POp and
// batch_isend_irecv, with the other rank named by its coordinate along the dim (a pipeline's neighbour
// stage on a "pp" dim) rather than by a global rank. They run on the dim's process group (MPI, Gloo or
// NCCL; on NCCL a batch is one coalesced group call, as it must be), under the
// collectives' time limit (MeshOptions::timeout, DTENSOR_TIMEOUT_S). A transfer that fails, or whose peer
// does not answer, is a DTensorError naming this rank, the peer (coordinate, rank and, when it stopped
// answering, its host), the dim and the transfer's label ("stage 1 -> 2: activations of microbatch 3"),
// so that both sides of a broken pipeline say which stage and which rank.
//
// As with c10d's send and recv, transfers between the same two ranks arrive in the order they were
// posted, and a receive must be given the sent tensor's shape and dtype: what a message of another size
// does depends on the backend (MPI refuses a longer one and leaves the rest of the buffer as it was for
// a shorter one), so pipelines exchange shapes first, or fix them, as PyTorch's do.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/device_mesh.h"

namespace dtensor {

struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  // Send: the data (a non-contiguous tensor, or a conjugate or negative view, is sent as a contiguous
  // copy of its values). Recv: where the data arrives, in place: contiguous (not a conjugate or
  // negative view), and of the sent tensor's shape and dtype.
  at::Tensor tensor;
  int64_t peer = 0;   // the other rank's coordinate along the dim
  std::string label;  // names the transfer in errors (may be empty)
  // Transfers between two ranks arrive in the order they were sent, per tag: a receive matches the
  // oldest send of its tag (MPI and Gloo; NCCL keeps one order for all and refuses tags). 0 by default;
  // 1..32000 are refused (the MPI backend's collectives use them), kPipelineTransferTag is the pipeline
  // runner's.
  int tag = 0;
};

constexpr int kPipelineTransferTag = 32100;

namespace detail {
struct P2PInFlight;
}

// Transfers started together (batch_isend_irecv, isend, irecv). wait() completes every one, raising the
// first failure as a DTensorError (after waiting for the rest, so that no transfer still writes into a
// buffer the caller frees), and raises it again at every later wait. The time limit counts from each
// wait, not from the post. A handle never waited for waits when its last copy goes, dropping any error.
// On NCCL a batch whose launch fails midway is still closed (its started part sent), and the wait for
// that part can take up to the time limit, while the peers wait for what was never posted.
class P2PWork {
 public:
  P2PWork() = default;
  explicit P2PWork(std::shared_ptr<detail::P2PInFlight> in_flight) : in_flight_(std::move(in_flight)) {}
  void wait();

 private:
  std::shared_ptr<detail::P2PInFlight> in_flight_;
};

// Starts every op of `ops` on the process group of `mesh`'s dim `dim` (each rank passes its own list;
// every send must meet a receive posted by its peer). Checks all ops before starting any: the dim
// exists, this rank is in the mesh, each peer is a coordinate along the dim other than this rank's, each
// tensor is defined and each receiving one contiguous.
P2PWork batch_isend_irecv(const MeshPtr& mesh, int64_t dim, std::vector<P2POp> ops);
P2PWork isend(const at::Tensor& tensor, int64_t to, const MeshPtr& mesh, int64_t dim, const std::string& label = "");
P2PWork irecv(const at::Tensor& into, int64_t from, const MeshPtr& mesh, int64_t dim, const std::string& label = "");
// The blocking forms.
void send(const at::Tensor& tensor, int64_t to, const MeshPtr& mesh, int64_t dim, const std::string& label = "");
void recv(const at::Tensor& into, int64_t from, const MeshPtr& mesh, int64_t dim, const std::string& label = "");

}  // namespace dtensor
