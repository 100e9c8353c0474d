#pragma once
// Activations and gradients between stages on other ranks.
//
// Each transfer is one message: a small header (what it is: activation or gradient, of which stage and
// microbatch; its dtype and shape) followed by the data, so that the receiver never takes one transfer
// for another (a transfer that arrives before the one a rank waits for, as with two stages on one rank
// talking to the same peer, is kept until its turn) and needs no shapes in advance.
//
// Receives are posted ahead of their use (a window of them per peer), so that the data does not wait
// for a round trip when it is taken: on Gloo a transfer waits for the receiver's notice that its buffer
// is ready, which a receive posted on demand sends only then. A posted receive needs its size: the k-th
// message from a peer in a step is as large as the k-th one of the step before (a runner's schedule is
// the same every step), which sender and receiver both know. Where the sender's transfer is of another
// size (the first step, or microbatches of another shape), the message of the agreed size carries only
// the header, which announces the data in a second message, received on demand.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>
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

  // Starts a step that takes `receives[peer]` transfers from each peer: posts the first receives.
  void start_step(const std::map<int64_t, int>& receives);
  // Starts sending `tensor` to `peer` (a coordinate along the dim).
  void send(const at::Tensor& tensor, int64_t peer, const TransferId& id);
  // The transfer `id` from `peer`, waiting for it.
  at::Tensor take(int64_t peer, const TransferId& id);
  // Waits for every send started (the step's end: their buffers may go); refuses a step that left a
  // transfer received and unused, or expected and never received (abandoning the receives).
  void finish_sends();
  // After a failed step: drops the receives still posted without waiting for them (their buffers are
  // kept for as long as the process lives), so that this rank does not wait on peers that are waiting
  // on it, and its failure reaches them as this rank's exit.
  void abandon_receives();

 private:
  struct PostedReceive {
    at::Tensor message;
    P2PWork work;
    size_t ordinal;  // the message's place among the step's from its peer
  };
  // Per peer: the sizes of the step's messages (the data's bytes, in order), as the step before sent
  // them, and how far this step has come.
  struct Traffic {
    std::vector<int64_t> data_bytes;
    size_t next = 0;  // the next message's ordinal
    // The agreed size of message `ordinal` (0, the header alone, before any step sent it), and its new one.
    int64_t agreed(size_t ordinal) const { return ordinal < data_bytes.size() ? data_bytes[ordinal] : 0; }
    void record(size_t ordinal, int64_t bytes) {
      if (ordinal >= data_bytes.size()) data_bytes.resize(ordinal + 1, 0);
      data_bytes[ordinal] = bytes;
    }
  };

  bool tags_kept_apart() const;
  // The messages' tag: kPipelineTransferTag where the backend keeps tags apart, else the data's.
  int message_tag() const { return tags_kept_apart() ? kPipelineTransferTag : 0; }
  void post_receive(int64_t peer);
  void post_window(int64_t peer);
  // The transfer a message carries (receiving its data where it follows apart), for errors naming the
  // transfer `awaited`.
  std::pair<TransferId, at::Tensor> unpack(PostedReceive& posted, int64_t peer, const std::string& awaited);

  MeshPtr mesh_;
  int64_t dim_;
  std::vector<P2PWork> sends_;
  std::vector<at::Tensor> in_flight_;  // what the sends read, alive until they complete
  std::map<std::tuple<int64_t, TransferId>, at::Tensor> arrived_early_;  // (peer, id)
  std::map<int64_t, std::deque<PostedReceive>> posted_;  // by peer, oldest first
  std::map<int64_t, int> unposted_;  // by peer: the step's receives not posted yet
  std::map<int64_t, Traffic> outgoing_, incoming_;  // by peer
};

}  // namespace dtensor::pipeline::detail
