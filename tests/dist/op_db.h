#pragma once
// The op database: sample calls for every op dtensor has a sharding rule for. Each sample runs on
// DTensors for every combination of Replicate / Shard(d) inputs on a 1-d mesh of 4 ranks (and on a
// 2x2 mesh when marked), again with each input Partial(sum / avg / max / min) holding random
// per-rank contributions, and with inputs StridedShard (alone, and alike where shapes allow) on the
// 1-d mesh; its outputs and the gradients of sum(outputs) are compared with the same
// call on the full tensors on one device. A coverage test prints, per op, the placements and meshes
// exercised and whether gradients were checked, and fails when an op with a rule is not exercised or
// an op with a derivative has no gradient check.

#include <functional>
#include <string>
#include <vector>

#include "harness.h"

namespace dtensor::testing {

struct OpSample {
  std::string name;  // unique; names the generated test
  std::vector<Shape> shapes;  // full shapes of the tensor inputs
  // The call, on DTensors or on plain tensors alike.
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> run;
  // Input i of the given shape (same on every rank); default: integer-valued doubles.
  std::function<at::Tensor(size_t, const Shape&)> make_input = nullptr;
  // Placements to try per input; default: Replicate and Shard(d) for every dim.
  std::vector<std::vector<Placement>> placements = {};
  bool backward = true;  // also compare the gradients of sum(outputs) w.r.t. floating inputs
  bool two_d = false;    // also run on the 2x2 mesh (every pair of per-dim placements)
  double rtol = 1e-7;
  double atol = 1e-9;
  // Non-empty: the op is refused on DTensors by design; the call must throw a DTensorError saying this.
  std::string expect_error = "";
  std::vector<bool> differentiable = {};  // per input; default: every floating input gets a gradient
  // With backward = false for a differentiable call: why its gradient cannot be compared (shown in the
  // coverage table; without a reason, an op with a derivative and no gradient check fails coverage).
  std::string no_backward_reason = "";
  bool partial_inputs = true;  // also run each non-boolean input as every kind of Partial
};

// Adds samples (called from static initialisers of the sample files).
bool add_op_samples(std::vector<OpSample> samples);
const std::vector<OpSample>& op_samples();

// Registers one gtest per sample plus the coverage test; called from main before the tests run.
void register_op_db_tests();

// Every tensor returned by a call, in order, for samples whose call returns a tuple.
template <typename... T>
std::vector<at::Tensor> outputs(T&&... t) {
  return {std::forward<T>(t)...};
}

}  // namespace dtensor::testing
