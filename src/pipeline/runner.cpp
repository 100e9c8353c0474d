#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include "dtensor/errors.h"
#include "dtensor/fsdp.h"
#include "dtensor/pipeline.h"
#include "microbatches.h"
#include "split_backward.h"
#include "stage_mailbox.h"

namespace dtensor::pipeline {
namespace detail {

// What a stage keeps of one microbatch from its forward to its backward.
struct MicrobatchState {
  at::Tensor input;        // the stage's input: a leaf that requires grad, but on the first stage
  at::Tensor output;       // its output; on the last stage its loss, scaled by 1 / microbatches
  at::Tensor output_grad;  // the gradient of the output, from the next stage (undefined on the last)
  at::Tensor input_grad;   // the gradient of the input, for the previous stage
  WeightBackward weight_backward;  // what I left for W (a split backward past the first stage)
};

}  // namespace detail

namespace {

using detail::TransferId;

std::vector<at::Tensor> requiring_grad(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> out;
  std::copy_if(parameters.begin(), parameters.end(), std::back_inserter(out), [](const at::Tensor& p) { return p.requires_grad(); });
  return out;
}

}  // namespace

struct PipelineRunner::Impl {
  Schedule schedule;  // with communication
  std::map<int, PipelineStage> stages;
  MeshPtr mesh;
  int64_t pp_dim;
  LossFunction loss;
  int rank;
  detail::StageMailbox mailbox;
  // The step in flight.
  std::vector<at::Tensor> inputs, targets, losses;
  std::map<std::pair<int, int>, detail::MicrobatchState> states;  // (stage, microbatch)
  double compute_seconds = 0, receive_seconds = 0;
  bool failed = false;  // a step threw: what it left posted would meet the next step's transfers
  std::map<int64_t, int> receives;  // receives_per_peer(), for the receives each step posts
  // Each fully-sharded module of this rank's stages: the slot of its last weight backward in a step.
  std::map<const torch::nn::Module*, size_t> last_weight_backward;
  // Per stage: the parameters whose gradients its weight backward makes. Its own, and those of the
  // other stages of this rank holding a fully-sharded module with it, which get theirs when its W
  // reduces the module (a W computes only the parameters it names).
  std::map<int, std::vector<at::Tensor>> weight_parameters;

  Impl(Schedule lowered, MeshPtr m, int64_t dim, LossFunction l)
      : schedule(std::move(lowered)), mesh(m), pp_dim(dim), loss(std::move(l)), rank(static_cast<int>(m->local_rank(dim))), mailbox(m, dim),
        receives(receives_per_peer()) {}

  bool local(int stage) const { return schedule.rank_of(stage) == rank; }
  int last_stage() const { return schedule.num_stages - 1; }
  detail::MicrobatchState& state(int stage, int microbatch) { return states[{stage, microbatch}]; }

  void run(const Action& action) {
    switch (action.kind) {
      case ActionKind::Forward: return forward(action.stage, action.microbatch);
      case ActionKind::FullBackward: return backward_input(action.stage, action.microbatch, true);
      case ActionKind::BackwardInput: return backward_input(action.stage, action.microbatch, false);
      case ActionKind::BackwardWeight: return backward_weight(action.stage, action.microbatch);
      case ActionKind::SendForward:
        return mailbox.send(state(action.stage, action.microbatch).output, schedule.rank_of(action.stage + 1),
                            {TransferId::Kind::Activation, action.stage, action.microbatch});
      case ActionKind::SendBackward:
        return mailbox.send(state(action.stage, action.microbatch).input_grad, schedule.rank_of(action.stage - 1),
                            {TransferId::Kind::Gradient, action.stage, action.microbatch});
      // A receive is taken where its compute needs it, as PyTorch's runtime waits on an irecv posted
      // here: blocking at the RECV would hold back the compute between it and its use (a RECV_F placed
      // before the B of an earlier microbatch would make that B wait for the next activation).
      case ActionKind::RecvForward:
      case ActionKind::RecvBackward: return;
    }
  }

  // How many transfers this rank's actions take from each peer in a step.
  std::map<int64_t, int> receives_per_peer() const {
    std::map<int64_t, int> receives;
    for (const Slot& slot : schedule.ranks.at(static_cast<size_t>(rank)))
      if (slot && (slot->kind == ActionKind::RecvForward || slot->kind == ActionKind::RecvBackward))
        ++receives[schedule.rank_of(slot->kind == ActionKind::RecvForward ? slot->stage - 1 : slot->stage + 1)];
    return receives;
  }

  void find_last_weight_backwards() {
    const std::vector<Slot>& slots = schedule.ranks.at(static_cast<size_t>(rank));
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i] && computes_weight_gradients(slots[i]->kind))
        for (const auto& module : stages.at(slots[i]->stage).modules)
          if (is_fully_sharded(*module)) last_weight_backward[module.get()] = i;
    for (const auto& [index, stage] : stages) {
      std::vector<at::Tensor>& parameters = weight_parameters[index];
      for (const auto& [other_index, other] : stages) {
        const std::vector<std::shared_ptr<torch::nn::Module>>& held = other.modules;  // a lambda may not capture a binding (clang)
        const bool shares = other_index == index || std::any_of(stage.modules.begin(), stage.modules.end(), [&](const auto& module) {
                              return last_weight_backward.count(module.get()) && std::find(held.begin(), held.end(), module) != held.end();
                            });
        if (shares) parameters.insert(parameters.end(), other.parameters.begin(), other.parameters.end());
      }
    }
  }

  // Before the weight backward in `slot` (of `stage`): its fully-sharded modules accumulate their whole
  // gradients and stay gathered, or, at their last weight backward of the step, reduce the sum.
  void set_gradient_sync(size_t slot, int stage) {
    for (const auto& module : stages.at(stage).modules) {
      const auto last = last_weight_backward.find(module.get());
      if (last == last_weight_backward.end()) continue;
      const bool reduce = slot == last->second;
      set_requires_gradient_sync(*module, reduce, /*recurse=*/false);
      set_reshard_after_backward(*module, reduce, /*recurse=*/false);
    }
  }

  // The transfer `id` from the rank holding `stage`, waiting for it (not counted as computing).
  at::Tensor take(int stage, const TransferId& id) {
    const auto start = std::chrono::steady_clock::now();
    at::Tensor out = mailbox.take(schedule.rank_of(stage), id);
    receive_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  void forward(int stage, int microbatch) {
    detail::MicrobatchState& s = state(stage, microbatch);
    if (stage == 0) s.input = inputs.at(microbatch);
    else if (local(stage - 1)) s.input = state(stage - 1, microbatch).output;  // the turn of a V: no transfer
    else s.input = take(stage - 1, {TransferId::Kind::Activation, stage - 1, microbatch});
    // A stage's input is a leaf of its own graph: its backward stops there and hands the gradient on.
    if (stage != 0) s.input = s.input.detach().requires_grad_(true);
    at::AutoGradMode grad_mode(true);
    const at::Tensor output = stages.at(stage).forward(s.input);
    if (stage != last_stage()) {
      s.output = output;
      return;
    }
    const at::Tensor microbatch_loss = loss(output, targets.at(microbatch));
    losses.at(microbatch) = microbatch_loss.detach();
    s.output = microbatch_loss / schedule.num_microbatches;
  }

  // The gradient flowing into `stage`'s output for `microbatch`.
  at::Tensor output_grad(int stage, int microbatch) {
    detail::MicrobatchState& s = state(stage, microbatch);
    if (stage == last_stage() || s.output_grad.defined()) return s.output_grad;
    s.output_grad = local(stage + 1) ? state(stage + 1, microbatch).input_grad
                                     : take(stage + 1, {TransferId::Kind::Gradient, stage + 1, microbatch});
    return s.output_grad;
  }

  // B (`full`: the parameters' gradients too) or I (the input's alone, keeping the graph for W).
  void backward_input(int stage, int microbatch, bool full) {
    detail::MicrobatchState& s = state(stage, microbatch);
    const at::Tensor grad = output_grad(stage, microbatch);
    if (full) {
      torch::autograd::backward({s.output}, {grad});
      if (stage != 0) s.input_grad = s.input.grad();
      s.output = at::Tensor();
    } else if (stage != 0) {  // the first stage's input needs no gradient: its W is a whole backward
      std::tie(s.input_grad, s.weight_backward) = detail::backward_input(s.output, grad, s.input, requiring_grad(weight_parameters.at(stage)));
      s.output = at::Tensor();
    }
  }

  void backward_weight(int stage, int microbatch) {
    detail::MicrobatchState& s = state(stage, microbatch);
    if (stage != 0) return s.weight_backward.run();
    const std::vector<at::Tensor> parameters = requiring_grad(weight_parameters.at(stage));
    if (!parameters.empty())
      torch::autograd::backward({s.output}, {output_grad(stage, microbatch)}, /*retain_graph=*/false, /*create_graph=*/false, parameters);
    s.output = at::Tensor();
  }
};

PipelineRunner::PipelineRunner(const Schedule& schedule, std::vector<PipelineStage> stages, MeshPtr mesh, int64_t pp_dim, LossFunction loss) {
  if (!mesh || !mesh->contains_this_rank()) throw DTensorError("PipelineRunner: this rank is not in the mesh");
  if (schedule.num_ranks != mesh->size(pp_dim))
    throw DTensorError("PipelineRunner: the schedule is for " + std::to_string(schedule.num_ranks) + " ranks, but the pp dim " +
                       std::to_string(pp_dim) + " of the mesh has " + std::to_string(mesh->size(pp_dim)));
  if (!loss) throw DTensorError("PipelineRunner: no loss function");
  validate(schedule);
  impl_ = std::make_unique<Impl>(schedule.has_communication() ? schedule : with_communication(schedule), mesh, pp_dim, std::move(loss));
  for (PipelineStage& stage : stages) {
    const int index = stage.index;
    if (index < 0 || index >= schedule.num_stages || !impl_->local(index))
      throw DTensorError("PipelineRunner: stage " + std::to_string(index) + " is not one the schedule places on pp rank " + std::to_string(impl_->rank));
    if (!stage.forward) throw DTensorError("PipelineRunner: stage " + std::to_string(index) + " has no forward");
    if (std::find(stage.modules.begin(), stage.modules.end(), nullptr) != stage.modules.end())
      throw DTensorError("PipelineRunner: stage " + std::to_string(index) + " lists a null module among its modules");
    if (!impl_->stages.emplace(index, std::move(stage)).second) throw DTensorError("PipelineRunner: stage " + std::to_string(index) + " is given twice");
  }
  for (int s = 0; s < schedule.num_stages; ++s)
    if (impl_->local(s) && !impl_->stages.count(s))
      throw DTensorError("PipelineRunner: the schedule places stage " + std::to_string(s) + " on pp rank " + std::to_string(impl_->rank) +
                         ", which was not given it");
  impl_->find_last_weight_backwards();
}

PipelineRunner::~PipelineRunner() = default;

int PipelineRunner::rank() const { return impl_->rank; }

double PipelineRunner::compute_seconds() const { return impl_->compute_seconds - impl_->receive_seconds; }

at::Tensor PipelineRunner::step(const at::Tensor& inputs, const at::Tensor& targets) {
  Impl& impl = *impl_;
  if (impl.failed)
    throw DTensorError("PipelineRunner on pp rank " + std::to_string(impl.rank) +
                       ": an earlier step failed, and transfers it left posted may still match its peers' next ones: make a new mesh and "
                       "runner (after reset_iter_state on fully-sharded stages)");
  const int microbatches = impl.schedule.num_microbatches;
  impl.inputs = detail::split_microbatches(inputs, microbatches, "batch of inputs");
  impl.targets = detail::split_microbatches(targets, microbatches, "batch of targets");
  impl.losses.assign(static_cast<size_t>(microbatches), at::Tensor());
  impl.states.clear();
  impl.compute_seconds = impl.receive_seconds = 0;
  impl.failed = true;  // until the step ends well
  impl.mailbox.start_step(impl.receives);
  const std::vector<Slot>& slots = impl.schedule.ranks.at(static_cast<size_t>(impl.rank));
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    if (!slot) continue;
    try {
      const auto start = std::chrono::steady_clock::now();
      if (computes_weight_gradients(slot->kind)) impl.set_gradient_sync(i, slot->stage);
      impl.run(*slot);
      if (is_compute(slot->kind)) impl.compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } catch (const std::exception& e) {
      impl.mailbox.abandon_receives();
      throw DTensorError("pipeline rank " + std::to_string(impl.rank) + ", action " + to_string(*slot) + " (stage " + std::to_string(slot->stage) +
                         ", microbatch " + std::to_string(slot->microbatch) + "): " + e.what());
    }
  }
  impl.mailbox.finish_sends();
  impl.states.clear();
  impl.failed = false;
  if (!impl.local(impl.last_stage())) return at::Tensor();
  return at::stack(impl.losses).mean();
}

}  // namespace dtensor::pipeline
