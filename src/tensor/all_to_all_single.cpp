#include "dtensor/all_to_all.h"

#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <numeric>
#include <string>

#include "../mesh/collectives.h"
#include "autograd_nodes.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"

namespace dtensor {
namespace {

// The group along `dim` through this rank; throws naming what is wrong with the mesh or the dim.
int64_t group_size(const MeshPtr& mesh, int64_t dim, const char* what) {
  if (!mesh) throw DTensorError(std::string(what) + ": the mesh is null; build one with DeviceMesh::create");
  if (dim < 0 || dim >= mesh->ndim())
    throw DTensorError(std::string(what) + ": mesh dim " + std::to_string(dim) + " does not exist on a " +
                       std::to_string(mesh->ndim()) + "-d mesh");
  if (!mesh->contains_this_rank())
    throw DTensorError(std::string(what) + ": this rank is not in the mesh; only its members take part");
  return mesh->size(dim);
}

// `sizes` checked as one block size per member (empty: equal blocks of `rows`), non-negative; with
// `rows` given (>= 0), summing to it.
std::vector<int64_t> checked_splits(std::vector<int64_t> sizes, int64_t members, int64_t rows, const char* which,
                                    int64_t dim) {
  const std::string where = "all_to_all_single over mesh dim " + std::to_string(dim) + " (" +
                            std::to_string(members) + " members): ";
  if (sizes.empty()) {
    if (rows % members != 0)
      throw DTensorError(where + "the input's " + std::to_string(rows) + " rows do not divide into " +
                         std::to_string(members) + " equal blocks; give " + which);
    sizes.assign(static_cast<size_t>(members), rows / members);
  }
  if (static_cast<int64_t>(sizes.size()) != members)
    throw DTensorError(where + which + " " + c10::str(at::IntArrayRef(sizes)) + " has " + std::to_string(sizes.size()) +
                       " entries; give one per member of the dim");
  for (const int64_t s : sizes)
    if (s < 0) throw DTensorError(where + which + " " + c10::str(at::IntArrayRef(sizes)) + " holds a negative size");
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (rows >= 0 && total != rows)
    throw DTensorError(where + which + " " + c10::str(at::IntArrayRef(sizes)) + " sums to " + std::to_string(total) +
                       " but the input has " + std::to_string(rows) + " rows (dim 0)");
  return sizes;
}

// The exchange itself: rows of `input` out by `send`, in by `receive` (both checked).
at::Tensor exchange_rows(const at::Tensor& input, const std::vector<int64_t>& send, const std::vector<int64_t>& receive,
                         const DeviceMesh& mesh, int64_t dim) {
  auto sizes = input.sizes().vec();
  const int64_t row = c10::multiply_integers(sizes.begin() + 1, sizes.end());
  std::vector<int64_t> send_counts, receive_counts;
  for (const int64_t s : send) send_counts.push_back(s * row);
  for (const int64_t r : receive) receive_counts.push_back(r * row);
  sizes[0] = std::accumulate(receive.begin(), receive.end(), int64_t{0});
  return detail::all_to_all(mesh, dim, input.reshape({-1}), std::move(send_counts), std::move(receive_counts))
      .view(sizes);
}

// Gradient of all_to_all_single: the output's gradient sent back along the swapped split sizes.
struct AllToAllSingleBackward : torch::autograd::Node {
  AllToAllSingleBackward(MeshPtr mesh, int64_t dim, std::vector<int64_t> sent, std::vector<int64_t> received)
      : mesh(std::move(mesh)), dim(dim), sent(std::move(sent)), received(std::move(received)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor grad = grads.at(0);
    // Every member must take part even where its gradient is undefined (no use of the output).
    if (!grad.defined()) grad = input_metadata(0).zeros_like();
    return {exchange_rows(grad, received, sent, *mesh, dim)};
  }
  std::string name() const override { return "dtensor::AllToAllSingleBackward"; }
  MeshPtr mesh;
  int64_t dim;
  std::vector<int64_t> sent, received;
};

}  // namespace

std::vector<int64_t> exchange_split_sizes(const std::vector<int64_t>& input_split_sizes, const MeshPtr& mesh,
                                          int64_t dim) {
  const int64_t members = group_size(mesh, dim, "exchange_split_sizes");
  const auto sizes = checked_splits(input_split_sizes, members, -1, "input_split_sizes", dim);
  at::Tensor counts = at::tensor(sizes, at::kLong);
  at::Tensor received =
      detail::all_to_all(*mesh, dim, counts, std::vector<int64_t>(members, 1), std::vector<int64_t>(members, 1));
  return {received.data_ptr<int64_t>(), received.data_ptr<int64_t>() + members};
}

at::Tensor all_to_all_single(const at::Tensor& input, std::optional<std::vector<int64_t>> output_split_sizes,
                             std::vector<int64_t> input_split_sizes, const MeshPtr& mesh, int64_t dim) {
  const int64_t members = group_size(mesh, dim, "all_to_all_single");
  if (!input.defined() || input.dim() == 0)
    throw DTensorError("all_to_all_single: the input must be a tensor of at least one dim (its rows travel)");
  if (is_dtensor(input))
    throw DTensorError("all_to_all_single: the input is a DTensor; pass its local tensor (to_local), whose rows travel");
  const auto send = checked_splits(std::move(input_split_sizes), members, input.size(0), "input_split_sizes", dim);
  // Decided before the sizes are moved into the check (argument order is unspecified).
  const int64_t output_rows = output_split_sizes && output_split_sizes->empty() ? input.size(0) : -1;
  const auto receive = output_split_sizes ? checked_splits(std::move(*output_split_sizes), members, output_rows, "output_split_sizes", dim)
                                          : exchange_split_sizes(send, mesh, dim);
  at::Tensor output = exchange_rows(input, send, receive, *mesh, dim);
  detail::record(detail::make_node<AllToAllSingleBackward>(mesh, dim, send, receive), input, output);
  return output;
}

}  // namespace dtensor
