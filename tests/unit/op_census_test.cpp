// The op census: every aten overload PyTorch 2.15's DTensor shards (listed at build time from its
// registries by scripts/pytorch_dtensor_ops.py) has a dtensor rule, or a line in
// tests/op_census_exclusions.txt saying why not. An exclusion that no longer applies (the op has a rule
// now, or PyTorch no longer lists it) fails too, so the file only shrinks.

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "../support/build_paths.h"
#include "dtensor/sharding.h"

namespace {

std::set<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::set<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.insert(line);
  return out;
}

// "aten::op.overload  reason" lines ('#' starts a comment line).
std::map<std::string, std::string> read_exclusions(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::map<std::string, std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string op, reason;
    fields >> op;
    std::getline(fields >> std::ws, reason);
    out[op] = reason;
  }
  return out;
}

TEST(OpCensus, EveryOverloadPyTorchShardsHasARuleOrAReason) {
  const std::set<std::string> pytorch = read_lines(dtensor::build_paths::census_pytorch_ops);
  const auto exclusions = read_exclusions(dtensor::build_paths::census_exclusions);
  std::set<std::string> ours;
  for (const std::string& op : dtensor::ops_with_sharding_rules())
    if (op.rfind("aten::", 0) == 0) ours.insert(op);

  size_t both = 0;
  for (const std::string& op : pytorch) {
    if (ours.count(op)) {
      ++both;
      EXPECT_FALSE(exclusions.count(op)) << op << " has a rule now: remove it from tests/op_census_exclusions.txt";
      continue;
    }
    const auto excluded = exclusions.find(op);
    EXPECT_TRUE(excluded != exclusions.end()) << op << ": PyTorch's DTensor shards it, dtensor has no rule and no exclusion";
    if (excluded != exclusions.end()) EXPECT_FALSE(excluded->second.empty()) << op << ": an exclusion needs its reason";
  }
  for (const auto& [op, reason] : exclusions)
    EXPECT_TRUE(pytorch.count(op)) << op << " is excluded but PyTorch's DTensor does not list it: remove the line";
  std::cout << "op census: PyTorch's DTensor shards " << pytorch.size() << " aten overloads, dtensor " << ours.size() << "; "
            << both << " in both, " << ours.size() - both << " only in dtensor, " << pytorch.size() - both
            << " only in PyTorch (each excluded with its reason in tests/op_census_exclusions.txt)\n";
}

}  // namespace
