#include "collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>

#include "dtensor/comm_debug.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"

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
  try {
    launch(*group)->wait();
  } catch (const std::exception& e) {
    throw DTensorError("rank " + std::to_string(mesh.world()->rank()) + ": " + operation + " on " +
                       mesh.dim_label(dim) + " of " + mesh.str() + " failed after at most " +
                       std::to_string(mesh.timeout().count() / 1000.0).substr(0, 6) +
                       " s (a peer that died or never called it; every rank must run the same collectives. "
                       "The limit is MeshOptions::timeout or DTENSOR_TIMEOUT_S): " + e.what());
  }
}

// A group of one rank has nothing to exchange: each collective is then its local meaning (a copy where
// the caller gets a new tensor), with no process-group round trip.
bool alone(const DeviceMesh& mesh, int64_t dim) { return mesh.size(dim) == 1; }

}  // namespace

at::Tensor all_gather(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input) {
  auto sizes = input.sizes().vec();
  if (sizes.empty()) sizes.push_back(1);
  sizes[0] *= mesh.size(dim);
  if (alone(mesh, dim)) return input.reshape(sizes).clone();
  at::Tensor output = at::empty(sizes, input.options());
  at::Tensor in = input;
  run(mesh, dim, "all-gather", in.nbytes(), [&](c10d::Backend& g) { return g.all_gather_single(output, in); });
  return output;
}

void all_reduce_(const DeviceMesh& mesh, int64_t dim, at::Tensor& tensor, ReduceOp op) {
  if (alone(mesh, dim)) return;
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  run(mesh, dim, "all-reduce", tensor.nbytes(), [&](c10d::Backend& g) { return g.allreduce(tensors, options); });
  if (op == ReduceOp::Avg) divide_for_average(tensor, mesh.size(dim));
}

at::Tensor reduce_scatter(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, ReduceOp op) {
  auto sizes = input.sizes().vec();
  sizes[0] /= mesh.size(dim);
  if (alone(mesh, dim)) return input.clone();
  at::Tensor output = at::empty(sizes, input.options());
  at::Tensor in = input;
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(op);
  run(mesh, dim, "reduce-scatter", in.nbytes(), [&](c10d::Backend& g) { return g.reduce_scatter_single(output, in, options); });
  if (op == ReduceOp::Avg) divide_for_average(output, mesh.size(dim));
  return output;
}

at::Tensor all_to_all(const DeviceMesh& mesh, int64_t dim, const at::Tensor& input, std::vector<int64_t> send_counts,
                      std::vector<int64_t> recv_counts) {
  int64_t total = 0;
  for (auto c : recv_counts) total += c;
  if (alone(mesh, dim)) return input.reshape({total}).clone();
  at::Tensor output = at::empty({total}, input.options());
  at::Tensor in = input;
  run(mesh, dim, "all-to-all", in.nbytes(),
      [&](c10d::Backend& g) { return g.all_to_all_single(output, in, recv_counts, send_counts); });
  return output;
}

void broadcast_(const DeviceMesh& mesh, int64_t dim, at::Tensor& tensor, int64_t root) {
  if (alone(mesh, dim)) return;
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run(mesh, dim, "broadcast", tensor.nbytes(), [&](c10d::Backend& g) { return g.broadcast(tensors, options); });
}

void scatter_(const DeviceMesh& mesh, int64_t dim, const std::vector<at::Tensor>& chunks, at::Tensor& output) {
  if (alone(mesh, dim)) {
    output.copy_(chunks.at(0));
    return;
  }
  std::vector<at::Tensor> outputs{output};
  std::vector<std::vector<at::Tensor>> inputs;
  if ((*mesh.coordinate())[dim] == 0) inputs.push_back(chunks);
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

}  // namespace dtensor::detail
