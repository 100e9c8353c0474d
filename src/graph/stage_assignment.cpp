#include "stage_assignment.h"

#include <algorithm>
#include <map>
#include <set>

#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

constexpr int kNotForward = -2;  // a value the forward part does not compute (a joint program's gradients)

bool under(const std::string& name, const std::string& module) { return name.rfind(module + ".", 0) == 0; }

// The modules that hold the program's parameters, for errors.
std::string parameter_modules(const Program& program) {
  std::vector<std::string> modules;
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind != InputSpec::Kind::Parameter) continue;
    const std::string module = spec.target.substr(0, spec.target.rfind('.'));
    if (std::find(modules.begin(), modules.end(), module) == modules.end()) modules.push_back(module);
  }
  std::string out;
  for (size_t i = 0; i < modules.size() && i < 16; ++i) out += (i ? ", " : "") + modules[i];
  return modules.size() > 16 ? out + ", ..." : out;
}

class Assigner {
 public:
  Assigner(const Program& program, const std::vector<std::string>& split_points)
      : program_(program), points_(split_points), stage_(program.graph.num_values(), kNotForward), is_parameter_(program.graph.num_values(), false) {
    out_.num_stages = static_cast<int>(split_points.size()) + 1;
  }

  StageAssignment run() {
    find_result();
    stage_inputs();
    mark_forward_part();
    for (const Node* n : out_.forward_part) {
      const int from_inputs = latest_input_stage(*n);
      set_stage(n, from_inputs == kEveryStage ? kEveryStage : std::max(from_inputs, module_stage(n->module_path)));
    }
    move_late_ops();
    check_parameters_in_their_stage();
    find_handed();
    return std::move(out_);
  }

 private:
  std::string where() const { return "split_program(" + (program_.source.empty() ? std::string("the program") : program_.source) + ")"; }
  int last_part() const { return out_.num_parts() - 1; }

  // The loss of a joint program, or the single output of a forward one.
  void find_result() {
    std::vector<Value*> losses, user_outputs;
    for (size_t i = 0; i < program_.outputs.size(); ++i) {
      Value* v = program_.graph.outputs()[i].values.empty() ? nullptr : program_.graph.outputs()[i].values[0];
      const OutputSpec::Kind kind = program_.outputs[i].kind;
      if (kind == OutputSpec::Kind::LossOutput) losses.push_back(v);
      if (kind == OutputSpec::Kind::UserOutput) user_outputs.push_back(v);
      if (kind == OutputSpec::Kind::BufferMutation || kind == OutputSpec::Kind::UserInputMutation)
        throw DTensorError(where() + ": the program mutates '" + program_.outputs[i].target + "'; stages of a program with mutations are not supported");
    }
    out_.has_loss = !losses.empty();
    if (out_.has_loss ? losses.size() != 1 : user_outputs.size() != 1)
      throw DTensorError(where() + ": a stage returns one tensor; the program returns " +
                         std::to_string(out_.has_loss ? losses.size() : user_outputs.size()) + (out_.has_loss ? " losses" : " outputs"));
    out_.result = out_.has_loss ? losses[0] : user_outputs[0];
    if (!out_.result || !out_.result->is_tensor()) throw DTensorError(where() + ": the program's result is not a tensor");
  }

  // Parameters by the split points before them; user input 0 on stage 0, the others (labels) on the
  // loss; buffers and constants in every stage.
  void stage_inputs() {
    std::vector<size_t> starts;
    std::vector<const InputSpec*> parameters;
    for (const InputSpec& spec : program_.inputs)
      if (spec.kind == InputSpec::Kind::Parameter) parameters.push_back(&spec);
    for (const std::string& point : points_) {
      auto first = std::find_if(parameters.begin(), parameters.end(), [&](const InputSpec* p) { return under(p->target, point); });
      if (first == parameters.end())
        throw DTensorError(where() + ": split point '" + point + "' names no module with parameters; the program's modules: " + parameter_modules(program_));
      const size_t at = static_cast<size_t>(first - parameters.begin());
      if (at == 0) throw DTensorError(where() + ": split point '" + point + "' starts at the first parameter, which leaves stage 0 empty");
      if (!starts.empty() && at == starts.back())
        throw DTensorError(where() + ": split points '" + points_[starts.size() - 1] + "' and '" + point +
                           "' start at the same parameter, which leaves a stage empty");
      if (!starts.empty() && at < starts.back())
        throw DTensorError(where() + ": split point '" + point + "' comes before the one ahead of it ('" + points_[starts.size() - 1] +
                           "') in the order the program takes its parameters; give split points in forward order");
      starts.push_back(at);
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      stage_[parameters[i]->value->id] = static_cast<int>(std::upper_bound(starts.begin(), starts.end(), i) - starts.begin());
      is_parameter_[parameters[i]->value->id] = true;
    }
    int user = 0;
    const size_t user_inputs = program_.user_inputs().size();
    if (out_.has_loss && user_inputs != 2)
      throw DTensorError(where() + ": a joint program's stages take the model's input and its loss the labels; the program takes " +
                         std::to_string(user_inputs) + " user inputs");
    for (const InputSpec& spec : program_.inputs) {
      if (spec.kind == InputSpec::Kind::Buffer || spec.kind == InputSpec::Kind::TensorConstant) stage_[spec.value->id] = kEveryStage;
      if (spec.kind != InputSpec::Kind::UserInput) continue;
      if (user > 0 && !out_.has_loss)
        throw DTensorError(where() + ": a forward program's first stage takes one input; the program takes more (%" + spec.value->name + ")");
      stage_[spec.value->id] = user++ == 0 ? 0 : out_.num_stages;
    }
  }

  void mark_forward_part() {
    std::vector<const Value*> todo = {out_.result};
    std::set<const Node*> seen;
    while (!todo.empty()) {
      const Node* n = todo.back()->producer();
      todo.pop_back();
      if (!n || !seen.insert(n).second) continue;
      for (const Value* v : n->inputs()) todo.push_back(v);
    }
    for (const Node* n : program_.graph.nodes())
      if (seen.count(n)) out_.forward_part.push_back(n);
  }

  // The stage of the innermost module around `path` that holds parameters (its first one's stage), where
  // the program records module paths: a parameter-free op of a later module (a norm's statistics)
  // runs with it. kEveryStage where none is known.
  int module_stage(const std::string& path) {
    if (auto known = module_stages_.find(path); known != module_stages_.end()) return known->second;
    int stage = kEveryStage;
    for (std::string prefix = path; !prefix.empty() && stage == kEveryStage;
         prefix = prefix.rfind('.') == std::string::npos ? "" : prefix.substr(0, prefix.rfind('.')))
      for (const InputSpec& spec : program_.inputs)
        if (spec.kind == InputSpec::Kind::Parameter && under(spec.target, prefix)) {
          stage = stage_[spec.value->id];
          break;
        }
    return module_stages_[path] = stage;
  }

  int latest_input_stage(const Node& n) const {
    int stage = kEveryStage;
    for (const Value* v : n.inputs()) stage = std::max(stage, stage_[v->id]);
    return stage;
  }

  void set_stage(const Node* n, int stage) {
    out_.node_stage[n] = stage;
    for (const Value* v : n->outputs) stage_[v->id] = stage;
  }

  // The stage of what reads `v` first in the pipeline (the last part where the program returns it;
  // num_parts() where no stage reads it).
  int first_reader_stage(const Value* v) const {
    int first = v == out_.result ? last_part() : out_.num_parts();
    for (const Node* user : v->uses())
      if (auto it = out_.node_stage.find(user); it != out_.node_stage.end() && it->second != kEveryStage) first = std::min(first, it->second);
    return first;
  }

  // The stage of what reads `v` last (the last part where the program returns it), `except`'s read
  // left out; kEveryStage where no stage reads it.
  int last_reader_stage(const Value* v, const Node* except) const {
    int last = v == out_.result ? last_part() : kEveryStage;
    for (const Node* user : v->uses())
      if (user != except)
        if (auto it = out_.node_stage.find(user); it != out_.node_stage.end()) last = std::max(last, it->second);
    return last;
  }

  // A parameter is read in one stage, the one its place among the parameters gives it: its gradient
  // accumulates there, and the model registers its modules in forward order there (Llama's layers
  // register attention, MLP, then the norms: a split point inside a layer is no boundary of the
  // forward order). Tied weights across stages are not supported, as PyTorch's pipeline() does not.
  void check_parameters_in_their_stage() const {
    for (const InputSpec& spec : program_.inputs) {
      if (spec.kind != InputSpec::Kind::Parameter) continue;
      std::set<int> stages;
      for (const Node* user : spec.value->uses())
        if (auto it = out_.node_stage.find(user); it != out_.node_stage.end()) stages.insert(it->second);
      if (stages.size() > 1)
        throw DTensorError(where() + ": parameter '" + spec.target + "' is read by stages " + std::to_string(*stages.begin()) + " and " +
                           std::to_string(*stages.rbegin()) + " (a tied weight); each parameter belongs to one stage: untie it, or keep its readers in one stage");
      if (!stages.empty() && *stages.begin() != stage_[spec.value->id])
        throw DTensorError(where() + ": parameter '" + spec.target + "' comes in stage " + std::to_string(stage_[spec.value->id]) +
                           " by the program's order of parameters, but " + part_name(*stages.begin()) +
                           " reads it: the model registers its modules in another order than its forward runs them there; put the split "
                           "points at whole layers");
    }
  }

  // Ops of no known module whose readers all run later move to the next stage where that hands it no
  // more tensors: the parameter-free start of a layer joins the layer (see program_stages.h). In
  // reverse order, so that a chain moves as one.
  void move_late_ops() {
    for (auto it = out_.forward_part.rbegin(); it != out_.forward_part.rend(); ++it) {
      const Node* n = *it;
      const int stage = out_.node_stage.at(n);
      if (stage == kEveryStage || stage >= last_part() || reads_parameter(*n) || module_stage(n->module_path) != kEveryStage) continue;
      bool later = true;
      for (const Value* v : n->outputs) later = later && first_reader_stage(v) > stage;
      if (later && handed_after_move(*n, stage) <= 0) set_stage(n, stage + 1);
    }
  }

  bool reads_parameter(const Node& n) const {
    const auto inputs = n.inputs();
    return std::any_of(inputs.begin(), inputs.end(), [&](const Value* v) { return is_parameter_[v->id]; });
  }

  // How many more tensors cross after `stage` once `n` runs in the next stage: its inputs from this
  // stage or before that nothing else reads later start crossing, its outputs stop.
  int handed_after_move(const Node& n, int stage) const {
    int delta = 0;
    for (const Value* v : n.outputs)
      if (first_reader_stage(v) < out_.num_parts()) --delta;
    std::set<const Value*> inputs;
    for (const Value* v : n.inputs())
      if (stage_[v->id] != kEveryStage && inputs.insert(v).second && last_reader_stage(v, &n) <= stage) ++delta;
    return delta;
  }

  void find_handed() {
    std::vector<std::vector<Value*>> crossing(static_cast<size_t>(out_.num_parts()));
    std::vector<bool> empty(static_cast<size_t>(out_.num_parts()), true);
    for (const Node* n : out_.forward_part) {
      const int stage = out_.node_stage.at(n);
      if (stage != kEveryStage) empty[static_cast<size_t>(stage)] = false;
      for (Value* v : n->inputs())
        for (int boundary = std::max(stage_[v->id], 0); boundary < stage; ++boundary)
          if (stage_[v->id] != kEveryStage && std::find(crossing[boundary].begin(), crossing[boundary].end(), v) == crossing[boundary].end())
            crossing[boundary].push_back(v);
    }
    for (int part = 0; part < out_.num_parts(); ++part)
      if (empty[static_cast<size_t>(part)]) throw DTensorError(where() + ": " + part_name(part) + " has no ops; move or drop a split point");
    for (int boundary = 0; boundary + 1 < out_.num_parts(); ++boundary) {
      const auto& values = crossing[static_cast<size_t>(boundary)];
      for (const Value* v : values)
        if (!v->is_tensor())
          throw DTensorError(where() + ": " + part_name(boundary) + " would hand " + part_name(boundary + 1) + " the symbolic size %" + v->name +
                             "; programs with dynamic shapes are not split into stages yet: export with static shapes");
      if (values.size() != 1) throw DTensorError(where() + ": " + part_name(boundary) + " would hand " + part_name(boundary + 1) + " " +
                                                 std::to_string(values.size()) + " tensors (" + names(values) +
                                                 "); a stage hands the next one tensor: put the split point where one tensor flows (between layers)");
      out_.handed.push_back(values[0]);
    }
  }

  std::string part_name(int part) const { return part == out_.num_stages ? std::string("the loss") : "stage " + std::to_string(part); }

  static std::string names(const std::vector<Value*>& values) {
    std::string out;
    for (const Value* v : values) {
      out += (out.empty() ? "%" : ", %") + v->name;
      if (v->producer() && !v->producer()->module_path.empty()) out += " of " + v->producer()->module_path;
    }
    return out;
  }

  const Program& program_;
  const std::vector<std::string>& points_;
  std::vector<int> stage_;  // by value id
  std::vector<bool> is_parameter_;  // by value id
  std::map<std::string, int> module_stages_;
  StageAssignment out_;
};

}  // namespace

StageAssignment assign_stages(const Program& program, const std::vector<std::string>& split_points) {
  return Assigner(program, split_points).run();
}

}  // namespace dtensor::graph::detail
