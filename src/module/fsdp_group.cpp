#include "fsdp_group.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mutex>
#include <unordered_set>

#include "../mesh/collectives.h"
#include "../tensor/autograd_node_ptr.h"
#include "../tensor/pending_local.h"
#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "parameter_slots.h"

namespace dtensor::detail {
namespace {

// The backward of a group's gather: the whole parameters' gradients go back to the shards in one
// reduce-scatter.
struct FsdpGatherBackward : torch::autograd::Node {
  explicit FsdpGatherBackward(std::shared_ptr<FsdpGroup> group) : group(std::move(group)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    return group->reduce_gradients(grads);
  }
  std::string name() const override { return "dtensor::FsdpGatherBackward"; }
  std::shared_ptr<FsdpGroup> group;
};

// Indices of the sharded dim that dp rank `r` holds when torch.chunk cuts `rows` into chunks of
// `per_rank`.
int64_t rows_on(int64_t r, int64_t rows, int64_t per_rank) {
  return std::clamp<int64_t>(rows - r * per_rank, 0, per_rank);
}

// The storages of the live groups (what is_gathered_fsdp_parameter looks up).
std::mutex storages_mutex;
std::unordered_set<const c10::StorageImpl*>& group_storages() {
  static std::unordered_set<const c10::StorageImpl*> storages;
  return storages;
}

int64_t version_of(const at::Tensor& t) { return static_cast<int64_t>(t._version()); }

// `shape` with the sharded dim moved to the front and `rows` long: a block of the flat buffers.
std::vector<int64_t> block_shape(const FsdpGroup::Param& p, int64_t rows) {
  std::vector<int64_t> out{rows};
  for (int64_t d = 0; d < static_cast<int64_t>(p.shape.size()); ++d)
    if (d != p.dim) out.push_back(p.shape[d]);
  return out;
}

// The plain tensor of a gathered parameter or of its gradient (a TP parameter's local shard).
const at::Tensor& plain(const at::Tensor& t) { return is_dtensor(t) ? local_tensor_of(t) : t; }

}  // namespace

FsdpGroup::FsdpGroup(std::string name, MeshPtr mesh, int64_t dp_dim, int64_t replicate_dim, FullyShardOptions options,
                     std::vector<Param> params)
    : name_(std::move(name)),
      mesh_(std::move(mesh)),
      dp_dim_(dp_dim),
      replicate_dim_(replicate_dim),
      dp_size_(mesh_->size(dp_dim)),
      dp_rank_((*mesh_->coordinate())[dp_dim]),
      options_(std::move(options)),
      params_(std::move(params)),
      label_("fully_shard(" + name_ + ")"),
      offloaded_(offloads_to_host(options_, *mesh_)) {
  for (Param& p : params_) {
    int64_t numel = 1;
    for (int64_t extent : p.shape) numel *= extent;
    if (p.dim < 0) {
      p.row_numel = numel;
      p.flat_offset = replicated_numel_;
      replicated_numel_ += numel;
    } else {
      p.row_numel = p.shape[p.dim] == 0 ? 0 : numel / p.shape[p.dim];
      p.rows_per_rank = (p.shape[p.dim] + dp_size_ - 1) / dp_size_;
      p.flat_offset = shard_numel_;
      shard_numel_ += p.padded_numel();
    }
    p.whole_offset = whole_numel_;
    whole_numel_ += numel;
  }
  storage_ = c10::Storage(c10::Storage::use_byte_size_t(), 0, fsdp_buffer_allocator(mesh_->device_type()),
                          /*resizable=*/true);
  alias_shards_into_send_buffer();
  std::lock_guard<std::mutex> lock(storages_mutex);
  group_storages().insert(storage_.unsafeGetStorageImpl());
}

FsdpGroup::~FsdpGroup() {
  std::lock_guard<std::mutex> lock(storages_mutex);
  group_storages().erase(storage_.unsafeGetStorageImpl());
}

at::ScalarType FsdpGroup::compute_dtype() const {
  return options_.mp_policy.param_dtype.value_or(params_.empty() ? at::kFloat : params_.front().sharded.scalar_type());
}

at::ScalarType FsdpGroup::reduce_dtype() const { return options_.mp_policy.reduce_dtype.value_or(compute_dtype()); }

at::TensorOptions FsdpGroup::options_of(at::ScalarType dtype) const {
  return at::TensorOptions().dtype(dtype).device(storage_.device());
}

void FsdpGroup::allocate_storage() {
  c10::StorageImpl* impl = storage_.unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(whole_numel_) * c10::elementSize(compute_dtype());
  impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  impl->set_nbytes(bytes);
}

void FsdpGroup::free_storage() {
  c10::StorageImpl* impl = storage_.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(0);
  storage_filled_ = false;
}

at::Tensor FsdpGroup::storage_view(const Param& p) const {
  // set_ rather than a view op: a view would share one version counter with its base, so filling the
  // storage again before backward would look to autograd like a change to what it saved.
  at::Tensor t = at::empty({0}, options_of(compute_dtype()));
  std::vector<int64_t> strides(p.shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(p.shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * p.shape[d + 1];
  t.set_(storage_, p.whole_offset, p.shape, strides);
  return t;
}

bool FsdpGroup::shards_changed() const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (gathered_versions_[2 * i] != version_of(params_[i].sharded) ||
        gathered_versions_[2 * i + 1] != version_of(local_tensor_of(params_[i].sharded)))
      return true;
  return false;
}

void FsdpGroup::alias_shards_into_send_buffer() {
  at::NoGradGuard no_grad;
  send_buffer_ = at::zeros({shard_numel_}, options_of(compute_dtype()));  // padding included: never garbage on the wire
  for (const Param& p : params_) {
    const at::Tensor& local = local_tensor_of(p.sharded);
    // Offloaded shards stay in host memory: the send buffer is on the device.
    if (p.dim != 0 || local.scalar_type() != compute_dtype() || local.numel() == 0 || local.device() != send_buffer_.device())
      continue;
    send_buffer_.narrow(0, p.flat_offset, local.numel()).view(local.sizes()).copy_(local);
    local.set_(send_buffer_.storage(), send_buffer_.storage_offset() + p.flat_offset, local.sizes(), c10::contiguous_strides(local.sizes()));
  }
}

// Whether `p`'s shard still lies in the send buffer (nobody replaced its storage since).
bool FsdpGroup::aliases_send_buffer(const Param& p) const {
  const at::Tensor& local = local_tensor_of(p.sharded);
  return p.dim == 0 && local.is_contiguous() && local.scalar_type() == send_buffer_.scalar_type() &&
         local.device() == send_buffer_.device() &&
         local.data_ptr() == static_cast<const char*>(send_buffer_.const_data_ptr()) + p.flat_offset * send_buffer_.element_size();
}

void FsdpGroup::start_gather() {
  at::NoGradGuard no_grad;
  const CommContext context(label_.c_str());
  gathered_versions_.clear();
  for (const Param& p : params_) {
    const at::Tensor& local = local_tensor_of(p.sharded);
    gathered_versions_.push_back(version_of(p.sharded));
    gathered_versions_.push_back(version_of(local));
    // From pinned host memory (offload) the copy to the device need not block: the all-gather is
    // ordered after it on the device.
    if (p.dim >= 0 && local.numel() > 0 && !aliases_send_buffer(p))
      send_buffer_.narrow(0, p.flat_offset, local.numel())
          .view(block_shape(p, local.size(p.dim)))
          .copy_(local.movedim(p.dim, 0), /*non_blocking=*/local.is_pinned());
  }
  gathering_ = shard_numel_ > 0 ? start_all_gather(mesh_, dp_dim_, send_buffer_,
                                                    fsdp_buffer(dp_size_ * shard_numel_, send_buffer_.options()))
                                 : StartedCollective(send_buffer_);
}

void FsdpGroup::gather_into_storage() {
  at::NoGradGuard no_grad;
  // A prefetch whose shards changed since (an optimizer step in between) is stale: gather again.
  if (!gathering_ || shards_changed()) start_gather();
  const at::Tensor all = gathering_->wait().view({dp_size_, shard_numel_});
  gathering_.reset();
  if (storage_.nbytes() == 0) allocate_storage();
  for (const Param& p : params_) {
    const at::Tensor whole = storage_view(p);
    if (p.dim < 0) {
      whole.copy_(local_tensor_of(p.sharded));
      continue;
    }
    const at::Tensor blocks = all.narrow(1, p.flat_offset, p.padded_numel()).view({dp_size_, p.rows_per_rank, p.row_numel});
    if (p.dim == 0 && p.shape[0] == dp_size_ * p.rows_per_rank) {
      whole.view({dp_size_, p.rows_per_rank, p.row_numel}).copy_(blocks);
      continue;
    }
    const at::Tensor moved = whole.movedim(p.dim, 0);
    for (int64_t r = 0; r < dp_size_; ++r)
      if (const int64_t rows = rows_on(r, p.shape[p.dim], p.rows_per_rank); rows > 0)
        moved.narrow(0, r * p.rows_per_rank, rows).copy_(blocks[r].narrow(0, 0, rows).view(block_shape(p, rows)));
  }
  storage_filled_ = true;
}

std::shared_ptr<FsdpGroup> FsdpGroup::neighbour(int step) const {
  const auto root = root_.lock();
  if (!root) return nullptr;
  const auto& order = root->forward_order_;
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].lock().get() == this) {
      const auto j = static_cast<int64_t>(i) + step;
      return j >= 0 && j < static_cast<int64_t>(order.size()) ? order[static_cast<size_t>(j)].lock() : nullptr;
    }
  return nullptr;
}

void FsdpGroup::prefetch(bool for_backward) {
  if (for_backward && !unshard_in_backward_) return;
  if (!storage_filled_ && !gathering_) start_gather();
}

void FsdpGroup::prefetch_all(const std::vector<std::weak_ptr<FsdpGroup>>& groups, bool for_backward) {
  for (const auto& weak : groups)
    if (const auto group = weak.lock()) group->prefetch(for_backward);
}

void FsdpGroup::start_unshard() {
  // Gathered already (kept after forward or backward): nothing to start, the parameters go in now.
  if (storage_filled_ && !shards_changed()) return unshard();
  if (!gathering_ || shards_changed()) start_gather();
}

void FsdpGroup::wait_for_unshard() {
  if (gathering_) unshard();
}

void FsdpGroup::set_path(const std::string& path) { label_ = "fully_shard(" + (path.empty() ? name_ : path) + ")"; }

void FsdpGroup::before_forward() {
  in_backward_ = false;
  if (held()) return unshard();  // inside call_as_forward: gathered already
  const auto root = root_.lock();
  if (root.get() == this) {
    recording_.clear();
    recorded_.clear();
  }
  // Each group once, at its first forward: a module run again later in the same forward (a generate
  // loop inside call_as_forward) has no successor worth prefetching at the end.
  if (root && root->recorded_.insert(this).second) root->recording_.push_back(weak_from_this());
  unshard();
  if (!forward_prefetch_.empty()) return prefetch_all(forward_prefetch_, false);
  if (const auto next = neighbour(+1); next && next->options_.overlap && next->options_.reshard_after_forward)
    next->prefetch(false);
}

bool FsdpGroup::after_forward(bool backward_follows) {
  if (held()) return false;  // call_as_forward's own end decides
  if (is_root()) forward_order_ = recording_;
  // Without a backward nothing saved the gathered parameters; the root's backward comes at once (unless
  // set_reshard_after_forward said otherwise).
  const bool keep = backward_follows && (!options_.reshard_after_forward || (is_root() && !reshard_after_forward_set_));
  if (!keep) reshard();
  return backward_follows && (!keep || !backward_prefetch_.empty());
}

void FsdpGroup::before_backward() {
  // Once per backward: a forward with several outputs has a hook on each.
  if (in_backward_) return;
  in_backward_ = true;
  // set_unshard_in_backward(false): backward reads none of the parameters, so they stay freed.
  if (!storage_filled_ && unshard_in_backward_) gather_into_storage();
  if (!backward_prefetch_.empty()) return prefetch_all(backward_prefetch_, true);
  if (const auto previous = neighbour(-1); previous && previous->options_.overlap && !previous->is_root())
    previous->prefetch(true);
}

void FsdpGroup::reset_iter_state() {
  at::NoGradGuard no_grad;
  if (gathering_) gathering_->wait();  // started on every rank: completed on every rank
  gathering_.reset();
  if (reducing_)
    for (StartedCollective& reduction : *reducing_) reduction.wait();
  reducing_.reset();
  reshard();
  held_ = 0;
  in_backward_ = false;
  recording_.clear();
  recorded_.clear();
  pending_grads_ = pending_replicated_ = partial_grads_ = partial_replicated_ = at::Tensor();
  grads_held_.clear();
}

void FsdpGroup::point_slots(const std::vector<at::Tensor>& values) {
  for (size_t i = 0; i < params_.size(); ++i)
    for (const ParameterSlot& slot : params_[i].slots) set_parameter_slots(*slot.module, slot.name, values[i]);
}

void FsdpGroup::unshard() {
  const bool stale = storage_filled_ && shards_changed();
  if (!storage_filled_ || stale) gather_into_storage();
  const bool wants_graph = torch::autograd::GradMode::is_enabled();
  if (unsharded_ && !stale && (connected_ || !wants_graph)) return;
  std::vector<at::Tensor> whole;
  whole.reserve(params_.size());
  for (const Param& p : params_)
    whole.push_back(p.gathered_spec ? make_dtensor(storage_view(p), p.gathered_spec) : storage_view(p));
  connected_ = false;
  if (wants_graph) {
    std::vector<at::Tensor> sharded;
    for (const Param& p : params_) sharded.push_back(p.sharded);
    auto node = make_node<FsdpGatherBackward>(shared_from_this());
    node->set_next_edges(torch::autograd::collect_next_edges(sharded));
    for (at::Tensor& w : whole) torch::autograd::create_gradient_edge(w, node);
    connected_ = true;
  }
  point_slots(whole);
  unsharded_ = true;
}

void FsdpGroup::reshard() {
  if (unsharded_) {
    std::vector<at::Tensor> sharded;
    for (const Param& p : params_) sharded.push_back(p.sharded);
    point_slots(sharded);
  }
  unsharded_ = false;
  connected_ = false;
  free_storage();
}

std::vector<at::Tensor> FsdpGroup::reduce_gradients(const std::vector<at::Tensor>& whole_grads) {
  at::NoGradGuard no_grad;
  in_backward_ = false;
  // Everything that read the gathered parameters has run: free them before the reduction's buffers
  // (or, kept for the next forward, leave the whole parameters in the module).
  if (reshard_after_backward_)
    reshard();
  else
    unshard();
  // One group's reduction in flight at a time (as FSDP2): the previous group's completes before this
  // one's buffers are made, so its [N x shard] input is freed instead of every group's piling up until
  // the optimizer step reads the gradients.
  const auto root = root_.lock();
  if (root && root->reducing_) {
    for (StartedCollective& previous : *root->reducing_) previous.wait();
    root->reducing_.reset();
  }
  const bool fresh = !pending_grads_.defined();
  const at::Tensor flat = fresh ? fsdp_buffer(dp_size_ * shard_numel_, options_of(reduce_dtype())) : pending_grads_;
  const at::Tensor replicated = fresh ? at::empty({replicated_numel_}, options_of(reduce_dtype())) : pending_replicated_;
  pack_gradients(whole_grads, flat, replicated, fresh);
  std::vector<bool> has_grad(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) has_grad[i] = whole_grads[i].defined() || (i < grads_held_.size() && grads_held_[i]);
  if (!requires_sync_) {
    pending_grads_ = flat;
    pending_replicated_ = replicated;
    grads_held_ = std::move(has_grad);
    return std::vector<at::Tensor>(params_.size());
  }
  pending_grads_ = pending_replicated_ = at::Tensor();
  if (divide_factor_) {  // summed, then divided: the division first, as NCCL's PreMulSum (FSDP2's)
    flat.div_(*divide_factor_);
    replicated.div_(*divide_factor_);
  }
  return start_reductions(std::move(has_grad), flat, replicated);
}

void FsdpGroup::pack_gradients(const std::vector<at::Tensor>& whole_grads, const at::Tensor& flat,
                               const at::Tensor& replicated, bool fresh) const {
  // Fresh buffers take each gradient by a copy (not zeros and an add: a pass less over them); what no
  // gradient covers (padding, unused parameters) is zeroed.
  const auto take = [fresh](const at::Tensor& into, const at::Tensor& grad) { fresh ? into.copy_(grad) : into.add_(grad); };
  const at::Tensor per_rank = flat.view({dp_size_, shard_numel_});
  if (fresh)
    for (size_t i = 0; i < params_.size(); ++i) {
      const Param& p = params_[i];
      if (p.dim < 0) {
        if (!whole_grads[i].defined()) replicated.narrow(0, p.flat_offset, p.row_numel).zero_();
        continue;
      }
      const at::Tensor blocks = per_rank.narrow(1, p.flat_offset, p.padded_numel()).view({dp_size_, p.rows_per_rank, p.row_numel});
      for (int64_t r = 0; r < dp_size_; ++r) {
        const int64_t covered = whole_grads[i].defined() ? rows_on(r, p.shape[p.dim], p.rows_per_rank) : 0;
        if (covered < p.rows_per_rank) blocks[r].narrow(0, covered, p.rows_per_rank - covered).zero_();
      }
    }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    if (!whole_grads[i].defined()) continue;
    at::Tensor grad = whole_grads[i];
    if (is_dtensor(grad) != static_cast<bool>(p.gathered_spec))
      throw DTensorError("fully_shard group " + name_ + ": the gradient of " + p.slots.front().path + " is " +
                         (is_dtensor(grad) ? "a DTensor" : "a plain tensor") + " but its gathered parameter " +
                         (p.gathered_spec ? "is a DTensor" : "is not") +
                         "; a fully-sharded module's forward must use its parameters as they are gathered");
    // A tensor-parallel gradient may arrive Partial over TP: reduce it to the parameter's layout first.
    if (p.gathered_spec && placements_of(grad) != p.gathered_spec->placements)
      grad = redistribute(grad, p.gathered_spec->mesh, p.gathered_spec->placements);
    const at::Tensor& local = plain(grad);
    if (p.dim < 0) {
      take(replicated.narrow(0, p.flat_offset, p.row_numel).view(p.shape), local);
      continue;
    }
    const at::Tensor blocks = per_rank.narrow(1, p.flat_offset, p.padded_numel()).view({dp_size_, p.rows_per_rank, p.row_numel});
    if (p.dim == 0 && p.shape[0] == dp_size_ * p.rows_per_rank) {
      take(blocks, local.reshape({dp_size_, p.rows_per_rank, p.row_numel}));
      continue;
    }
    const at::Tensor moved = local.movedim(p.dim, 0);
    for (int64_t r = 0; r < dp_size_; ++r)
      if (const int64_t rows = rows_on(r, p.shape[p.dim], p.rows_per_rank); rows > 0)
        take(blocks[r].narrow(0, 0, rows).view(block_shape(p, rows)), moved.narrow(0, r * p.rows_per_rank, rows));
  }
}

std::vector<at::Tensor> FsdpGroup::start_reductions(std::vector<bool> has_grad, const at::Tensor& flat, const at::Tensor& replicated) {
  const CommContext context(label_.c_str());
  StartedCollective mine = over_replicas(
      shard_numel_ > 0 ? start_reduce_scatter(mesh_, dp_dim_, flat, reduce_op()) : StartedCollective(flat), partial_grads_);
  StartedCollective averaged = over_replicas(
      replicated_numel_ > 0 ? start_all_reduce(mesh_, dp_dim_, replicated, reduce_op()) : StartedCollective(replicated),
      partial_replicated_);
  // HSDP without the all-reduce: the reduced shards wait in the partial buffers, the gradients unchanged.
  if (replicate_dim_ >= 0 && !all_reduce_) {
    grads_held_ = std::move(has_grad);
    return std::vector<at::Tensor>(params_.size());
  }
  grads_held_.clear();
  if (all_reduce_hook_) {  // called with the reduced shards, which it may change in place: before anything reads them
    for (StartedCollective* reduced : {&mine, &averaged})
      if (reduced->wait().numel() > 0) all_reduce_hook_(reduced->wait());
  }
  if (const auto root = root_.lock(); root && options_.overlap) root->reducing_ = std::vector<StartedCollective>{mine, averaged};
  std::vector<at::Tensor> grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!has_grad[i]) continue;
    // The gradient as this rank's piece of the reduced buffers, made once they arrive.
    auto finish = [this, self = shared_from_this(), i, mine, averaged]() mutable {
      return shard_gradient(params_[i], mine.wait(), averaged.wait());
    };
    const at::Tensor& local = local_tensor_of(params_[i].sharded);
    grads[i] = options_.overlap ? make_pending_dtensor(dtensor_impl(params_[i].sharded).shared_spec(), local.options(), finish)
                                : make_dtensor(finish(), dtensor_impl(params_[i].sharded).shared_spec());
  }
  return grads;
}

StartedCollective FsdpGroup::over_replicas(StartedCollective reduced, at::Tensor& partial) const {
  if (replicate_dim_ < 0) return reduced;
  // The second stage starts once the first completes: what stays in flight is the all-reduce over the
  // replicas, the collective that crosses hosts when dp spans one.
  const at::Tensor& shard = reduced.wait();
  if (!all_reduce_) {
    partial = partial.defined() ? partial.add_(shard) : shard.clone();
    return reduced;
  }
  if (partial.defined()) shard.add_(partial);
  partial = at::Tensor();
  return shard.numel() == 0 ? reduced : start_all_reduce(mesh_, replicate_dim_, shard, reduce_op());
}

at::Tensor FsdpGroup::shard_gradient(const Param& p, const at::Tensor& mine, const at::Tensor& replicated) const {
  const at::Tensor& local = local_tensor_of(p.sharded);
  at::Tensor grad;
  if (p.dim < 0) {
    grad = replicated.narrow(0, p.flat_offset, p.row_numel).view(local.sizes());
  } else {
    const int64_t rows = rows_on(dp_rank_, p.shape[p.dim], p.rows_per_rank);
    grad = mine.view({shard_numel_}).narrow(0, p.flat_offset, rows * p.row_numel).view(block_shape(p, rows)).movedim(0, p.dim);
  }
  // Offloaded: back to the host, where the shard and the optimizer state live (a blocking copy).
  return grad.to(local.device(), local.scalar_type()).contiguous();
}

bool offloads_to_host(const FullyShardOptions& options, const DeviceMesh& mesh) {
  return std::holds_alternative<CPUOffloadPolicy>(options.offload_policy) && mesh.device_type() != c10::DeviceType::CPU;
}

bool is_gathered_fsdp_parameter(const at::Tensor& tensor) {
  if (!tensor.defined()) return false;
  const at::Tensor& t = plain(tensor);
  if (!t.has_storage()) return false;
  std::lock_guard<std::mutex> lock(storages_mutex);
  return group_storages().count(t.storage().unsafeGetStorageImpl()) > 0;
}

}  // namespace dtensor::detail
