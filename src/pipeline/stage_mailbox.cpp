#include "stage_mailbox.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>

#include "dtensor/errors.h"

namespace dtensor::pipeline::detail {
namespace {

// The header: a tag, the id, the dtype and the shape (at most kMaxDims dims).
constexpr int64_t kTag = 0x5050'7472'616e'7366;  // "PPtransf"
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderSize = 6 + kMaxDims;

at::Tensor header_of(const at::Tensor& tensor, const TransferId& id) {
  if (tensor.dim() > kMaxDims)
    throw DTensorError("pipeline: " + id.label() + " has " + std::to_string(tensor.dim()) + " dims; at most " +
                       std::to_string(kMaxDims) + " travel between stages");
  at::Tensor header = at::zeros({kHeaderSize}, at::kLong);
  auto h = header.accessor<int64_t, 1>();
  h[0] = kTag;
  h[1] = static_cast<int64_t>(id.kind);
  h[2] = id.stage;
  h[3] = id.microbatch;
  h[4] = static_cast<int64_t>(tensor.scalar_type());
  h[5] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) h[6 + d] = tensor.size(d);
  return header;
}

}  // namespace

std::string TransferId::label() const {
  const bool activation = kind == Kind::Activation;
  return "stage " + std::to_string(stage) + " -> " + std::to_string(activation ? stage + 1 : stage - 1) + ": " +
         (activation ? "activation" : "input gradient") + " of microbatch " + std::to_string(microbatch);
}

void StageMailbox::send(const at::Tensor& tensor, int64_t peer, const TransferId& id) {
  const at::Tensor data = tensor.detach().contiguous();
  const at::Tensor header = header_of(data, id);
  const std::string label = id.label();
  sends_.push_back(batch_isend_irecv(
      mesh_, dim_, {P2POp{P2POp::Kind::Send, header, peer, label + " (header)", header_tag()}, P2POp{P2POp::Kind::Send, data, peer, label}}));
  in_flight_.push_back(header);
  in_flight_.push_back(data);
}

// NCCL matches transfers in order whatever their tag: there headers share the data's order and are
// received when taken.
bool StageMailbox::tags_kept_apart() const { return mesh_->backend() != CommBackend::Nccl; }

void StageMailbox::expect(int64_t peer, int count) {
  if (!tags_kept_apart()) return;
  for (int i = 0; i < count; ++i) post_header(peer);
}

void StageMailbox::post_header(int64_t peer) {
  at::Tensor header = at::empty({kHeaderSize}, at::kLong);
  P2PWork work = batch_isend_irecv(mesh_, dim_, {P2POp{P2POp::Kind::Recv, header, peer, "a stage transfer's header", header_tag()}});
  posted_headers_[peer].push_back({header, std::move(work)});
}

at::Tensor StageMailbox::take(int64_t peer, const TransferId& id) {
  if (const auto early = arrived_early_.find({peer, id}); early != arrived_early_.end()) {
    at::Tensor out = early->second;
    arrived_early_.erase(early);
    return out;
  }
  const std::string label = id.label();
  while (true) {
    if (posted_headers_[peer].empty()) post_header(peer);
    PostedHeader posted = std::move(posted_headers_[peer].front());
    posted_headers_[peer].pop_front();
    posted.work.wait();
    const at::Tensor& header = posted.header;
    const auto h = header.accessor<int64_t, 1>();
    const bool valid = h[0] == kTag && (h[1] == 1 || h[1] == 2) && h[4] >= 0 &&
                       h[4] < static_cast<int64_t>(at::ScalarType::NumOptions) && h[5] >= 0 && h[5] <= kMaxDims;
    if (!valid) throw DTensorError("pipeline: waiting for " + label + " from pp rank " + std::to_string(peer) + ", received a message that is no stage transfer");
    std::vector<int64_t> shape(h[5]);
    for (int64_t d = 0; d < h[5]; ++d) shape[d] = h[6 + d];
    if (std::any_of(shape.begin(), shape.end(), [](int64_t size) { return size < 0; }))
      throw DTensorError("pipeline: waiting for " + label + " from pp rank " + std::to_string(peer) + ", received a negative size");
    const TransferId arrived{static_cast<TransferId::Kind>(h[1]), h[2], h[3]};
    at::Tensor data = at::empty(shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(h[4])));
    recv(data, peer, mesh_, dim_, arrived.label());
    if (arrived == id) return data;
    arrived_early_.emplace(std::make_tuple(peer, arrived), data);
  }
}

void StageMailbox::abandon_receives() {
  static std::mutex mutex;
  static auto* abandoned = new std::vector<PostedHeader>();  // never destroyed: nothing waits on them
  const std::lock_guard<std::mutex> lock(mutex);
  for (auto& [peer, headers] : posted_headers_)
    for (PostedHeader& posted : headers) abandoned->push_back(std::move(posted));
  posted_headers_.clear();
  arrived_early_.clear();
}

void StageMailbox::finish_sends() {
  for (P2PWork& work : sends_) work.wait();
  sends_.clear();
  in_flight_.clear();
  if (!arrived_early_.empty()) {
    const std::string error = "pipeline: the step ended with " + std::to_string(arrived_early_.size()) + " transfer(s) received and never used, first " +
                              std::get<1>(arrived_early_.begin()->first).label() + ": the schedule and the peer's disagree";
    abandon_receives();
    throw DTensorError(error);
  }
  for (const auto& [peer, headers] : posted_headers_)
    if (!headers.empty()) {
      const std::string error = "pipeline: the step ended waiting for " + std::to_string(headers.size()) + " more transfer(s) from pp rank " +
                                std::to_string(peer) + ": the schedule and the peer's disagree";
      abandon_receives();
      throw DTensorError(error);
    }
}

}  // namespace dtensor::pipeline::detail
