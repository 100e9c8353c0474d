#include "stage_mailbox.h"

#include <ATen/ATen.h>

#include <array>
#include <cstring>
#include <mutex>

#include "dtensor/errors.h"

namespace dtensor::pipeline::detail {
namespace {

// The header: a tag, the id, the dtype, the dims, whether the data follows in the same message, and the
// shape (at most kMaxDims dims); 16 int64 so that the data after it is aligned for every dtype.
constexpr int64_t kTag = 0x5050'7472'616e'7366;  // "PPtransf"
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderFields = 7;
constexpr int64_t kHeaderBytes = 16 * static_cast<int64_t>(sizeof(int64_t));
static_assert(kHeaderFields + kMaxDims <= kHeaderBytes / static_cast<int64_t>(sizeof(int64_t)));
// Receives posted ahead per peer: enough that the next transfer's is posted while this one is taken,
// few enough that their buffers add little to a schedule's activations.
constexpr size_t kWindow = 4;

using Header = std::array<int64_t, kHeaderBytes / sizeof(int64_t)>;

at::Tensor data_of(const at::Tensor& message, at::ScalarType dtype, at::IntArrayRef shape, int64_t bytes) {
  return message.narrow(0, kHeaderBytes, bytes).view(dtype).view(shape);
}

void write_header(const at::Tensor& message, const at::Tensor& data, const TransferId& id, bool data_inline) {
  if (data.dim() > kMaxDims)
    throw DTensorError("pipeline: " + id.label() + " has " + std::to_string(data.dim()) + " dims; at most " + std::to_string(kMaxDims) +
                       " travel between stages");
  Header h{};
  h[0] = kTag;
  h[1] = static_cast<int64_t>(id.kind);
  h[2] = id.stage;
  h[3] = id.microbatch;
  h[4] = static_cast<int64_t>(data.scalar_type());
  h[5] = data.dim();
  h[6] = data_inline ? 1 : 0;
  for (int64_t d = 0; d < data.dim(); ++d) h[kHeaderFields + d] = data.size(d);
  std::memcpy(message.data_ptr(), h.data(), kHeaderBytes);
}

Header read_header(const at::Tensor& message) {
  Header h;
  std::memcpy(h.data(), message.data_ptr(), kHeaderBytes);
  return h;
}

// The data's bytes for a header's dtype and shape, or -1 where the header is no stage transfer's.
int64_t data_bytes_of(const Header& h) {
  const bool valid = h[0] == kTag && (h[1] == 1 || h[1] == 2) && h[4] >= 0 && h[4] < static_cast<int64_t>(at::ScalarType::NumOptions) &&
                     h[5] >= 0 && h[5] <= kMaxDims && (h[6] == 0 || h[6] == 1);
  if (!valid) return -1;
  int64_t bytes = static_cast<int64_t>(c10::elementSize(static_cast<at::ScalarType>(h[4])));
  for (int64_t d = 0; d < h[5]; ++d)
    if (h[kHeaderFields + d] < 0 || __builtin_mul_overflow(bytes, h[kHeaderFields + d], &bytes)) return -1;
  return bytes;
}

}  // namespace

std::string TransferId::label() const {
  const bool activation = kind == Kind::Activation;
  return "stage " + std::to_string(stage) + " -> " + std::to_string(activation ? stage + 1 : stage - 1) + ": " +
         (activation ? "activation" : "input gradient") + " of microbatch " + std::to_string(microbatch);
}

void StageMailbox::send(const at::Tensor& tensor, int64_t peer, const TransferId& id) {
  const at::Tensor data = tensor.detach().contiguous();
  Traffic& traffic = outgoing_[peer];
  const size_t ordinal = traffic.next++;
  const int64_t agreed = traffic.agreed(ordinal);
  const int64_t bytes = static_cast<int64_t>(data.nbytes());
  const bool data_inline = bytes == agreed;
  at::Tensor message = at::empty({kHeaderBytes + agreed}, at::kByte);
  write_header(message, data, id, data_inline);
  const std::string label = id.label();
  std::vector<P2POp> ops{P2POp{P2POp::Kind::Send, message, peer, label, message_tag()}};
  if (data_inline) data_of(message, data.scalar_type(), data.sizes(), bytes).copy_(data);
  else ops.push_back(P2POp{P2POp::Kind::Send, data, peer, label + " (data of a new size)"});
  traffic.record(ordinal, bytes);
  sends_.push_back(batch_isend_irecv(mesh_, dim_, ops));
  in_flight_.push_back(message);
  in_flight_.push_back(data);
}

// NCCL matches transfers in order whatever their tag: there a message and the data of a new size that
// may follow it share one order, and receives are posted when taken.
bool StageMailbox::tags_kept_apart() const { return mesh_->backend() != CommBackend::Nccl; }

void StageMailbox::start_step(const std::map<int64_t, int>& receives) {
  for (auto& [peer, traffic] : outgoing_) traffic.next = 0;
  for (auto& [peer, traffic] : incoming_) traffic.next = 0;
  unposted_ = receives;
  for (const auto& [peer, count] : receives) post_window(peer);
}

void StageMailbox::post_window(int64_t peer) {
  const size_t window = tags_kept_apart() ? kWindow : 0;
  while (posted_[peer].size() < window && unposted_[peer] > 0) post_receive(peer);
}

void StageMailbox::post_receive(int64_t peer) {
  Traffic& traffic = incoming_[peer];
  const size_t ordinal = traffic.next++;
  const int64_t agreed = traffic.agreed(ordinal);
  at::Tensor message = at::empty({kHeaderBytes + agreed}, at::kByte);
  P2PWork work = batch_isend_irecv(mesh_, dim_, {P2POp{P2POp::Kind::Recv, message, peer, "a stage transfer", message_tag()}});
  posted_[peer].push_back({message, std::move(work), ordinal});
  --unposted_[peer];
}

at::Tensor StageMailbox::take(int64_t peer, const TransferId& id) {
  if (const auto early = arrived_early_.find({peer, id}); early != arrived_early_.end()) {
    at::Tensor out = early->second;
    arrived_early_.erase(early);
    return out;
  }
  const std::string label = id.label();
  while (true) {
    if (posted_[peer].empty()) {
      if (unposted_[peer] <= 0)
        throw DTensorError("pipeline: waiting for " + label + " from pp rank " + std::to_string(peer) +
                           ", which the schedule gives no more transfers to this rank in this step");
      post_receive(peer);
    }
    PostedReceive posted = std::move(posted_[peer].front());
    posted_[peer].pop_front();
    posted.work.wait();
    post_window(peer);
    auto [arrived, data] = unpack(posted, peer, label);
    if (arrived == id) return data;
    arrived_early_.emplace(std::make_tuple(peer, arrived), data);
  }
}

std::pair<TransferId, at::Tensor> StageMailbox::unpack(PostedReceive& posted, int64_t peer, const std::string& awaited) {
  const Header h = read_header(posted.message);
  const std::string context = "pipeline: waiting for " + awaited + " from pp rank " + std::to_string(peer);
  const int64_t bytes = data_bytes_of(h);
  if (bytes < 0) throw DTensorError(context + ", received a message that is no stage transfer");
  const TransferId arrived{static_cast<TransferId::Kind>(h[1]), h[2], h[3]};
  const auto dtype = static_cast<at::ScalarType>(h[4]);
  const std::vector<int64_t> shape(h.begin() + kHeaderFields, h.begin() + kHeaderFields + h[5]);
  if (h[6] == 1) {
    if (bytes != posted.message.numel() - kHeaderBytes)
      throw DTensorError(context + ", received " + arrived.label() + " whose shape disagrees with its size");
    return {arrived, data_of(posted.message, dtype, shape, bytes)};
  }
  at::Tensor data = at::empty(shape, at::TensorOptions().dtype(dtype));
  recv(data, peer, mesh_, dim_, arrived.label());
  incoming_[peer].record(posted.ordinal, bytes);
  return {arrived, data};
}

void StageMailbox::abandon_receives() {
  static std::mutex mutex;
  static auto* abandoned = new std::vector<PostedReceive>();  // never destroyed: nothing waits on them
  const std::lock_guard<std::mutex> lock(mutex);
  for (auto& [peer, receives] : posted_)
    for (PostedReceive& posted : receives) abandoned->push_back(std::move(posted));
  posted_.clear();
  unposted_.clear();
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
  for (const auto& [peer, receives] : posted_) {
    const int missing = static_cast<int>(receives.size()) + unposted_[peer];
    if (missing > 0) {
      const std::string error = "pipeline: the step ended waiting for " + std::to_string(missing) + " more transfer(s) from pp rank " +
                                std::to_string(peer) + ": the schedule and the peer's disagree";
      abandon_receives();
      throw DTensorError(error);
    }
  }
}

}  // namespace dtensor::pipeline::detail
