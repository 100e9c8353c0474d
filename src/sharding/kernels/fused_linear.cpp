// aten::linear on DTensors as one op and one autograd node, when every mesh dim lays the operands out
// so that each rank's product needs nothing from the others (the layouts the tensor-parallel styles
// give a Linear). LibTorch's composite linear would instead run a transpose, a matmul (views around a
// mm) and a bias add, each a DTensor op with an autograd node of its own, and its backward another
// ten or so DTensor ops: per parallel Linear, about fifteen propagations and wraps where this does one
// forward and one backward. Megatron's layers compute the same local products.
//
// Per mesh dim, with x [..., k], weight [n, k], bias [n]:
//   x R,        weight R,    bias R     -> out R          (grads: x R, weight R, bias R)
//   x S(batch), weight R,    bias R     -> out S(batch)   (x S(batch), weight P, bias P)
//   x R,        weight S(0), bias S(0)  -> out S(last)    (x P, weight S(0), bias S(0))   column parallel
//   x S(last),  weight S(1), bias R     -> out P          (x S(last), weight S(1), bias R) row parallel
// In the row-parallel case the bias joins the partial sums on the rank at coordinate 0 only (as the
// graph rule for linear partitions it), so the sum over ranks adds it once. Any other layout, a rank
// outside the mesh, a plain operand or forward-mode AD decomposes as LibTorch does, through the
// sharding rules of the ops it is made of.

#include <ATen/ATen.h>
#include <ATen/ops/linear_native.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include "../../redistribute/executor.h"
#include "../../tensor/autograd_node_ptr.h"
#include "../../tensor/as_dtensor.h"
#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/layout.h"

namespace dtensor::rules {
namespace {

constexpr const char* kLinearOp = "aten::linear";

// The placements of everything, from the operands' layout on each mesh dim (see the table above).
struct LinearLayout {
  Placements output, grad_input, grad_weight, grad_bias;
};

// For operands whose shapes multiply (x [..., k], weight [n, k], bias [n]).
std::optional<LinearLayout> shard_local_layout(const DTensorSpec& x, const DTensorSpec& weight, const DTensorSpec* bias) {
  const int64_t last = x.ndim() - 1;
  LinearLayout l;
  for (size_t m = 0; m < x.placements.size(); ++m) {
    const Placement& px = x.placements[m];
    const Placement& pw = weight.placements[m];
    const Placement pb = bias != nullptr ? bias->placements[m] : Replicate();
    auto add = [&](Placement out, Placement gx, Placement gw, Placement gb) {
      l.output.push_back(out);
      l.grad_input.push_back(gx);
      l.grad_weight.push_back(gw);
      l.grad_bias.push_back(gb);
    };
    if (px.is_replicate() && pw.is_replicate() && pb.is_replicate()) {
      add(Replicate(), Replicate(), Replicate(), Replicate());
    } else if (px.is_sharding() && px.dim() < last && pw.is_replicate() && pb.is_replicate()) {  // rows: any partition of them
      add(px, px, Partial(), Partial());
    } else if (px.is_replicate() && pw.is_shard(0) && (bias == nullptr || pb.is_shard(0))) {
      add(Shard(last), Partial(), Shard(0), Shard(0));
    } else if (px.is_shard(last) && pw.is_shard(1) && pb.is_replicate()) {
      add(Partial(), Shard(last), Shard(1), Replicate());
    } else {
      return std::nullopt;
    }
  }
  return l;
}

std::shared_ptr<const DTensorSpec> contiguous_spec(const MeshPtr& mesh, Placements placements, Shape shape,
                                                   c10::ScalarType dtype) {
  Shape stride = contiguous_strides(shape);
  return std::make_shared<const DTensorSpec>(
      DTensorSpec{mesh, std::move(placements), TensorMeta{std::move(shape), std::move(stride), dtype}});
}

// `t` as a matrix of rows: every dim but the last flattened (reshape(-1, n) cannot size an empty shard).
at::Tensor as_rows(const at::Tensor& t) {
  const int64_t rows = c10::multiply_integers(t.sizes().begin(), t.sizes().end() - 1);
  return t.reshape({rows, t.size(-1)});
}

at::Tensor wrap(const at::Tensor& local, std::shared_ptr<const DTensorSpec> spec) {
  at::Tensor laid_out = in_global_layout(local, spec->meta);
  return detail::wrap_local(std::move(laid_out), std::move(spec));
}

// Saves x only for the weight's gradient and the weight only for x's, as LibTorch's own formulas do
// (a frozen weight keeps no activations alive).
struct LinearBackward : torch::autograd::Node {
  torch::autograd::SavedVariable input, weight;  // the DTensors, where needed
  Shape input_shape, weight_shape;
  LinearLayout layout;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    std::lock_guard<std::mutex> lock(mutex_);  // as LibTorch's nodes: release_variables may run concurrently
    const at::Tensor x = should_compute_output(1) ? input.unpack() : at::Tensor();
    const at::Tensor w = should_compute_output(0) ? weight.unpack() : at::Tensor();
    // A graph of the gradient (create_graph) needs differentiable ops: the DTensor ops themselves.
    if (torch::autograd::GradMode::is_enabled()) return differentiable(grads[0], x, w);
    const CommContext context(kLinearOp);
    const auto& grad = dtensor_impl(grads[0], "the gradient flowing back into linear");
    // A Partial output's gradient is the whole one (Replicate); any other output's is laid out like it.
    const at::Tensor g = detail::redistribute_local(grad.local(), grad.spec(), partial_as_replicate(layout.output));
    const MeshPtr& mesh = grad.spec().mesh;
    const c10::ScalarType dtype = grad.spec().meta.dtype;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const at::Tensor g_rows = as_rows(g);
    torch::autograd::variable_list out(3);
    if (should_compute_output(0))
      out[0] = wrap(g.matmul(detail::as_dtensor(w)->local()), contiguous_spec(mesh, layout.grad_input, input_shape, dtype));
    if (should_compute_output(1))
      out[1] = wrap(g_rows.t().mm(as_rows(detail::as_dtensor(x)->local())),
                    contiguous_spec(mesh, layout.grad_weight, weight_shape, dtype));
    if (should_compute_output(2))
      out[2] = wrap(g_rows.sum(0), contiguous_spec(mesh, layout.grad_bias, {weight_shape[0]}, dtype));
    return out;
  }

  torch::autograd::variable_list differentiable(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w) {
    const at::Tensor g_rows = as_rows(g);
    torch::autograd::variable_list out(3);
    if (should_compute_output(0)) out[0] = g.matmul(w);
    if (should_compute_output(1)) out[1] = g_rows.t().mm(as_rows(x));
    if (should_compute_output(2)) out[2] = g_rows.sum(0);
    return out;
  }

  std::string name() const override { return "dtensor::LinearBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    input.reset_data();
    weight.reset_data();
  }
};

bool has_forward_grad(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }

void record_for_debug(const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias) {
  auto* debug = CommDebugMode::active();
  if (debug == nullptr) return;
  std::vector<Placements> placements = {placements_of(x), placements_of(weight)};
  if (bias != nullptr) placements.push_back(placements_of(*bias));
  debug->record_op(kLinearOp, std::move(placements));
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias_arg) {
  const at::Tensor* bias = bias_arg && bias_arg->defined() ? &*bias_arg : nullptr;
  const DTensorImpl* xi = detail::as_dtensor(x);
  const DTensorImpl* wi = detail::as_dtensor(weight);
  const DTensorImpl* bi = bias != nullptr ? detail::as_dtensor(*bias) : nullptr;
  auto composite = [&] { return at::native::linear(x, weight, bias_arg); };
  if (xi == nullptr || wi == nullptr || (bias != nullptr && bi == nullptr)) return composite();
  const MeshPtr& mesh = xi->spec().mesh;
  if (!mesh->contains_this_rank() || !same_mesh(mesh, wi->spec().mesh) || (bi && !same_mesh(mesh, bi->spec().mesh)) ||
      x.scalar_type() != weight.scalar_type() || (bias != nullptr && bias->scalar_type() != x.scalar_type()) ||
      at::isComplexType(x.scalar_type()) ||  // its gradients conjugate; the composite's formulas do
      has_forward_grad(x) || has_forward_grad(weight) || (bias != nullptr && has_forward_grad(*bias)))
    return composite();
  // Shapes that do not multiply are refused by the composite with LibTorch's message; on shards the
  // mismatch could pass on some ranks (a bias shard broadcast) and fail on others.
  if (x.dim() < 1 || weight.dim() != 2 || x.size(-1) != weight.size(1) ||
      (bias != nullptr && (bias->dim() != 1 || bias->size(0) != weight.size(0))))
    return composite();
  std::optional<LinearLayout> layout = shard_local_layout(xi->spec(), wi->spec(), bi ? &bi->spec() : nullptr);
  if (!layout) return composite();
  record_for_debug(x, weight, bias);

  bool adds_bias = bias != nullptr;  // once per partial sum: on coordinate 0 of its mesh dims
  for (size_t m = 0; m < layout->output.size(); ++m)
    adds_bias = adds_bias && (!layout->output[m].is_partial() || (*mesh->coordinate())[m] == 0);
  at::Tensor out_local;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    out_local = at::linear(xi->local(), wi->local(), adds_bias ? std::optional<at::Tensor>(bi->local()) : std::nullopt);
  }
  Shape out_shape = x.sizes().vec();
  out_shape.back() = weight.size(0);
  at::Tensor out = wrap(out_local, contiguous_spec(mesh, layout->output, std::move(out_shape), x.scalar_type()));

  const bool needs_grad = x.requires_grad() || weight.requires_grad() || (bias != nullptr && bias->requires_grad());
  if (!needs_grad || !torch::autograd::GradMode::is_enabled()) return out;
  auto node = dtensor::detail::make_node<LinearBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias != nullptr ? *bias : at::Tensor()));
  if (weight.requires_grad()) node->input = torch::autograd::SavedVariable(x, /*is_output=*/false);
  if (x.requires_grad()) node->weight = torch::autograd::SavedVariable(weight, /*is_output=*/false);
  node->input_shape = x.sizes().vec();
  node->weight_shape = weight.sizes().vec();
  node->layout = std::move(*layout);
  torch::autograd::create_gradient_edge(out, std::move(node));
  return out;
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse2, m) { m.impl("linear", TORCH_FN(linear)); }

}  // namespace
}  // namespace dtensor::rules
