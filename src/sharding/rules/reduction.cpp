// Reductions. Reducing over a sharded dim leaves each rank a partial result: Partial(sum) for sums
// and means, Partial(max) / Partial(min) for max- and min-like ops. Where partial results do not
// combine that way (prod, var, logsumexp) or the results are positions (argmax, max.dim's indices),
// the reduced dims must be Replicate. Dims that are not reduced keep their shards (renumbered when
// the reduced dims are dropped).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "../../mesh/collectives.h"
#include "../registry.h"
#include "form_helpers.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// The reduced dims of a call (the `dim` argument; all dims when it is absent, None or empty) and
// `keepdim`.
struct Reduced {
  std::set<int64_t> dims;
  bool keepdim = false;
};

Reduced reduced_dims(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  Reduced r;
  bool empty_list = false;
  const auto& args = s.schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "dim" && !s.args[i].isNone()) {
      if (s.args[i].isInt()) r.dims.insert(wrap_dim(s.args[i].toInt(), ndim));
      else
        for (int64_t d : s.args[i].toIntVector()) r.dims.insert(wrap_dim(d, ndim));
      empty_list = r.dims.empty();
    }
    if (args[i].name() == "keepdim") r.keepdim = s.args[i].toBool();
  }
  // all.dims and any.dims take an empty list as "no dims"; every other reduction as "all dims".
  const bool none_reduced = empty_list && (s.schema.name() == "aten::all" || s.schema.name() == "aten::any");
  if (r.dims.empty() && !none_reduced)
    for (int64_t d = 0; d < ndim; ++d) r.dims.insert(d);
  return r;
}

// Where input dim d ends up in the output, or -1 when it is reduced away.
int64_t output_dim(const Reduced& r, int64_t d) {
  if (r.dims.count(d)) return r.keepdim ? d : -1;
  int64_t before = 0;
  for (int64_t x : r.dims) before += x < d;
  return r.keepdim ? d : d - before;
}

// How a reduction's results combine across ranks.
struct Combine {
  // What the outputs become when a reduced dim is sharded; nullopt: reduced dims must be Replicate.
  std::optional<ReduceOp> over_shard;
  // Partial inputs the op maps to the same Partial output (linear ops keep sums, max keeps max).
  std::vector<ReduceOp> keeps_partial;
};

// Every output placed `out` for the input placed `in`. The out= forms (max.dim_max) also take their
// outputs as inputs, which must be placed like the outputs.
DimStrategy strategy(const OpSchema& s, Placement out, Placement in) {
  DimStrategy st{Placements(s.outputs.size(), out), {in}};
  st.inputs.resize(s.inputs.size(), out);
  return st;
}

std::vector<DimStrategy> reduction(const OpSchema& s, const Combine& c) {
  const Reduced r = reduced_dims(s);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d) {
    if (!r.dims.count(d)) out.push_back(strategy(s, Shard(output_dim(r, d)), Shard(d)));
    else if (c.over_shard) out.push_back(strategy(s, Partial(*c.over_shard), Shard(d)));
  }
  const auto linear = linear_reduce_ops(s);
  for (ReduceOp op : c.keeps_partial) {
    const bool sum_like = op == ReduceOp::Sum || op == ReduceOp::Avg;
    if (!sum_like || std::find(linear.begin(), linear.end(), op) != linear.end())
      out.push_back(strategy(s, Partial(op), Partial(op)));
  }
  return out;
}

DimRule reduce(Combine c) {
  return [c](const OpSchema& s) { return reduction(s, c); };
}

// The mesh dims on which the chosen strategy shards a reduced dim (each rank then reduces only its
// own part of it).
std::vector<int64_t> mesh_dims_splitting(const OpSchema& s, const PlacementStrategy& chosen) {
  std::vector<int64_t> out;
  for (int64_t d : reduced_dims(s).dims)
    for (int64_t m : mesh_dims_sharding(chosen.inputs[0], d)) out.push_back(m);
  return out;
}

// Replaces the op's arguments on the stack by its (local) result.
void return_result(const c10::OperatorHandle& op, torch::jit::Stack& stack, at::Tensor result) {
  torch::jit::drop(stack, op.schema().arguments().size());
  torch::jit::push(stack, std::move(result));
}

// mean over a sharded dim: each rank's contribution is its local sum divided by the GLOBAL count,
// which stays exact when the shards are uneven (a mean of local means would weigh them equally).
LocalKernel mean_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_splitting(s, chosen).empty()) return {};
  const Reduced r = reduced_dims(s);
  int64_t count = 1;
  for (int64_t d : r.dims) count *= s.input(0).meta.shape[d];
  const std::vector<int64_t> dims(r.dims.begin(), r.dims.end());
  return [dims, keepdim = r.keepdim, count](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::last(stack, op.schema().arguments().size());
    const auto dtype = args.back().toOptional<at::ScalarType>();  // mean's last argument
    at::Tensor local_sum = at::sum(args[0].toTensor(), dims, keepdim, dtype);
    return_result(op, stack, local_sum.div_(count));
  };
}

// mean_kernel as graph ops.
GraphForm mean_form(const OpSchema& s, const PlacementStrategy&) {
  const Reduced r = reduced_dims(s);
  int64_t count = 1;
  for (int64_t d : r.dims) count *= s.input(0).meta.shape[d];
  return [dims = std::vector<int64_t>(r.dims.begin(), r.dims.end()), keepdim = r.keepdim, count,
          dtype_arg = s.args.size() - 1](GraphFormBuilder& b) -> std::vector<FormValue> {
    const FormValue local_sum = b.op("aten::sum.dim_IntList", {b.input(0), dims, keepdim, b.argument(dtype_arg)}, "local_sum");
    return {b.op("aten::div.Scalar", {local_sum, count}, "mean")};
  };
}

// The identity of a max (lowest value) or min (highest value) reduction in `dtype`.
at::Scalar identity(ReduceOp op, at::ScalarType dtype) {
  return AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, dtype, "identity", [&] {
    using Limits = std::numeric_limits<scalar_t>;
    if (op == ReduceOp::Max) return at::Scalar(Limits::has_infinity ? -Limits::infinity() : Limits::lowest());
    return at::Scalar(Limits::has_infinity ? Limits::infinity() : Limits::max());
  });
}

// max / min over a sharded dim: a rank whose shard is empty (uneven shards) holds the reduction's
// identity, as max() of no elements is an error.
LocalKernelRule identity_when_empty(ReduceOp op) {
  return [op](const OpSchema& s, const PlacementStrategy& chosen) -> LocalKernel {
    if (mesh_dims_splitting(s, chosen).empty()) return {};
    const Shape shape = local_output_shape(s, chosen);
    const at::ScalarType dtype = s.outputs[0].dtype;
    return [shape, dtype, value = identity(op, dtype)](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
      const at::Tensor self = torch::jit::peek(stack, 0, op.schema().arguments().size()).toTensor();
      if (self.numel() > 0) return op.callBoxed(stack);
      return_result(op, stack, at::full(shape, value, self.options().dtype(dtype)));
    };
  };
}

// Whether this rank's part of the input is empty (known when the program is made).
bool local_shard_is_empty(const OpSchema& s, const PlacementStrategy& chosen) {
  return numel(local_shape(s.input(0).meta.shape, s.mesh->shape(), *s.mesh->coordinate(), chosen.inputs[0])) == 0;
}

// identity_when_empty as graph ops: an empty shard is known when the program is made.
GraphFormRule identity_when_empty_form(ReduceOp op) {
  return [op](const OpSchema& s, const PlacementStrategy& chosen) -> GraphForm {
    if (!local_shard_is_empty(s, chosen)) return the_op_itself(s);
    const at::ScalarType dtype = s.outputs[0].dtype;
    return [shape = local_output_shape(s, chosen), dtype, value = identity(op, dtype)](GraphFormBuilder& b) -> std::vector<FormValue> {
      return {b.op("aten::new_full", {b.input(0), shape, c10::IValue(value), c10::IValue(dtype)}, "identity")};
    };
  };
}

// ---- vector norms ----------------------------------------------------------------------------------

// The norm order of linalg_vector_norm (`ord`) or norm (`p`, None meaning 2).
double norm_order(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& name = schema.arguments()[i].name();
    if (name == "ord" || name == "p") return args[i].isNone() ? 2.0 : args[i].toScalar().toDouble();
  }
  return 2.0;
}

// A norm over a sharded dim is computed whole by the op's local kernel (below), so its output is
// Replicate there. The strategies cannot depend on the order: propagation caches a decision by the
// kind of a number argument, not its value.
std::vector<DimStrategy> vector_norm(const OpSchema& s) {
  const Reduced r = reduced_dims(s);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d)
    out.push_back({{r.dims.count(d) ? Replicate() : Shard(output_dim(r, d))}, {Shard(d)}});
  return out;
}

// Each rank takes the norm of its shard; the mesh dims that split a reduced dim then combine them:
// max / min for the infinity norms, a sum for the 0-"norm" (a count), and for any other order p the
// sum of the p-th powers, raised to 1/p. One all-reduce of the output per such mesh dim.
LocalKernel norm_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  const std::vector<int64_t> split = mesh_dims_splitting(s, chosen);
  if (split.empty()) return {};
  const Shape shape = local_output_shape(s, chosen);
  const at::ScalarType dtype = s.outputs[0].dtype;
  return [mesh = s.mesh, split, shape, dtype](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const double ord = norm_order(op.schema(), torch::jit::last(stack, op.schema().arguments().size()));
    const bool inf = std::isinf(ord);
    const ReduceOp combine = !inf ? ReduceOp::Sum : ord > 0 ? ReduceOp::Max : ReduceOp::Min;
    const at::Tensor self = torch::jit::peek(stack, 0, op.schema().arguments().size()).toTensor();
    at::Tensor norm;
    if (self.numel() == 0) {
      // Norms of nothing may be errors (negative and infinite orders); an empty shard contributes the
      // combine's identity (0 for sums of powers), so every rank still joins the all-reduce.
      norm = inf ? at::full(shape, identity(combine, dtype), self.options().dtype(dtype))
                 : at::zeros(shape, self.options().dtype(dtype));
      torch::jit::drop(stack, op.schema().arguments().size());
    } else {
      op.callBoxed(stack);
      norm = torch::jit::pop(stack).toTensor();
    }
    const bool powers = !inf && ord != 0;
    if (powers && self.numel() > 0) norm = norm.pow(ord);
    detail::all_reduce_over(*mesh, split, norm, combine);
    torch::jit::push(stack, powers ? norm.pow(1.0 / ord) : norm);
  };
}

// The index of the norm order argument (`ord` or `p`).
size_t norm_order_arg(const c10::FunctionSchema& schema) {
  for (size_t i = 0; i < schema.arguments().size(); ++i)
    if (schema.arguments()[i].name() == "ord" || schema.arguments()[i].name() == "p") return i;
  throw DTensorError(schema.name() + " has no norm order argument");
}

// norm_kernel as graph ops; the order is read as the call passes it (a Scalar: not in the cache key).
GraphForm norm_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const at::ScalarType dtype = s.outputs[0].dtype;
  return [split = mesh_dims_splitting(s, chosen), shape = local_output_shape(s, chosen), dtype, empty = local_shard_is_empty(s, chosen),
          order_arg = norm_order_arg(s.schema), itself = the_op_itself(s)](GraphFormBuilder& b) -> std::vector<FormValue> {
    const c10::IValue given = b.argument(order_arg);
    const double ord = given.isNone() ? 2.0 : given.toScalar().toDouble();
    const bool inf = std::isinf(ord), powers = !inf && ord != 0;
    const ReduceOp combine = !inf ? ReduceOp::Sum : ord > 0 ? ReduceOp::Max : ReduceOp::Min;
    FormValue norm;
    if (!empty) norm = itself(b)[0];
    else if (inf) norm = b.op("aten::new_full", {b.input(0), shape, c10::IValue(identity(combine, dtype)), c10::IValue(dtype)}, "identity");
    else norm = b.op("aten::new_zeros", {b.input(0), shape, c10::IValue(dtype)}, "nothing");
    if (powers && !empty) norm = b.op("aten::pow.Tensor_Scalar", {norm, ord}, "powers");
    norm = all_reduce_form(b, norm, split, combine);
    return {powers ? b.op("aten::pow.Tensor_Scalar", {norm, 1.0 / ord}, "root") : norm};
  };
}

// ---- scans ---------------------------------------------------------------------------------------

// cumsum: the scanned dim must be Replicate, others keep their shards; a sum of Partials scans to the
// Partial of the scans.
std::vector<DimStrategy> scan(const OpSchema& s) {
  const int64_t dim = wrap_dim(s.args[1].toInt(), s.input_ndim(0));
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d)
    if (d != dim) out.push_back({{Shard(d)}, {Shard(d)}});
  for (ReduceOp op : linear_reduce_ops(s)) out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

// ---- orderings -----------------------------------------------------------------------------------

// sort and topk order values along `dim`, which must be Replicate (an order is global); every other
// dim keeps its shard, in the values and the indices alike. No Partial: the order of a sum is not
// the sum of the orders. The scans that are not sums (cumprod, cummax, cummin, logcumsumexp) are
// the same: `dim` whole, no Partial.
std::vector<DimStrategy> ordering(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  const int64_t dim = dim_arg(s, ndim);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < ndim; ++d)
    if (d != dim) out.push_back({Placements(s.outputs.size(), Shard(d)), {Shard(d)}});
  return out;
}

// ---- what autograd needs -------------------------------------------------------------------------

// flip, which cumsum's backward runs (a reversed cumsum): a reversed dim must be Replicate (reversing
// each shard would leave the pieces on the wrong ranks); other dims keep their shards, and as values
// only move, every Partial stays.
std::vector<DimStrategy> flip(const OpSchema& s) {
  std::set<int64_t> reversed;
  for (int64_t d : s.args[1].toIntVector()) reversed.insert(wrap_dim(d, s.input_ndim(0)));
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d)
    if (!reversed.count(d)) out.push_back({{Shard(d)}, {Shard(d)}});
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

// item() (_local_scalar_dense), which max() and min() backward call on their result: the value of a
// Replicate tensor is any rank's local one.
std::vector<DimStrategy> replicate_only(const OpSchema& s) { return {all_replicate(s)}; }

// equal(self, other) -> bool. Two tensors of one shape placed alike are compared shard by shard; the
// ranks' answers then meet in an all-reduce (min) over the mesh dims that shard them, so that every
// rank returns the one answer. Tensors of different shapes are unequal: compared whole (Replicate).
std::vector<DimStrategy> equal(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  if (s.input(0).meta.shape != s.input(1).meta.shape) return out;
  for (int64_t d = 0; d < s.input_ndim(0); ++d) out.push_back({{}, {Shard(d), Shard(d)}, kCollectiveLatencyBytes});
  return out;
}

LocalKernel equal_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  const std::vector<int64_t> sharding = sharding_mesh_dims(chosen.inputs[0]);
  if (sharding.empty()) return {};
  return [mesh = s.mesh, sharding](const c10::OperatorHandle&, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, 2);
    at::Tensor same = at::scalar_tensor(at::equal(args[0].toTensor(), args[1].toTensor()) ? 1.0 : 0.0, at::kFloat);
    detail::all_reduce_over(*mesh, sharding, same, ReduceOp::Min);
    stack.emplace_back(same.item<float>() == 1.0F);
  };
}

// Autograd differentiates max.dim / min.dim with value_selecting_reduction_backward, whose
// decomposition scatters in place into at::zeros(...), a plain tensor that cannot hold a DTensor's
// values. PyTorch runs the out-of-place form on grad.new_zeros(...) for tensor subclasses; DTensors
// get that form through their autograd kernel (which still records the ops it calls, so it stays
// differentiable).
at::Tensor value_selecting_reduction_backward(const at::Tensor& grad, int64_t dim, const at::Tensor& indices,
                                              c10::SymIntArrayRef sizes, bool keepdim) {
  const bool restore_dim = !keepdim && !sizes.empty();
  const at::Tensor values = restore_dim ? grad.unsqueeze(dim) : grad;
  const at::Tensor positions = restore_dim ? indices.unsqueeze(dim) : indices;
  return values.new_zeros_symint(sizes).scatter(dim, positions, values);
}

// cummax / cummin backward likewise scatters into a plain at::zeros: the out-of-place form on zeros
// made from the DTensor input.
at::Tensor cummaxmin_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& indices, int64_t dim) {
  if (input.numel() == 0) return input;
  return input.new_zeros(input.sizes()).scatter_add(dim, indices, grad);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse2, m) {
  m.impl("value_selecting_reduction_backward", TORCH_FN(value_selecting_reduction_backward));
  m.impl("cummaxmin_backward", TORCH_FN(cummaxmin_backward));
}

const bool reduction_rules_registered = [] {
  using detail::register_overloads;
  const Combine sums{ReduceOp::Sum, {ReduceOp::Sum, ReduceOp::Avg}};
  const Combine maxima{ReduceOp::Max, {ReduceOp::Max}};
  const Combine minima{ReduceOp::Min, {ReduceOp::Min}};
  const Combine replicated{std::nullopt, {}};
  // nansum may not keep a Partial input: a NaN in one contribution makes the whole element NaN, which
  // nansum drops, while per-rank nansums would keep the other contributions.
  const Combine nan_sums{ReduceOp::Sum, {}};
  register_overloads({"aten::sum", "aten::sum.dim_IntList"}, {.dim = reduce(sums), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::nansum"}, {.dim = reduce(nan_sums), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  // sum |x|^ord (a vector norm's inner sum) adds up over shards, but |x|^ord is not linear: a Partial
  // input must be whole first.
  const Combine power_sums{ReduceOp::Sum, {}};
  register_overloads({"aten::linalg__powsum"}, {.dim = reduce(power_sums), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::mean", "aten::mean.dim"},
                     {.dim = reduce(sums), .local_kernel = mean_kernel, .graph_form = mean_form, .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::max", "aten::amax"},
                     {.dim = reduce(maxima), .local_kernel = identity_when_empty(ReduceOp::Max),
                      .graph_form = identity_when_empty_form(ReduceOp::Max), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::min", "aten::amin"},
                     {.dim = reduce(minima), .local_kernel = identity_when_empty(ReduceOp::Min),
                      .graph_form = identity_when_empty_form(ReduceOp::Min), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  // any/all of a sharded dim combine as max/min of the per-shard results, but a Partial(max/min) input
  // must be reduced first: any(max_r x_r) is not the OR of any(x_r) for non-boolean values.
  const Combine any_of{ReduceOp::Max, {}};
  const Combine all_of{ReduceOp::Min, {}};
  register_overloads({"aten::any", "aten::any.dim", "aten::any.dims"},
                     {.dim = reduce(any_of), .local_kernel = identity_when_empty(ReduceOp::Max),
                      .graph_form = identity_when_empty_form(ReduceOp::Max), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::all", "aten::all.dim", "aten::all.dims"},
                     {.dim = reduce(all_of), .local_kernel = identity_when_empty(ReduceOp::Min),
                      .graph_form = identity_when_empty_form(ReduceOp::Min), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::prod", "aten::prod.dim_int", "aten::max.dim", "aten::min.dim", "aten::max.dim_max",
                      "aten::min.dim_min", "aten::argmax", "aten::argmin", "aten::var.correction", "aten::std.correction",
                      "aten::var_mean.correction", "aten::std_mean.correction", "aten::logsumexp", "aten::kthvalue",
                      "aten::median", "aten::median.dim", "aten::nanmedian", "aten::nanmedian.dim", "aten::mode"},
                     {.dim = reduce(replicated), .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::linalg_vector_norm", "aten::norm.Scalar", "aten::norm.ScalarOpt_dim"},
                     {.dim = vector_norm, .local_kernel = norm_kernel, .graph_form = norm_form, .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::cumsum", "aten::cumsum_"}, {.dim = scan, .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::sort", "aten::sort.stable", "aten::topk", "aten::cumprod", "aten::cumprod_", "aten::cummax",
                      "aten::cummin", "aten::logcumsumexp"},
                     {.dim = ordering, .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::flip"}, {.dim = flip, .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::equal"}, {.dim = equal, .local_kernel = equal_kernel, .family = "reduction"});
  register_overloads({"aten::_local_scalar_dense"}, {.dim = replicate_only, .family = "reduction", .strided_shards = detail::StridedShards::IndexWise});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
