// set_param_groups: a PyTorch optimizer's param_groups, as DCP keeps them (bytes entries), set into a
// LibTorch optimizer's group options (state_dict.h).

#include <ATen/core/ivalue.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <unordered_map>

#include "dtensor/errors.h"
#include "dtensor/state_dict.h"

namespace dtensor::checkpoint {
namespace {

// The options of group `index`, entries "<prefix><index>.<name>", each read once (unread ones are refused
// after, so that an option this reader does not know never passes silently).
class GroupEntries {
 public:
  GroupEntries(const std::map<std::string, c10::IValue>& entries, const std::string& prefix, size_t index)
      : entries_(entries), prefix_(prefix + std::to_string(index) + ".") {}

  const c10::IValue& at(const std::string& name) {
    const auto it = entries_.find(prefix_ + name);
    if (it == entries_.end()) fail(name, "is missing");
    read_.insert(name);
    return it->second;
  }
  double number(const std::string& name) {
    const c10::IValue& v = at(name);
    if (v.isDouble()) return v.toDouble();
    if (v.isInt()) return static_cast<double>(v.toInt());
    fail(name, "is " + v.tagKind() + ", not a number");
  }
  bool boolean(const std::string& name) {
    const c10::IValue& v = at(name);
    if (!v.isBool()) fail(name, "is " + v.tagKind() + ", not True or False");
    return v.toBool();
  }
  std::tuple<double, double> pair(const std::string& name) {
    const c10::IValue& v = at(name);
    std::vector<c10::IValue> two;
    if (v.isTuple()) two = v.toTupleRef().elements().vec();
    if (v.isList()) two = v.toListRef().vec();
    const auto is_number = [](const c10::IValue& x) { return x.isDouble() || x.isInt(); };  // (0, 0.99) holds an int
    if (two.size() != 2 || !is_number(two[0]) || !is_number(two[1])) fail(name, "is not two numbers");
    return {two[0].toScalar().toDouble(), two[1].toScalar().toDouble()};
  }
  std::vector<std::string> strings(const std::string& name) {
    const c10::IValue& v = at(name);
    if (!v.isList()) fail(name, "is " + v.tagKind() + ", not a list of parameter names");
    std::vector<std::string> out;
    for (const c10::IValue& e : v.toListRef()) {
      if (!e.isString()) fail(name, "holds " + e.tagKind() + ", not a parameter name");
      out.push_back(e.toStringRef());
    }
    return out;
  }
  // What the step does not read: PyTorch's implementation switches, which change how the step runs,
  // not what it computes, and an LR scheduler's initial_lr.
  void ignore(std::initializer_list<const char*> names) {
    for (const char* name : names)
      if (entries_.count(prefix_ + name)) read_.insert(name);
  }
  // Every entry of the group was read.
  void check_all_read() const {
    for (auto it = entries_.lower_bound(prefix_); it != entries_.end() && it->first.compare(0, prefix_.size(), prefix_) == 0; ++it)
      if (!read_.count(it->first.substr(prefix_.size())))
        fail(it->first.substr(prefix_.size()), "is an option LibTorch's optimizer of this kind does not have");
  }
  [[noreturn]] void fail(const std::string& name, const std::string& what) const {
    throw DTensorError("set_param_groups: '" + prefix_ + name + "' " + what);
  }

 private:
  const std::map<std::string, c10::IValue>& entries_;
  std::string prefix_;
  std::set<std::string> read_;
};

template <class Options>
void set_adam(Options& options, GroupEntries& group, bool adamw) {
  options.lr(group.number("lr"));
  options.betas(group.pair("betas"));
  options.eps(group.number("eps"));
  options.weight_decay(group.number("weight_decay"));
  options.amsgrad(group.boolean("amsgrad"));
  if (group.boolean("decoupled_weight_decay") != adamw)
    group.fail("decoupled_weight_decay", adamw ? "is False (an Adam was saved), but this optimizer is AdamW"
                                               : "is True (an AdamW was saved), but this optimizer is Adam");
  group.ignore({"capturable"});
}

void set_sgd(torch::optim::SGDOptions& options, GroupEntries& group) {
  options.lr(group.number("lr"));
  options.momentum(group.number("momentum"));
  options.dampening(group.number("dampening"));
  options.weight_decay(group.number("weight_decay"));
  options.nesterov(group.boolean("nesterov"));
}

}  // namespace

void set_param_groups(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const std::map<std::string, c10::IValue>& entries,
                      const std::string& prefix) {
  std::unordered_map<const void*, std::string> path_of;
  for (const auto& item : module.named_parameters()) path_of.emplace(item.value().unsafeGetTensorImpl(), item.key());
  auto& groups = optimizer.param_groups();
  for (auto it = entries.lower_bound(prefix); it != entries.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    // "<prefix><i>.<option>", i written as Python writes it (no leading zeros).
    const size_t dot = it->first.find('.', prefix.size());
    const std::string index = it->first.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
    const bool number = dot != std::string::npos && !index.empty() && index.size() < 10 &&
                        std::all_of(index.begin(), index.end(), [](unsigned char c) { return std::isdigit(c); }) &&
                        (index == "0" || index[0] != '0');
    if (!number || std::stoul(index) >= groups.size())
      throw DTensorError("set_param_groups: '" + it->first + "' belongs to no group of this optimizer (it has " +
                         std::to_string(groups.size()) + ")");
  }
  // Each group's options are read into a copy: a refused call leaves the optimizer as it was.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> read;
  for (size_t i = 0; i < groups.size(); ++i) {
    GroupEntries group(entries, prefix, i);
    std::vector<std::string> mine;
    for (const at::Tensor& p : groups[i].params()) {
      const auto it = path_of.find(p.unsafeGetTensorImpl());
      if (it == path_of.end()) throw DTensorError("set_param_groups: group " + std::to_string(i) + " steps a parameter that is not in the module");
      mine.push_back(it->second);
    }
    if (group.strings("params") != mine)
      group.fail("params", "names other parameters than this optimizer's group " + std::to_string(i) +
                               " holds (or in another order); build the groups as the saved optimizer had them");
    std::unique_ptr<torch::optim::OptimizerOptions> options = groups[i].options().clone();
    if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(options.get())) set_adam(*adamw, group, true);
    else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(options.get())) set_adam(*adam, group, false);
    else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(options.get())) set_sgd(*sgd, group);
    else throw DTensorError("set_param_groups: supports Adam, AdamW and SGD, as TrainingState does");
    // What every kind shares: no maximize in LibTorch; switches of how the step runs, and an LR
    // scheduler's initial_lr, which the step does not read.
    if (group.boolean("maximize")) group.fail("maximize", "is True, which LibTorch's optimizers cannot do");
    group.ignore({"foreach", "differentiable", "fused", "initial_lr"});
    group.check_all_read();
    read.push_back(std::move(options));
  }
  for (size_t i = 0; i < groups.size(); ++i) groups[i].set_options(std::move(read[i]));
}

}  // namespace dtensor::checkpoint
