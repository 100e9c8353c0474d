#pragma once
// Activations and gradients between stages on other ranks. Each transfer is a small header (what it
// is: activation or gradient, of which stage and microbatch; its dtype and shape) followed by the data,
// so that the receiver needs no shapes in advance (microbatches of uneven size have other shapes) and
// never takes one transfer for another: a transfer that arrives before the one a rank waits for (two
// stages on one rank talking to the same peer) is kept until its turn. Headers travel on a tag of their
// own and their receives are posted when the step starts (their size is fixed), so that only the data
// waits for a round trip when it is taken: on Gloo, whose transfers each wait for the receiver's
// notice, a header received on demand doubled a transfer's latency.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
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

  // Posts the receives of the next `count` headers from `peer` (what the step will take from it).
  void expect(int64_t peer, int count);
  // Starts sending `tensor` to `peer` (a coordinate along the dim).
  void send(const at::Tensor& tensor, int64_t peer, const TransferId& id);
  // The transfer `id` from `peer`, waiting for it.
  at::Tensor take(int64_t peer, const TransferId& id);
  // Waits for every send started (the step's end: their buffers may go); refuses a step that left a
  // transfer received and unused, or expected and never received (abandoning the receives).
  void finish_sends();
  // After a failed step: drops the header receives still posted without waiting for them (their
  // buffers are kept for as long as the process lives), so that this rank does not wait on peers
  // that are waiting on it, and its failure reaches them as this rank's exit.
  void abandon_receives();

 private:
  bool tags_kept_apart() const;
  // Headers' tag: kPipelineHeaderTag where the backend keeps tags apart, else the data's.
  int header_tag() const { return tags_kept_apart() ? kPipelineHeaderTag : 0; }
  void post_header(int64_t peer);

  MeshPtr mesh_;
  int64_t dim_;
  std::vector<P2PWork> sends_;
  std::vector<at::Tensor> in_flight_;  // what the sends read, alive until they complete
  std::map<std::tuple<int64_t, TransferId>, at::Tensor> arrived_early_;  // (peer, id)
  struct PostedHeader {
    at::Tensor header;
    P2PWork work;
  };
  std::map<int64_t, std::deque<PostedHeader>> posted_headers_;  // by peer, oldest first
};

}  // namespace dtensor::pipeline::detail
