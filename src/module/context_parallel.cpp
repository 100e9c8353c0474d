#include "dtensor/context_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <string>
#include <utility>
#include <vector>

#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "dtensor/sharding.h"
#include "context_sequence.h"

namespace dtensor {
namespace {

void check_one_dim(const DeviceMesh& mesh, const char* caller) {
  if (mesh.ndim() != 1)
    throw DTensorError(std::string(caller) + ": the context-parallel mesh must be 1-d, but has " + std::to_string(mesh.ndim()) +
                       " dims; pass its cp dim (mesh[\"cp\"])");
}

int64_t normalized_dim(const at::Tensor& t, int64_t seq_dim, const char* caller) {
  if (seq_dim < -t.dim() || seq_dim >= t.dim())
    throw DTensorError(std::string(caller) + ": sequence dim " + std::to_string(seq_dim) + " is out of range for a tensor of " +
                       std::to_string(t.dim()) + " dims");
  return seq_dim < 0 ? seq_dim + t.dim() : seq_dim;
}

std::string label(const DeviceMesh& mesh) { return "context parallel over " + mesh.dim_label(0); }

struct ActiveScope {
  const DeviceMesh* mesh;
  detail::ContextSequence sequence;
};
thread_local std::vector<ActiveScope> g_active_scopes;  // innermost last

}  // namespace

namespace detail {

std::optional<ContextSequence> context_sequence(const DeviceMesh& mesh) {
  for (auto it = g_active_scopes.rbegin(); it != g_active_scopes.rend(); ++it)
    if (it->mesh == &mesh) return it->sequence;
  return std::nullopt;
}

std::optional<int64_t> context_sequence_size(const DeviceMesh& mesh, int64_t local) {
  const std::optional<ContextSequence> sequence = context_sequence(mesh);
  if (!sequence) return std::nullopt;
  int64_t own = 0;
  for (const SequenceRun& run : sequence_runs(sequence->length, mesh.size(0), mesh.local_rank(0), sequence->load_balanced, label(mesh)))
    own += run.size;
  return own == local ? std::optional<int64_t>(sequence->length) : std::nullopt;
}

}  // namespace detail

at::Tensor context_parallel_shard(const at::Tensor& whole, const DeviceMesh& mesh, int64_t seq_dim, const ContextParallelOptions& options) {
  check_one_dim(mesh, "context_parallel_shard");
  const int64_t dim = normalized_dim(whole, seq_dim, "context_parallel_shard");
  std::vector<at::Tensor> runs;
  for (const SequenceRun& run : sequence_runs(whole.size(dim), mesh.size(0), mesh.local_rank(0), options.load_balance, label(mesh)))
    runs.push_back(whole.narrow(dim, run.global_offset, run.size));
  return at::cat(runs, dim);
}

at::Tensor context_parallel_unshard(const at::Tensor& local, const MeshPtr& mesh, int64_t seq_dim, const ContextParallelOptions& options) {
  check_one_dim(*mesh, "context_parallel_unshard");
  const int64_t dim = normalized_dim(local, seq_dim, "context_parallel_unshard");
  // Uneven torch.chunk pieces need their global length: from_local's check gathers it (head-tail ones
  // are even). The head-tail placement gathers the chunks into the sequence's order.
  const Placement sharded = options.load_balance ? HeadTailShard(dim) : Shard(dim);
  return full_tensor(from_local(local, mesh, {sharded}, {.run_check = !options.load_balance}));
}

ContextParallel::ContextParallel(MeshPtr mesh, std::vector<at::Tensor> buffers, std::vector<int64_t> seq_dims, ContextParallelOptions options)
    : buffers_(std::move(buffers)), previous_load_balance_(context_parallel_load_balance()) {
  check_one_dim(*mesh, "context_parallel");
  if (seq_dims.size() != buffers_.size())
    throw DTensorError("context_parallel: " + std::to_string(buffers_.size()) + " buffers but " + std::to_string(seq_dims.size()) +
                       " sequence dims; give one per buffer");
  int64_t length = 0;  // buffer 0's, which every buffer must share
  std::vector<at::Tensor> locals;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const at::Tensor& buffer = buffers_[i];
    const std::string which = "context_parallel: buffer " + std::to_string(i);
    if (!buffer.defined() || is_dtensor(buffer))
      throw DTensorError(which + " must be a defined plain tensor (its whole sequence), not " + (buffer.defined() ? "a DTensor" : "undefined"));
    const int64_t dim = normalized_dim(buffer, seq_dims[i], "context_parallel");
    if (i == 0) length = buffer.size(dim);
    if (buffer.size(dim) != length)
      throw DTensorError(which + " has " + std::to_string(buffer.size(dim)) + " positions along dim " + std::to_string(dim) + ", but buffer 0 has " +
                         std::to_string(length) + ": every buffer (tokens, position ids, labels) must be sharded like the others over " +
                         mesh->dim_label(0) + ", so give each its whole sequence");
    locals.push_back(context_parallel_shard(buffer, *mesh, dim, options));
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    wholes_.push_back(at::empty({0}, buffers_[i].options()).set_(buffers_[i]));
    buffers_[i].set_(locals[i]);
  }
  set_context_parallel_load_balance(options.load_balance);
  mesh_ = std::move(mesh);
  g_active_scopes.push_back({mesh_.get(), {length, options.load_balance}});
}

ContextParallel::~ContextParallel() {
  g_active_scopes.pop_back();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].set_(wholes_[i]);
  set_context_parallel_load_balance(previous_load_balance_);
}

PrepareModuleInputOutput context_parallel_attention_style() {
  const std::vector<std::optional<Placement>> sequence(3, Shard(2));
  return {.input = {sequence, sequence, /*use_local_output=*/false}, .output = {Shard(2), Shard(2), /*use_local_output=*/true}};
}

}  // namespace dtensor
