#include "collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>

#include "dtensor/comm_backend.h"
#include "dtensor/comm_debug.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"
#include "comm_failure.h"
#include "communication_span.h"
#include "mesh_group.h"
#include "packing.h"

namespace dtensor::detail {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return c10d::ReduceOp::SUM;  // Gloo has no AVG: sum, then divide
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void divide_for_average(at::Tensor& t, int64_t n) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) t.div_(n, "trunc");
  else t.div_(n);
}

template <typename Launch>
void run(const DeviceMesh& mesh, int64_t dim, const char* operation, int64_t bytes, Launch&& launch) {
  if (auto* debug = CommDebugMode::active()) debug->record_collective(operation, dim, bytes);
  auto group = mesh.group(dim);
  const MeshGroup::Exclusive exclusive(mesh.group_holder(dim), [&] { return where(mesh, dim, operation); });
  const CommunicationSpan blocked(operation);
  const auto start = std::chrono::steady_clock::now();
  try {
    launch(*group)->wait();
  } catch (const std::exception& e) {
    throw failure(mesh, dim, operation, start, e);
  }
}

// A maximum or minimum of complex numbers does not exist (they travel as_real, packing.h).
void require_reducible(const at::Tensor& t, ReduceOp op, const char* operation) {
  if (t.is_complex() && (op == ReduceOp::Max || op == ReduceOp::Min))
    throw DTensorError(std::string(operation) + " with " + (op == ReduceOp::Max ? "max" : "min") +
                       " of a complex tensor: complex numbers are not ordered; reduce their abs() instead");
}

// An all-gather's output shape: n inputs along dim 0 (a scalar counts as one element).
std::vector<int64_t> gathered_sizes(const at::Tensor& input, int64_t n) {
  auto sizes = input.sizes().vec();
  if (sizes.empty()) sizes.push_back(1);
  sizes[0] *= n;
  return sizes;
}

// A reduce-scatter's output shape: one of the n blocks of dim 0.
std::vector<int64_t> scattered_sizes(const at::Tensor& input, int64_t n) {
  auto sizes = input.sizes().vec();
  sizes[0] /= n;
  return sizes;
}

// A group of one rank has nothing to exchange: each collective is then its local meaning (a copy where
// the caller gets a new tensor), with no process-group round trip.
bool alone(const DeviceMesh& mesh, int64_t dim) { return mesh.size(dim) == 1; }

// LibTorch 2.15 names the single-buffer collectives after torchcomms and keeps the older names as
// forwarding aliases; older LibTorch (2.11 on the GPU machines) has only the older names.
c10::intrusive_ptr<c10d::Work> all_gather_single(auto& g, at::Tensor& out, at::Tensor& in) {
  if constexpr (requires { g.all_gather_single(out, in); }) return g.all_gather_single(out, in);
  else return g._allgather_base(out, in);
}
c10::intrusive_ptr<c10d::Work> reduce_scatter_single(auto& g, at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& options) {
  if constexpr (requires { g.reduce_scatter_single(out, in, options); }) return g.reduce_scatter_single(out, in, options);
  else return g._reduce_scatter_base(out, in, options);
}
c10::intrusive_ptr<c10d::Work> all_to_all_single(auto& g, at::Tensor& out, at::Tensor& in, std::vector<int64_t>& recv_counts,
                                                  std::vector<int64_t>& send_counts) {
  if constexpr (requires { g.all_to_all_single(out, in, recv_counts, send_counts); })
    return g.all_to_all_single(out, in, recv_counts, send_counts);
  else
    return g.alltoall_base(out, in, recv_counts, send_counts);
}

}  // namespace

at::Tensor all_gather(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input) {
  const auto sizes = gathered_sizes(input, mesh.size(dim));
  if (alone(mesh, dim)) return input.reshape(sizes).clone();
  at::Tensor output = at::empty(sizes, input.options());
  at::Tensor out = as_real(output), in = as_real(input);
  run(mesh, dim, "all-gather", in.nbytes(), [&](c10d::Backend& g) { return all_gather_single(g, out, in); });
  return output;
}

void all_reduce_(const DeviceMesh& mesh, int64_t dim, at::Tensor& tensor, ReduceOp op) {
  require_reducible(tensor, op, "all-reduce");
  if (alone(mesh, dim)) return;
  std::vector<at::Tensor> tensors{as_real(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  run(mesh, dim, "all-reduce", tensor.nbytes(), [&](c10d::Backend& g) { return g.allreduce(tensors, options); });
  if (op == ReduceOp::Avg) divide_for_average(tensor, mesh.size(dim));
}

at::Tensor all_reduce(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, ReduceOp op) {
  const auto& into = mesh.backend_description().all_reduce_into;
  if (into && !alone(mesh, dim)) {
    require_reducible(input, op, "all-reduce");
    const at::Tensor in = input.contiguous();
    at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
    at::Tensor out_real = as_real(out);
    run(mesh, dim, "all-reduce", in.nbytes(), [&](c10d::Backend& g) { return into(g, out_real, as_real(in), to_c10d(op)); });
    if (op == ReduceOp::Avg) divide_for_average(out, mesh.size(dim));
    return out;
  }
  at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
  all_reduce_(mesh, dim, out, op);
  return out;
}

void all_reduce_over(const DeviceMesh& mesh, const std::vector<int64_t>& dims, at::Tensor& tensor, ReduceOp op) {
  for (int64_t d : dims) all_reduce_(mesh, d, tensor, op);
}

at::Tensor reduce_scatter(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, ReduceOp op) {
  const auto sizes = scattered_sizes(input, mesh.size(dim));
  require_reducible(input, op, "reduce-scatter");
  if (alone(mesh, dim)) return input.clone();
  at::Tensor output = at::empty(sizes, input.options());
  at::Tensor out = as_real(output), in = as_real(input);
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(op);
  run(mesh, dim, "reduce-scatter", in.nbytes(), [&](c10d::Backend& g) { return reduce_scatter_single(g, out, in, options); });
  if (op == ReduceOp::Avg) divide_for_average(output, mesh.size(dim));
  return output;
}

at::Tensor all_to_all(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, std::vector<int64_t> send_counts,
                      std::vector<int64_t> recv_counts) {
  int64_t total = 0;
  for (auto c : recv_counts) total += c;
  if (alone(mesh, dim)) return input.reshape({total}).clone();
  at::Tensor output = at::empty({total}, input.options());
  at::Tensor out = as_real(output), in = as_real(input);  // counts are rows of dim 0 either way
  run(mesh, dim, "all-to-all", in.nbytes(),
      [&](c10d::Backend& g) { return all_to_all_single(g, out, in, recv_counts, send_counts); });
  return output;
}

at::Tensor all_to_all_pieces(const DeviceMesh& mesh, int64_t dim, const std::vector<at::Tensor>& pieces,
                             const std::vector<Shape>& recv_shapes) {
  std::vector<int64_t> send_counts, recv_counts;
  for (const at::Tensor& piece : pieces) send_counts.push_back(piece.numel());
  for (const Shape& shape : recv_shapes) recv_counts.push_back(c10::multiply_integers(shape));
  if (!alone(mesh, dim) && mesh.backend_description().all_to_all_takes_views) {
    int64_t total = 0, bytes = 0;
    for (const int64_t count : recv_counts) total += count;
    at::Tensor output = at::empty({total}, pieces.front().options());
    std::vector<at::Tensor> outputs, inputs;
    int64_t at = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      outputs.push_back(as_real(output.narrow(0, at, recv_counts[i]).view(recv_shapes[i])));
      inputs.push_back(as_real(pieces[i]));
      at += recv_counts[i];
      bytes += static_cast<int64_t>(pieces[i].nbytes());
    }
    run(mesh, dim, "all-to-all", bytes, [&](c10d::Backend& g) { return g.alltoall(outputs, inputs); });
    return output;
  }
  return all_to_all(mesh, dim, packed_back_to_back(pieces), std::move(send_counts), std::move(recv_counts));
}

void broadcast_(const DeviceMesh& mesh, int64_t dim, at::Tensor& tensor, int64_t root) {
  if (alone(mesh, dim)) return;
  std::vector<at::Tensor> tensors{as_real(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run(mesh, dim, "broadcast", tensor.nbytes(), [&](c10d::Backend& g) { return g.broadcast(tensors, options); });
}

void scatter_(const DeviceMesh& mesh, int64_t dim, const std::vector<at::Tensor>& chunks, at::Tensor& output) {
  if (alone(mesh, dim)) {
    output.copy_(chunks.at(0));
    return;
  }
  std::vector<at::Tensor> outputs{as_real(output)};
  std::vector<std::vector<at::Tensor>> inputs;
  if ((*mesh.coordinate())[dim] == 0) {
    inputs.emplace_back();
    for (const at::Tensor& chunk : chunks) inputs.back().push_back(as_real(chunk));
  }
  c10d::ScatterOptions options;
  options.rootRank = 0;
  run(mesh, dim, "scatter", output.nbytes(), [&](c10d::Backend& g) { return g.scatter(outputs, inputs, options); });
}

bool any_rank(const DeviceMesh& mesh, bool flag) {
  at::Tensor t = at::full({1}, flag ? 1 : 0, at::TensorOptions().dtype(at::kInt));
  for (int64_t m = 0; m < mesh.ndim(); ++m) all_reduce_(mesh, m, t, ReduceOp::Max);
  return t.item<int>() != 0;
}

std::vector<int64_t> all_gather_values(const DeviceMesh& mesh, int64_t dim, const std::vector<int64_t>& values) {
  at::Tensor local = at::tensor(values, at::TensorOptions().dtype(at::kLong));
  at::Tensor all = all_gather(mesh, dim, local);
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
}

// Shared by the copies of a StartedCollective, so that whichever waits first completes it for all.
struct StartedCollective::InFlight {
  MeshPtr mesh;
  int64_t dim;
  const char* operation;
  std::chrono::steady_clock::time_point start;
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor input, output;  // held until the work completes
  int64_t average_over = 0;  // an Avg reduction: divide by the group size once complete
  bool complete = false;

  // Never waited for (a gradient dropped unread): the transfer may still be writing the buffers, so
  // finish it before they go. Its failure has no one left to tell.
  ~InFlight() {
    if (complete || !work) return;
    try {
      work->wait();
    } catch (const std::exception&) {
    }
  }
};

StartedCollective::StartedCollective(std::shared_ptr<InFlight> in_flight) : in_flight_(std::move(in_flight)) {}

const at::Tensor& StartedCollective::wait() {
  if (!in_flight_) return result_;
  InFlight& f = *in_flight_;
  if (!f.complete) {
    const CommunicationSpan blocked(f.operation);
    try {
      f.work->wait();
    } catch (const std::exception& e) {
      throw failure(*f.mesh, f.dim, f.operation, f.start, e);
    }
    if (f.average_over > 0) divide_for_average(f.output, f.average_over);
    // The work holds the buffers too (Gloo's keeps its input and a copy of it): let both go now, not
    // when the last handle to the result does.
    f.work.reset();
    f.input = at::Tensor();
    f.complete = true;
  }
  return f.output;
}

namespace {

// Starts the collective `launch` runs on the group, as run does without waiting: the group is held
// exclusively only while it is launched.
template <typename Launch>
std::shared_ptr<StartedCollective::InFlight> start(const MeshPtr& mesh, int64_t dim, const char* operation,
                                                   at::Tensor input, at::Tensor output, Launch&& launch) {
  if (auto* debug = CommDebugMode::active()) debug->record_collective(operation, dim, input.nbytes());
  auto f = std::make_shared<StartedCollective::InFlight>();
  f->mesh = mesh;
  f->dim = dim;
  f->operation = operation;
  f->input = std::move(input);
  f->output = std::move(output);
  auto group = mesh->group(dim);
  const MeshGroup::Exclusive exclusive(mesh->group_holder(dim), [&] { return where(*mesh, dim, operation); });
  const CommunicationSpan blocked(operation);
  f->start = std::chrono::steady_clock::now();
  try {
    f->work = launch(*group, as_real(f->output), as_real(f->input));
  } catch (const std::exception& e) {
    throw failure(*mesh, dim, operation, f->start, e);
  }
  return f;
}

}  // namespace

StartedCollective start_all_gather(const MeshPtr& mesh, int64_t dim, const at::Tensor& input, const at::Tensor& output) {
  const auto sizes = gathered_sizes(input, mesh->size(dim));
  if (alone(*mesh, dim)) return StartedCollective(input.reshape(sizes).clone());
  at::Tensor gathered = output.defined() ? output.view(sizes) : at::empty(sizes, input.options());
  return StartedCollective(start(mesh, dim, "all-gather", input.contiguous(), std::move(gathered),
                                 [](c10d::Backend& g, at::Tensor out, at::Tensor in) { return all_gather_single(g, out, in); }));
}

StartedCollective start_reduce_scatter(const MeshPtr& mesh, int64_t dim, const at::Tensor& input, ReduceOp op) {
  const auto sizes = scattered_sizes(input, mesh->size(dim));
  require_reducible(input, op, "reduce-scatter");
  if (alone(*mesh, dim)) return StartedCollective(input.clone());
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(op);
  auto f = start(mesh, dim, "reduce-scatter", input.contiguous(), at::empty(sizes, input.options()),
                 [&](c10d::Backend& g, at::Tensor out, at::Tensor in) { return reduce_scatter_single(g, out, in, options); });
  if (op == ReduceOp::Avg) f->average_over = mesh->size(dim);
  return StartedCollective(std::move(f));
}

StartedCollective start_all_reduce(const MeshPtr& mesh, int64_t dim, const at::Tensor& input, ReduceOp op) {
  require_reducible(input, op, "all-reduce");
  at::Tensor copy = input.clone(at::MemoryFormat::Contiguous);
  if (alone(*mesh, dim)) return StartedCollective(std::move(copy));
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  // In place on the copy: the output is the input.
  auto f = start(mesh, dim, "all-reduce", copy, copy, [&](c10d::Backend& g, at::Tensor out, at::Tensor) {
    std::vector<at::Tensor> tensors{out};
    return g.allreduce(tensors, options);
  });
  if (op == ReduceOp::Avg) f->average_over = mesh->size(dim);
  return StartedCollective(std::move(f));
}

}  // namespace dtensor::detail
