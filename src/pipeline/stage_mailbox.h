#pragma once
// Activations and gradients between stages on other ranks. Each transfer is a small header (what it
// is: activation or gradient, of which stage and microbatch; its dtype and shape) followed by the data,
// so that the receiver needs no shapes in advance (microbatches of uneven size have other shapes) and
// never takes one transfer for another: a transfer that arrives before the one a rank waits for (two
// stages on one rank talking to the same peer) is kept until its turn.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/p2p.h"

namespace dtensor::pipeline::detail {

// What a transfer carries.
struct TransferId {
  enum class Kind : int64_t { Activation = 1, Gradient = 2 } kind;
  int64_t stage;       // the stage that sent it
  int64_t microbatch;

  auto operator<=>(const TransferId&) const = default;
  // "stage 1 -> 2: activation of microbatch 3", for errors (activations go to the next stage,
  // gradients to the previous one).
  std::string label() const;
};

class StageMailbox {
 public:
  StageMailbox(MeshPtr mesh, int64_t dim) : mesh_(std::move(mesh)), dim_(dim) {}

  // Starts sending `tensor` to `peer` (a coordinate along the dim).
  void send(const at::Tensor& tensor, int64_t peer, const TransferId& id);
  // The transfer `id` from `peer`, waiting for it.
  at::Tensor take(int64_t peer, const TransferId& id);
  // Waits for every send started (the step's end: their buffers may go).
  void finish_sends();

 private:
  MeshPtr mesh_;
  int64_t dim_;
  std::vector<P2PWork> sends_;
  std::vector<at::Tensor> in_flight_;  // what the sends read, alive until they complete
  std::map<std::tuple<int64_t, TransferId>, at::Tensor> arrived_early_;  // (peer, id)
};

}  // namespace dtensor::pipeline::detail
