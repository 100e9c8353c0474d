#include "graph_forms.h"

#include "dtensor/errors.h"
#include "reshard.h"

namespace dtensor::graph::detail {
namespace {

// GraphFormBuilder on a program: every op goes before the node being replaced, with its provenance.
class NodeFormBuilder final : public GraphFormBuilder {
 public:
  NodeFormBuilder(Program& program, const MeshPtr& mesh, Node* node)
      : program_(program), mesh_(mesh), node_(node), note_("graph form of " + node->op_name() + "'s local kernel") {}

  FormValue input(size_t arg) override {
    if (arg >= node_->args().size() || node_->args()[arg].kind != Arg::Kind::Tensor)
      throw DTensorError("graph: the graph form of node '" + node_->name + "' (" + node_->op_name() + ") reads its argument " +
                         std::to_string(arg) + ", which is not a tensor there");
    return handle(node_->args()[arg].values[0]);
  }

  c10::IValue argument(size_t arg) override {
    if (arg >= node_->args().size()) throw DTensorError("graph: the graph form of node '" + node_->name + "' reads a missing argument");
    const Arg& a = node_->args()[arg];
    switch (a.kind) {
      case Arg::Kind::Constant:
      case Arg::Kind::Number: return a.constant;
      case Arg::Kind::SymInt: return a.sizes.at(0).hint();
      case Arg::Kind::SymInts: {
        std::vector<int64_t> sizes;
        for (const SymSize& size : a.sizes) sizes.push_back(size.hint());
        return sizes;
      }
      default:
        throw DTensorError("graph: the graph form of node '" + node_->name + "' reads its tensor argument " + std::to_string(arg) +
                           " as a constant");
    }
  }

  std::vector<FormValue> call(const std::string& qualified, std::vector<FormArg> args, const std::string& name) override {
    std::vector<Arg> graph_args;
    for (FormArg& a : args) graph_args.push_back(graph_arg(a));
    Node* n = InsertionScope(program_.graph, node_).insert(qualified, std::move(graph_args), name);
    program_.annotations.set_note(*n, note_);
    infer_local_metas(*n);
    std::vector<FormValue> outputs;
    for (Value* v : n->outputs) outputs.push_back(handle(v));
    return outputs;
  }

  // A partial value along `mesh_dim` made whole there: the reshard the planner makes of it.
  FormValue all_reduce(FormValue v, ReduceOp op, int64_t mesh_dim) override {
    Placements partial(mesh_->ndim(), Replicate());
    partial.at(mesh_dim) = Partial(op);
    return reshard(v, value(v)->meta, partial, Placements(mesh_->ndim(), Replicate()));
  }

  FormValue reshard(FormValue v, const TensorMeta& global, const Placements& from, const Placements& to) override {
    Value* x = value(v);
    program_.annotations.set_placements(*x, from);
    return handle(insert_reshard(program_, mesh_, node_, x, global, to, note_));
  }

  Arg graph_arg(FormArg& a) const {
    if (a.value) return Arg::tensor(value(*a.value));
    if (a.call_argument) return as_called(*a.call_argument);
    if (!a.is_list) return Arg::of(std::move(a.constant));
    Arg list{Arg::Kind::Tensors};
    for (FormValue v : a.values) list.values.push_back(value(v));
    return list;
  }

  // The node's own argument (its symbolic sizes with it), for a non-tensor argument of the call.
  Arg as_called(size_t arg) const {
    if (arg >= node_->args().size()) throw DTensorError("graph: the graph form of node '" + node_->name + "' reads a missing argument");
    Arg a = node_->args()[arg];
    if (a.kind == Arg::Kind::Tensor || a.kind == Arg::Kind::Tensors || a.kind == Arg::Kind::OptionalTensors)
      throw DTensorError("graph: the graph form of node '" + node_->name + "' passes on its tensor argument " + std::to_string(arg) +
                         " as it is, not this rank's part of it");
    a.given = true;
    a.keyword = false;
    return a;
  }

  Value* value(FormValue v) const {
    if (v.id < 0 || static_cast<size_t>(v.id) >= values_.size())
      throw DTensorError("graph: the graph form of node '" + node_->name + "' used a value it was not given");
    return values_[v.id];
  }

 private:
  FormValue handle(Value* v) {
    values_.push_back(v);
    return FormValue{static_cast<int64_t>(values_.size()) - 1};
  }

  Program& program_;
  const MeshPtr& mesh_;
  Node* node_;
  std::string note_;
  std::vector<Value*> values_;  // FormValue::id indexes it
};

}  // namespace

Replacements write_graph_form(Program& program, const MeshPtr& mesh, Node* node, const GraphForm& form) {
  NodeFormBuilder builder(program, mesh, node);
  const std::vector<FormValue> outputs = form(builder);
  if (outputs.size() != node->outputs.size())
    throw DTensorError("graph: the graph form of node '" + node->name + "' (" + node->op_name() + ") gave " +
                       std::to_string(outputs.size()) + " outputs for the op's " + std::to_string(node->outputs.size()));
  Replacements replaced;
  for (size_t k = 0; k < outputs.size(); ++k) {
    Value *old_value = node->outputs[k], *by = builder.value(outputs[k]);
    if (const Placements* at = program.annotations.placements(*old_value)) program.annotations.set_placements(*by, *at);
    if (by->meta.shape == old_value->meta.shape) {  // the same value: its dynamic dims stay dynamic in the saved program
      by->symbolic_sizes = old_value->symbolic_sizes;
      by->symbolic_strides = old_value->symbolic_strides;
    }
    program.graph.replace_all_uses(old_value, by);
    replaced.emplace_back(old_value, by);
  }
  program.graph.erase(node);
  return replaced;
}

}  // namespace dtensor::graph::detail
