// Random ops (uniform_, normal_, bernoulli_, native_dropout, ...). A DTensor gets exactly the values
// single-device LibTorch gives the whole tensor with the same generator state, whatever its layout.
//
// LibTorch's CPU generator (mt19937) has no cheap skip-ahead, and each kernel consumes it in its own
// order (one draw per element in memory order for most, blocks of 16 for a large normal_, MKL streams
// seeded from one draw for bernoulli_ with a scalar p), so no rank can draw just its own part. Every
// rank therefore runs the op itself on global-size stand-ins of its inputs and keeps its part of each
// result: the ranks' generators advance exactly as a single-device run's would (they must start in
// the same state: seed every rank alike). Cost per rank: the draws, time and memory of the whole
// tensor (O(global numel)) instead of its shard, but no communication.
//
// A stand-in holds this rank's shard of the input in its place and zeros elsewhere. That is enough
// because the kernels draw the same numbers whatever the input values are (bernoulli's p and normal's
// mean/std are used after the draw, one per element), and output element i reads only input element
// i, so an input laid out like the output (or replicated) covers the part this rank keeps. Zeros are
// valid for every parameter tensor (a probability, a standard deviation, a dropout input). Inputs that
// are read and Partial are reduced first; a Partial tensor filled in place stays Partial.
//
// Ranks outside the mesh run no op, so their generators do not advance. On a propagation-cache miss
// an op without a C++ Meta kernel runs once more to learn its output layout (metas_without_drawing).

#include <ATen/ATen.h>

#include "../../redistribute/executor.h"
#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

bool writes(const OpSchema& s, size_t input) {
  const auto* alias = s.schema.arguments()[s.inputs[input].arg].alias_info();
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
// contributions that reduce to it (see held_part). Inputs that are read must be actual values.
std::vector<DimStrategy> random_fill(const OpSchema& s) {
  auto strategies = elementwise(s);
  for (size_t w = 0; w < s.inputs.size(); ++w) {
    if (!writes(s, w)) continue;
    for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      DimStrategy st{Placements(s.outputs.size(), Partial(op)), Placements(s.inputs.size(), Replicate())};
      st.inputs[w] = Partial(op);
      strategies.push_back(std::move(st));
    }
  }
  return strategies;
}

// native_dropout_backward(grad, mask, scale) = grad * mask * scale: elementwise and linear in grad.
std::vector<DimStrategy> dropout_backward(const OpSchema& s) {
  auto strategies = elementwise(s);
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) strategies.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return strategies;
}

// ---- the local kernel: the op on global-size stand-ins ------------------------------------------

at::Tensor region(const at::Tensor& global, const LocalLayout& layout) {
  at::Tensor part = global;
  for (size_t d = 0; d < layout.shape.size(); ++d)
    part = part.narrow(static_cast<int64_t>(d), layout.offset[d], layout.shape[d]);
  return part;
}

LocalLayout layout_of(const at::Tensor& global, const DeviceMesh& mesh, const Placements& placements) {
  return local_layout(global.sizes().vec(), mesh.shape(), *mesh.coordinate(), placements);
}

// What this rank holds of `global` under `placements`: its shard, and along every Partial mesh dim a
// contribution whose reduction is the value.
at::Tensor held_part(const at::Tensor& global, const DeviceMesh& mesh, const Placements& placements) {
  // A copy, not a view, so the global result is freed.
  at::Tensor part = region(global, layout_of(global, mesh, placements)).clone(at::MemoryFormat::Contiguous);
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = placements[m];
    if (p.is_partial()) part = detail::partition_replicated(part, mesh, m, p.reduce_op(), detail::Direction::Forward);
  }
  return part;
}

struct StandIn {
  size_t arg;          // the input's argument index
  TensorMeta meta;     // its global shape, strides and dtype
  Placements placements;  // the placements its local shard has when the kernel runs
};

// Zeros of a global shape with its strides, so that a kernel visits (and draws for) the elements in
// the single-device order; contiguous where the strides overlap (an expanded tensor's).
at::Tensor zeros_laid_out(const Shape& shape, const Shape& stride, const at::TensorOptions& options) {
  at::Tensor global = at::empty_strided(shape, stride, options);
  if (!global.is_non_overlapping_and_dense()) global = at::empty(shape, options);
  return global.zero_();
}

// A global-size tensor holding `local` in its place and zeros elsewhere.
at::Tensor stand_in(const at::Tensor& local, const StandIn& in, const DeviceMesh& mesh) {
  at::Tensor global = zeros_laid_out(in.meta.shape, in.meta.stride, local.options());
  region(global, layout_of(global, mesh, in.placements)).copy_(local);
  return global;
}

LocalKernel run_on_global(const OpSchema& s, const PlacementStrategy& chosen) {
  std::vector<StandIn> inputs;
  for (size_t k = 0; k < s.inputs.size(); ++k) inputs.push_back({s.inputs[k].arg, s.input(k).meta, chosen.inputs[k]});
  return [inputs, outputs = chosen.outputs, mesh = s.mesh](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    c10::IValue* args = stack.data() + (stack.size() - op.schema().arguments().size());
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
      returns[j] = held_part(global, *mesh, outputs[j]);
      // An in-place op returns the stand-in it filled: its part goes back into the caller's shard.
      for (size_t k = 0; k < globals.size(); ++k)
        if (globals[k].is_same(global)) returns[j] = locals[k].copy_(returns[j].toTensor());
    }
  };
}

// ---- output metas ----------------------------------------------------------------------------------

// The generator a call draws from: its Generator argument, else the default one of its device.
at::Generator generator_of(c10::ArrayRef<c10::IValue> args, c10::Device device) {
  for (const auto& v : args)
    if (v.isGenerator()) return v.toGenerator();
  return at::globalContext().defaultGenerator(device);
}

// LibTorch's C++ build has no Meta kernel for native_dropout and normal with tensor parameters
// (Python registers them), and propagation's fallback runs the op itself, which draws: every rank's
// generator would run ahead of a single-device run's. So the op runs here on zeros of the global
// layouts, and the generator's state is put back.
std::vector<TensorMeta> metas_without_drawing(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack stack;
  c10::Device device = at::kCPU;
  for (const auto& v : args) {
    if (!v.isTensor() || !v.toTensor().defined()) {
      stack.push_back(v);
      continue;
    }
    const at::Tensor& t = v.toTensor();  // a DTensor's sizes and strides are the global ones
    device = t.device();
    stack.push_back(zeros_laid_out(t.sizes().vec(), t.strides().vec(), at::TensorOptions().dtype(t.scalar_type()).device(device)));
  }
  at::Generator generator = generator_of(args, device);
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  op.callBoxed(stack);
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  std::vector<TensorMeta> metas;
  for (const auto& r : stack) {
    const at::Tensor& t = r.toTensor();
    metas.push_back(TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  return metas;
}

const bool registered = [] {
  // Only ops with kernels of their own: rand_like, randn_like, randint_like, bernoulli(p tensor),
  // uniform, ... are composites of empty_like and these; dropout on CPU is empty_like, bernoulli_,
  // div_ and mul.
  detail::register_overloads({"aten::uniform_", "aten::normal_", "aten::normal.Tensor_Tensor", "aten::normal.Tensor_float",
                              "aten::normal.float_Tensor", "aten::bernoulli_.float", "aten::bernoulli_.Tensor",
                              "aten::bernoulli.p", "aten::exponential_", "aten::cauchy_", "aten::log_normal_",
                              "aten::geometric_", "aten::random_", "aten::random_.from", "aten::random_.to",
                              "aten::native_dropout"},
                             {.dim = random_fill,
                              .local_kernel = run_on_global,
                              .output_metas = metas_without_drawing,
                              .family = "random"});
  detail::register_overloads({"aten::native_dropout_backward"}, {.dim = dropout_backward, .family = "random"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
