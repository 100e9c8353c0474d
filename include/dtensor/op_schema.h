#pragma once
// The sharding-propagation data model (after PyTorch's _op_schema.py): an op call described by its
// input specs and non-tensor arguments (OpSchema), the ways the op can run (PlacementStrategy: the
// placements of every output and the placements every input must have, with the cost of getting
// there), and the decision propagation hands to dispatch (OutputSharding).

#include <ATen/core/function_schema.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/spec.h"

namespace dtensor {

using SpecPtr = std::shared_ptr<const DTensorSpec>;

// One tensor input of a call: its position in the argument list and its spec.
struct TensorInput {
  size_t arg;          // index into the schema's arguments
  int64_t list_index;  // position inside a Tensor[] argument; -1 for a Tensor argument
  SpecPtr spec;
};

// An op call as propagation sees it. `args` are the call's arguments, readable while strategies are
// computed (never kept). `outputs` are the global metas of the op's tensor outputs, computed by the
// op's own meta kernel on the global shapes.
struct OpSchema {
  const c10::FunctionSchema& schema;
  c10::ArrayRef<c10::IValue> args;
  std::vector<TensorInput> inputs;
  std::vector<TensorMeta> outputs;
  // A plain pointer: rules' local kernels capture it, and the propagation cache that keeps those must
  // not keep meshes alive (see OutputSharding).
  const DeviceMesh* mesh;

  const DTensorSpec& input(size_t i) const { return *inputs[i].spec; }
  int64_t input_ndim(size_t i) const { return inputs[i].spec->ndim(); }
  int64_t output_ndim(size_t i = 0) const { return static_cast<int64_t>(outputs[i].shape.size()); }
  // The tensor input at argument `arg` (for Tensor arguments), or nullopt when it is None.
  std::optional<size_t> input_at_arg(size_t arg) const;
  // "aten::mm" or "aten::add.Tensor"
  std::string op_name() const;
};

// Strategy costs are bytes moved per rank, and every collective also costs this much (its latency in
// bytes: ~16 kB on loopback Gloo), so that a few small tensors are not moved to save a byte.
constexpr double kCollectiveLatencyBytes = 16 * 1024;

// One way to run the op on the whole mesh.
struct PlacementStrategy {
  std::vector<Placements> outputs;  // one per tensor output
  std::vector<Placements> inputs;   // one per OpSchema::inputs entry
  std::vector<double> redistribute_cost;  // per input; filled in by propagation
  double kernel_cost = 0;  // communication the strategy's local kernel does itself (cost units above)

  std::string str() const;  // "(S(0),R), (R,R) -> (S(0),R)"
};
using OpStrategy = std::vector<PlacementStrategy>;

// One way to run the op along a single mesh dim. Propagation expands these to the whole mesh by
// choosing one per mesh dim (every combination), so a rule only describes the op's math.
struct DimStrategy {
  Placements outputs;  // one placement per tensor output
  Placements inputs;   // one placement per tensor input
  double kernel_cost = 0;  // communication its local kernel does along this mesh dim
};

// Non-tensor arguments replaced for the local call: (argument index, value). Ops whose arguments
// are global sizes (view, expand, new_zeros, ...) get this rank's local sizes.
using LocalArgs = std::vector<std::pair<size_t, c10::IValue>>;

// Replaces the op itself for the local computation when running it on shards is not enough (a mean
// over an unevenly sharded dim divides by the global count; a vocabulary-sharded embedding masks
// indices). Called with the stack holding the local arguments; must leave the op's returns (local
// results) on it, like a boxed kernel. May run collectives on the mesh (identically on every rank).
using LocalKernel = std::function<void(const c10::OperatorHandle&, torch::jit::Stack&)>;

// A local kernel written as ops a graph can hold (ATen ops and _c10d_functional collectives), so that
// a per-rank program running it can be saved, loaded by torch.export.load and compiled like any other.
// The rule that owns the kernel writes it (OpRule::graph_form), against this builder, which the graph
// layer implements: a value is a handle the builder gave out.
struct FormValue {
  int64_t id = -1;
};
// An argument of an op in a graph form: a value, a list of values (Tensor[]), a constant (numbers,
// lists, dtypes, None, ...), or a non-tensor argument of the call passed on as the call has it
// (as_called: in a graph, symbolic sizes stay symbolic).
struct FormArg {
  std::optional<FormValue> value;
  std::vector<FormValue> values;
  bool is_list = false;
  c10::IValue constant;
  std::optional<size_t> call_argument;
  static FormArg as_called(size_t arg) {
    FormArg a{c10::IValue()};
    a.call_argument = arg;
    return a;
  }
  FormArg(FormValue v) : value(v) {}  // NOLINT: each kind reads as an argument
  FormArg(std::vector<FormValue> list) : values(std::move(list)), is_list(true) {}  // NOLINT
  FormArg(c10::IValue c) : constant(std::move(c)) {}  // NOLINT
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  FormArg(T number) : constant(number) {}  // NOLINT
  FormArg(std::vector<int64_t> ints) : constant(std::move(ints)) {}  // NOLINT
};
class GraphFormBuilder {
 public:
  virtual ~GraphFormBuilder() = default;
  // This rank's part of the call's tensor argument `arg` (numbered as the op's schema numbers them).
  virtual FormValue input(size_t arg) = 0;
  // The call's non-tensor argument `arg` as this call passes it. A form reads numbers (Scalar
  // arguments: alpha, a norm's order) here, never from the OpSchema it was made with: decisions are
  // cached across calls whose numbers differ, and so are their forms.
  virtual c10::IValue argument(size_t arg) = 0;
  // A call of dispatcher op `qualified` ("aten::sub.Scalar") with `args` for its leading arguments and
  // the schema's defaults for the rest; its outputs (tensors), named after `name`.
  virtual std::vector<FormValue> call(const std::string& qualified, std::vector<FormArg> args, const std::string& name) = 0;
  // The same, its first output (none for an op without outputs, such as an assertion).
  FormValue op(const std::string& qualified, std::vector<FormArg> args, const std::string& name) {
    std::vector<FormValue> outputs = call(qualified, std::move(args), name);
    return outputs.empty() ? FormValue{} : outputs[0];
  }
  // `value` reduced by `op` over the group of mesh dim `mesh_dim`, every rank of it getting the result
  // (_c10d_functional.all_reduce and its wait_tensor).
  virtual FormValue all_reduce(FormValue value, ReduceOp op, int64_t mesh_dim) = 0;
  // `value`, this rank's part under `from` of a tensor of meta `global`, moved to `to` as
  // redistribute moves it (an all-gather of a shard, a reduce-scatter of a partial value, ...): this
  // rank's part under `to`.
  virtual FormValue reshard(FormValue value, const TensorMeta& global, const Placements& from, const Placements& to) = 0;
};
// Writes the kernel's computation with the builder and returns its outputs, one per op output.
using GraphForm = std::function<std::vector<FormValue>(GraphFormBuilder&)>;

// The decision for a call: where each output lives and where each input must be moved first. It is
// cached, and caches must not keep meshes alive, so output specs carry no mesh (dispatch gives them
// the call's), and a LocalKernel captures the mesh by plain pointer (OpSchema::mesh.get()): a cached
// decision is only ever used for DTensors on its own, living mesh.
struct OutputSharding {
  std::vector<DTensorSpec> outputs;                   // one per tensor output; `mesh` left empty
  std::vector<std::optional<Placements>> input_moves;  // per input; nullopt when it stays as is
  LocalArgs local_args;
  LocalKernel local_kernel;  // empty: run the op itself
  GraphForm graph_form;      // the local kernel as graph ops; empty where it has none
  PlacementStrategy chosen;
};

using DimRule = std::function<std::vector<DimStrategy>(const OpSchema&)>;
using MeshRule = std::function<OpStrategy(const OpSchema&)>;
using LocalArgsRule = std::function<LocalArgs(const OpSchema&, const PlacementStrategy&)>;
// Returns the LocalKernel for the chosen strategy, or an empty one to run the op itself.
using LocalKernelRule = std::function<LocalKernel(const OpSchema&, const PlacementStrategy&)>;
// Returns the GraphForm of the local kernel the LocalKernelRule returns for the same call and strategy.
using GraphFormRule = std::function<GraphForm(const OpSchema&, const PlacementStrategy&)>;
// Global metas of an op's outputs computed by a rule family, for ops without a Meta kernel (the
// fallback otherwise runs the op on expanded-zero stand-ins of the global shapes).
using OutputMetaRule = std::function<std::vector<TensorMeta>(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue>)>;

// This rank's local shape of output `k` under `strategy` (what a global-size argument becomes).
Shape local_output_shape(const OpSchema& schema, const PlacementStrategy& strategy, size_t k = 0);

}  // namespace dtensor
