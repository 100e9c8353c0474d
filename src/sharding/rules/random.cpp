// Random ops (uniform_, normal_, bernoulli_, native_dropout, their functional forms, the *_like draws,
// multinomial, rrelu, ...) in two modes (dtensor/random.h).
//
// Exact (the default): a DTensor gets exactly the values single-device LibTorch gives the whole tensor
// with the same generator state, whatever its layout. LibTorch's CPU generator (mt19937) has no cheap
// skip-ahead, and each kernel consumes it in its own order (one draw per element in memory order for
// most, blocks of 16 for a large normal_, MKL streams seeded from one draw for bernoulli_ with a scalar
// p), so no rank can draw just its own part. Every rank therefore runs the op itself on global-size
// stand-ins of its inputs and keeps its part of each result: the ranks' generators advance exactly as
// a single-device run's would (they must start in the same state: seed every rank alike). Cost per
// rank: the draws, time and memory of the whole tensor (O(global numel)), but no communication.
//
// A stand-in holds this rank's shard of the input in its place and zeros elsewhere. That is enough
// because the kernels draw the same numbers whatever the input values are (bernoulli's p and normal's
// mean/std are used after the draw, one per element), and output element i reads only input element
// i, so an input laid out like the output (or replicated) covers the part this rank keeps. Zeros are
// valid for every parameter tensor (a probability, a standard deviation, a dropout input).
//
// LocalShards: each rank computes only its part (random_shards.h), from a key that every rank draws
// alike from the op's generator (one number per call) and each element's global index. LibTorch's own
// argument checks run on 0-d stand-ins with a private generator, as the op itself never runs. random_,
// randint_like, multinomial, rrelu and complex tensors always draw in the exact mode.
//
// In both modes, inputs that are read and Partial are reduced first; a Partial tensor filled in place
// stays Partial, holding contributions that reduce to the drawn value. Ranks outside the mesh draw what
// the mesh's ranks draw (the whole op on zeros, or the key), so that every rank's generator stays in
// step for later calls on other meshes. native_dropout in eval mode draws nothing and runs on the shards.

#include <ATen/ATen.h>

#include "../../redistribute/executor.h"
#include "../registry.h"
#include "dtensor/random.h"
#include "form_helpers.h"
#include "random_shards.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

bool writes(const c10::FunctionSchema& schema, size_t arg) {
  const auto* alias = schema.arguments()[arg].alias_info();
  return alias != nullptr && alias->isWrite();
}

// Outputs sharded along any dim, with every input of the output's shape sharded alike; inputs of
// other (broadcast) shapes stay replicated.
std::vector<DimStrategy> elementwise(const OpSchema& s) {
  std::vector<DimStrategy> strategies = {all_replicate(s)};
  for (int64_t d = 0; d < s.output_ndim(); ++d) {
    DimStrategy st{Placements(s.outputs.size(), Shard(d)), {}};
    for (size_t i = 0; i < s.inputs.size(); ++i)
      st.inputs.push_back(s.input(i).meta.shape == s.outputs[0].shape ? Shard(d) : Replicate());
    strategies.push_back(std::move(st));
  }
  return strategies;
}

// A tensor filled in place keeps its placements, Partial included: the filled value is then held as
// contributions that reduce to it (see contributions). Inputs that are read must be actual values.
std::vector<DimStrategy> random_fill(const OpSchema& s) {
  auto strategies = elementwise(s);
  for (size_t w = 0; w < s.inputs.size(); ++w) {
    if (!writes(s.schema, s.inputs[w].arg)) continue;
    for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      DimStrategy st{Placements(s.outputs.size(), Partial(op)), Placements(s.inputs.size(), Replicate())};
      st.inputs[w] = Partial(op);
      strategies.push_back(std::move(st));
    }
  }
  return strategies;
}

// rrelu_with_noise(self, noise, ...) draws a slope only for each negative element of self, so the
// draws depend on all of self: it is read whole, while noise (written) and the output shard alike.
std::vector<DimStrategy> rrelu_fill(const OpSchema& s) {
  auto strategies = random_fill(s);
  for (DimStrategy& st : strategies) st.inputs.at(0) = Replicate();
  return strategies;
}

// native_dropout_backward(grad, mask, scale) = grad * mask * scale: elementwise and linear in grad.
std::vector<DimStrategy> dropout_backward(const OpSchema& s) {
  auto strategies = elementwise(s);
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) strategies.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return strategies;
}

// ---- how a call draws ----------------------------------------------------------------------------------

enum class Draw { Nothing, Shards, Whole };

// native_dropout(input, p, train) with train=false: the input and a mask of ones.
bool dropout_in_eval(c10::ArrayRef<c10::IValue> args) { return args[2].isBool() && !args[2].toBool(); }

// Decided from the call's arguments alone (local tensors on the mesh's ranks, DTensors outside it), so
// every rank decides alike.
Draw how_drawn(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  if (op.operator_name().name == "aten::native_dropout" && dropout_in_eval(args)) return Draw::Nothing;
  if (random_mode() != RandomMode::LocalShards || shard_draw(op.operator_name()) == nullptr) return Draw::Whole;
  for (const auto& v : args)
    if (v.isTensor() && v.toTensor().is_complex()) return Draw::Whole;
  return Draw::Shards;
}

std::optional<at::Generator> generator_of(c10::ArrayRef<c10::IValue> args) {
  for (const auto& v : args)
    if (v.isGenerator()) return v.toGenerator();
  return std::nullopt;
}

c10::Device device_of(c10::ArrayRef<c10::IValue> args) {
  for (const auto& v : args)
    if (v.isTensor()) return v.toTensor().device();
  return at::kCPU;
}

// ---- layouts ---------------------------------------------------------------------------------------------

at::Tensor region(const at::Tensor& global, const LocalLayout& layout) {
  at::Tensor part = global;
  for (size_t d = 0; d < layout.shape.size(); ++d)
    part = part.narrow(static_cast<int64_t>(d), layout.offset[d], layout.shape[d]);
  return part;
}

LocalLayout layout_of(const Shape& global_shape, const DeviceMesh& mesh, const Placements& placements) {
  return local_layout(global_shape, mesh.shape(), *mesh.coordinate(), placements);
}

// This rank's region of a value as held under `placements`: along every Partial mesh dim, a
// contribution whose reduction is the value.
at::Tensor contributions(at::Tensor part, const DeviceMesh& mesh, const Placements& placements) {
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = placements[m];
    if (p.is_partial()) part = detail::partition_replicated(part, mesh, m, p.reduce_op(), detail::Direction::Forward);
  }
  return part;
}

// Zeros of a global shape with its strides, so that a kernel visits (and draws for) the elements in
// the single-device order; contiguous where the strides overlap (an expanded tensor's).
at::Tensor zeros_laid_out(const Shape& shape, const Shape& stride, const at::TensorOptions& options) {
  at::Tensor global = at::empty_strided(shape, stride, options);
  if (!global.is_non_overlapping_and_dense()) global = at::empty(shape, options);
  return global.zero_();
}

// ---- exact: the op on global-size stand-ins --------------------------------------------------------------

struct StandIn {
  size_t arg;          // the input's argument index
  TensorMeta meta;     // its global shape, strides and dtype
  Placements placements;  // the placements its local shard has when the kernel runs
};

// A global-size tensor holding `local` in its place and zeros elsewhere.
at::Tensor stand_in(const at::Tensor& local, const StandIn& in, const DeviceMesh& mesh) {
  at::Tensor global = zeros_laid_out(in.meta.shape, in.meta.stride, local.options());
  region(global, layout_of(in.meta.shape, mesh, in.placements)).copy_(local);
  return global;
}

LocalKernel run_on_global(const OpSchema& s, const PlacementStrategy& chosen) {
  std::vector<StandIn> inputs;
  for (size_t k = 0; k < s.inputs.size(); ++k) inputs.push_back({s.inputs[k].arg, s.input(k).meta, chosen.inputs[k]});
  return [inputs, outputs = chosen.outputs, mesh = s.mesh](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    c10::IValue* args = stack.data() + (stack.size() - op.schema().arguments().size());
    std::vector<bool> returned(inputs.size(), false);
    std::vector<at::Tensor> locals, globals;
    for (const auto& in : inputs) {
      locals.push_back(args[in.arg].toTensor());
      globals.push_back(stand_in(locals.back(), in, *mesh));
      args[in.arg] = globals.back();
    }
    op.callBoxed(stack);
    const size_t r = op.schema().returns().size();
    c10::IValue* returns = stack.data() + (stack.size() - r);
    for (size_t j = 0; j < r; ++j) {
      const at::Tensor global = returns[j].toTensor();
      // A copy, not a view, so the global result is freed.
      const LocalLayout layout = layout_of(global.sizes().vec(), *mesh, outputs[j]);
      const at::Tensor part = region(global, layout).clone(at::MemoryFormat::Contiguous);
      returns[j] = contributions(part, *mesh, outputs[j]);
      // An in-place op returns the stand-in it filled: its part goes back into the caller's shard.
      for (size_t k = 0; k < globals.size(); ++k)
        if (globals[k].is_same(global)) {
          returns[j] = locals[k].copy_(returns[j].toTensor());
          returned[k] = true;
        }
    }
    // An input written but not returned (rrelu_with_noise's noise): its part goes back likewise.
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (returned[k] || !writes(op.schema(), inputs[k].arg)) continue;
      const LocalLayout layout = layout_of(inputs[k].meta.shape, *mesh, inputs[k].placements);
      locals[k].copy_(contributions(region(globals[k], layout).clone(at::MemoryFormat::Contiguous), *mesh, inputs[k].placements));
    }
  };
}

// The op on zeros of its tensors' global layouts (a DTensor's sizes and strides are the global ones):
// it draws what the exact mode draws on the mesh's ranks.
void run_on_global_zeros(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack stack;
  for (const auto& v : args) {
    if (!v.isTensor() || !v.toTensor().defined()) {
      stack.push_back(v);
      continue;
    }
    const at::Tensor& t = v.toTensor();
    const auto options = at::TensorOptions().dtype(t.scalar_type()).device(t.device());
    stack.push_back(zeros_laid_out(t.sizes().vec(), t.strides().vec(), options));
  }
  op.callBoxed(stack);
}

// ---- local shards: each rank computes its part --------------------------------------------------------------

// LibTorch's checks of the call's arguments (scalar parameter ranges, supported dtypes): the op on 0-d
// zeros with a private copy of the generator, so that nothing is drawn from the shared one. Ops without
// a Generator argument (native_dropout) check their parameters in their shard draw.
void check_arguments(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const auto& schema = op.schema().arguments();
  torch::jit::Stack stack;
  bool has_generator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (schema[i].name() == "generator") {
      at::Generator shared = args[i].isGenerator() ? args[i].toGenerator()
                                                   : at::globalContext().defaultGenerator(device_of(args));
      std::lock_guard<std::mutex> lock(shared.mutex());
      stack.push_back(shared.clone());
      has_generator = true;
    } else if (args[i].isTensor() && args[i].toTensor().defined()) {
      stack.push_back(at::zeros({}, args[i].toTensor().options()));
    } else {
      stack.push_back(args[i]);
    }
  }
  if (has_generator) op.callBoxed(stack);
}

LocalKernel run_on_shards(const OpSchema& s, const PlacementStrategy& chosen) {
  // Replicated inputs are read whole: each is cut to the part of the output this rank computes.
  std::vector<size_t> whole_inputs;
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const auto& p = chosen.inputs[k];
    const bool whole = std::all_of(p.begin(), p.end(), [](const Placement& x) { return x.is_replicate(); });
    if (whole && !writes(s.schema, s.inputs[k].arg)) whole_inputs.push_back(s.inputs[k].arg);
  }
  return [draw = shard_draw(s.schema.operator_name()), whole_inputs, outputs = s.outputs, placements = chosen.outputs,
          mesh = s.mesh](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    c10::IValue* args = stack.data() + (stack.size() - n);
    const c10::ArrayRef<c10::IValue> arg_view(args, n);
    check_arguments(op, arg_view);
    const c10::Device device = device_of(arg_view);
    const Variates variates(draw_key(generator_of(arg_view), device), outputs[0].shape,
                            layout_of(outputs[0].shape, *mesh, placements[0]), device);
    for (size_t arg : whole_inputs) args[arg] = variates.part_of(args[arg].toTensor());
    const std::vector<at::Tensor> values = draw(variates, arg_view);

    torch::jit::Stack returns;
    for (size_t j = 0; j < values.size(); ++j) {
      at::Tensor held = contributions(values[j].to(outputs[j].dtype), *mesh, placements[j]);
      // An in-place op fills the tensor it writes to (laid out like its output) and returns it.
      for (size_t i = 0; i < n; ++i)
        if (writes(schema, i)) held = args[i].toTensor().copy_(held);
      returns.push_back(std::move(held));
    }
    torch::jit::drop(stack, n);
    for (auto& r : returns) stack.push_back(std::move(r));
  };
}

// ---- dispatch by mode, on the mesh and outside it ------------------------------------------------------------

LocalKernel random_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  return [whole = run_on_global(s, chosen), shards = run_on_shards(s, chosen)](const c10::OperatorHandle& op,
                                                                               torch::jit::Stack& stack) {
    const size_t n = op.schema().arguments().size();
    switch (how_drawn(op, c10::ArrayRef<c10::IValue>(stack.data() + (stack.size() - n), n))) {
      case Draw::Nothing: return op.callBoxed(stack);
      case Draw::Shards: return shards(op, stack);
      case Draw::Whole: return whole(op, stack);
    }
  };
}

// The exact draw as graph ops, where the layout allows it: each sharded input padded with zeros to its
// global shape (the stand-in, when that shape is contiguous, so the kernel draws in the single-device
// order), the op on the stand-ins, and this rank's region of each output sliced out. Not for Partial
// inputs or outputs (their contributions), nor in the LocalShards mode, whose keyed draw no ATen op
// makes; dropout in eval runs on the shards as it is.
GraphForm run_on_global_form(const OpSchema& s, const PlacementStrategy& chosen) {
  if (random_mode() == RandomMode::LocalShards && shard_draw(s.schema.operator_name()) != nullptr) return {};
  auto plain = [](const Placements& p) { return std::none_of(p.begin(), p.end(), [](const Placement& q) { return q.is_partial(); }); };
  std::vector<std::pair<size_t, std::vector<int64_t>>> padded;  // argument, constant_pad_nd's padding
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const TensorMeta& meta = s.input(k).meta;
    if (!plain(chosen.inputs[k]) || meta.stride != contiguous_strides(meta.shape) || s.inputs[k].list_index >= 0) return {};
    padded.emplace_back(s.inputs[k].arg, padding_to_whole(local_part(s, meta.shape, chosen.inputs[k]), meta.shape));
  }
  std::vector<LocalLayout> regions;
  for (size_t j = 0; j < s.outputs.size(); ++j) {
    if (!plain(chosen.outputs[j])) return {};
    regions.push_back(local_part(s, s.outputs[j].shape, chosen.outputs[j]));
  }
  return [op = s.op_name(), arguments = s.args.size(), padded, regions, dropout = s.op_name() == "aten::native_dropout"](GraphFormBuilder& b) {
    std::vector<FormArg> args;
    for (size_t i = 0; i < arguments; ++i) args.push_back(FormArg::as_called(i));
    const bool draws = !(dropout && !b.argument(2).toBool());
    for (const auto& [arg, pad] : padded)
      args[arg] = draws ? b.op("aten::constant_pad_nd", {b.input(arg), pad}, "stand_in") : b.input(arg);
    std::vector<FormValue> outputs = b.call(op, std::move(args), "drawn");
    if (!draws) return outputs;
    for (size_t j = 0; j < outputs.size(); ++j)
      for (size_t d = 0; d < regions[j].shape.size(); ++d)
        outputs[j] = b.op("aten::slice.Tensor", {outputs[j], static_cast<int64_t>(d), regions[j].offset[d], regions[j].offset[d] + regions[j].shape[d]},
                          "region");
    return outputs;
  };
}

void draw_outside_mesh(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  switch (how_drawn(op, args)) {
    case Draw::Nothing: return;
    case Draw::Shards: (void)draw_key(generator_of(args), device_of(args)); return;
    case Draw::Whole: return run_on_global_zeros(op, args);
  }
}

// LibTorch's C++ build has no Meta kernel for native_dropout (Python registers one), and running the op
// to learn its outputs would draw. Its CPU kernel (ATen/native/Dropout.cpp) allocates them as below; the
// same calls on Meta tensors give their metas.
std::vector<TensorMeta> dropout_metas(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
  const at::Tensor& x = args[0].toTensor();  // a DTensor: its sizes and strides are the global ones
  const at::Tensor input = at::empty_strided(x.sizes(), x.strides(), x.options().device(at::kMeta));
  at::Tensor output = input, mask = at::empty_like(input);
  if (input.numel() > 0 && dropout_in_eval(args)) {
    mask = at::ones_like(input, input.options().dtype(at::kBool));
    output = input.clone();
  } else if (input.numel() > 0) {
    mask = at::empty_like(input, input.options().dtype(at::kBool));
    output = input.mul(mask);
  }
  std::vector<TensorMeta> metas;
  for (const at::Tensor& t : {output, mask})
    metas.push_back(TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  return metas;
}

// multinomial(self [.., n], num_samples) -> indices [.., num_samples]: LibTorch's C++ build has no Meta
// kernel for it, and zeros are no distribution to draw from.
std::vector<TensorMeta> multinomial_metas(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
  Shape shape = args[0].toTensor().sizes().vec();
  shape.back() = args[1].toInt();
  return {TensorMeta{shape, contiguous_strides(shape), at::kLong}};
}

// rrelu_with_noise(self, noise, ...) -> self's shape (the functional form: and the noise's). LibTorch's
// C++ build has no Meta kernel for it, and the expanded zeros metas are otherwise computed on would
// take the in-place write of noise into a one-element buffer.
std::vector<TensorMeta> rrelu_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  std::vector<TensorMeta> metas;
  for (size_t k = 0; k < op.schema().returns().size(); ++k) {
    const at::Tensor& like = args[k].toTensor();  // a DTensor: its sizes are the global ones
    metas.push_back(TensorMeta{like.sizes().vec(), contiguous_strides(like.sizes().vec()), like.scalar_type()});
  }
  return metas;
}

const bool random_rules_registered = [] {
  // The in-place fills, and the functional and *_like forms: those are composites of empty_like (or
  // clone) and a fill, but as ops of their own they draw once, by this rule, in either mode, rather
  // than through the composite fallback; their out= forms share the rule. multinomial's output is not
  // laid out like its input, so its probabilities are read whole (elementwise keeps them Replicate).
  // Dropout on CPU is empty_like, bernoulli_, div_ and mul.
  const detail::OpRule rule{
      .dim = random_fill, .local_kernel = random_kernel, .graph_form = run_on_global_form, .family = "random", .outside_mesh = draw_outside_mesh};
  detail::register_overloads({"aten::uniform_", "aten::normal_", "aten::normal.Tensor_Tensor", "aten::normal.Tensor_float",
                              "aten::normal.float_Tensor", "aten::bernoulli_.float", "aten::bernoulli_.Tensor",
                              "aten::bernoulli.p", "aten::exponential_", "aten::cauchy_", "aten::log_normal_",
                              "aten::geometric_", "aten::random_", "aten::random_.from", "aten::random_.to",
                              "aten::uniform", "aten::normal_functional", "aten::bernoulli", "aten::bernoulli.Tensor",
                              "aten::exponential", "aten::cauchy", "aten::log_normal", "aten::geometric", "aten::random",
                              "aten::random.from", "aten::random.to", "aten::rand_like", "aten::rand_like.generator",
                              "aten::randn_like", "aten::randn_like.generator", "aten::randint_like", "aten::randint_like.low_dtype",
                              "aten::randint_like.generator", "aten::randint_like.low_generator_dtype"},
                             rule);
  detail::OpRule rrelu = rule;
  rrelu.dim = rrelu_fill;
  rrelu.output_metas = rrelu_metas;
  detail::register_overloads({"aten::rrelu_with_noise", "aten::rrelu_with_noise_functional"}, rrelu);
  detail::OpRule multinomial = rule;
  multinomial.output_metas = multinomial_metas;
  detail::register_overloads({"aten::multinomial"}, multinomial);
  detail::OpRule dropout = rule;
  dropout.output_metas = dropout_metas;
  detail::register_overloads({"aten::native_dropout"}, dropout);
  detail::register_overloads({"aten::native_dropout_backward"}, {.dim = dropout_backward, .family = "random"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
