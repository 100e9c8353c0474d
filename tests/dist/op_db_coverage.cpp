#include "op_db_coverage.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include <ATen/core/dispatch/Dispatcher.h>

#include "dtensor/sharding.h"

namespace dtensor::testing {
namespace {

struct OpCoverage {
  std::set<std::string> samples;          // samples whose runs dispatched it (forward or backward)
  std::set<std::string> forward_samples;  // ... in their forward call
  std::set<std::string> placements;       // "R", "S(1)", "P(sum)", ... seen on its inputs
  std::set<int64_t> meshes;               // mesh ndims it ran on
  bool gradient_checked = false;          // in the forward of a run that compared gradients
};

struct SampleInfo {
  bool done = false;
  DerivativeProbe probe;
  bool backward = false;
  std::string no_backward_reason;
};

std::map<std::string, OpCoverage>& coverage() {
  static std::map<std::string, OpCoverage> c;
  return c;
}

std::map<std::string, int>& graph_forms_checked() {  // combinations per sample
  static std::map<std::string, int> c;
  return c;
}

std::map<std::string, SampleInfo>& sample_info() {
  static std::map<std::string, SampleInfo> s;
  return s;
}

void record_calls(const std::vector<CommDebugMode::OpCall>& calls, const std::string& sample, int64_t mesh_ndim,
                  bool forward, bool gradient_compared) {
  for (const auto& call : calls) {
    OpCoverage& c = coverage()[call.op];
    c.samples.insert(sample);
    c.meshes.insert(mesh_ndim);
    for (const auto& placements : call.inputs)
      for (const auto& p : placements) c.placements.insert(p.str());
    if (!forward) continue;
    c.forward_samples.insert(sample);
    c.gradient_checked = c.gradient_checked || gradient_compared;
  }
}

// "R S(0) S(1) P(sum) P(max) SS" in a fixed order: Replicate, shards by dim, the Partials, then
// whether any strided shard was.
std::string placements_column(const std::set<std::string>& seen) {
  std::string out;
  auto add = [&](const std::string& p) {
    if (seen.count(p)) out += (out.empty() ? "" : " ") + p;
  };
  add("R");
  for (int d = 0; d < 8; ++d) add("S(" + std::to_string(d) + ")");
  for (const char* op : {"sum", "avg", "max", "min"}) add(std::string("P(") + op + ")");
  // Strided shards, of any dim and split, as one entry.
  if (std::any_of(seen.begin(), seen.end(), [](const std::string& p) { return p.rfind("SS(", 0) == 0; }))
    out += (out.empty() ? "" : " ") + std::string("SS");
  return out;
}

std::string meshes_column(const std::set<int64_t>& meshes) {
  std::string out;
  if (meshes.count(1)) out += "1-d";
  if (meshes.count(2)) out += std::string(out.empty() ? "" : " ") + "2x2";
  return out;
}

// The gradient column for one op, and whether its state is a gap.
std::pair<std::string, bool> gradient_column(const OpCoverage& c) {
  if (c.gradient_checked) return {"checked", false};
  if (c.forward_samples.empty()) return {"runs in backward only", false};
  std::string reason;
  for (const auto& name : c.forward_samples) {
    const SampleInfo& s = sample_info()[name];
    if (!s.probe.differentiable) {
      if (reason.empty()) reason = "no derivative (" + name + ": " + s.probe.reason + ")";
      continue;
    }
    if (!s.no_backward_reason.empty()) return {"NOT CHECKED: " + s.no_backward_reason + " (" + name + ")", false};
    return {"NOT CHECKED though differentiable (" + name + (s.backward ? ": no gradient reached a DTensor input" : ": backward = false") + ")", true};
  }
  return {reason, false};
}

// Whether this build can run the op on CPU tensors (the fused attention kernels have CUDA kernels only).
bool runs_on_cpu(const std::string& qualified) {
  const auto dot = qualified.find('.', qualified.find("::"));
  const auto op = c10::Dispatcher::singleton().findSchema(
      {qualified.substr(0, dot), dot == std::string::npos ? "" : qualified.substr(dot + 1)});
  using c10::DispatchKey;
  return !op || op->hasKernelForDispatchKey(DispatchKey::CPU) || op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
         op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional) ||
         op->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd);
}

}  // namespace

void record_run(const OpSample& sample, int64_t mesh_ndim, const SampleRun& run) {
  record_calls(run.forward, sample.name, mesh_ndim, true, run.gradient_compared);
  record_calls(run.backward, sample.name, mesh_ndim, false, false);
}

void record_graph_forms_checked(const OpSample& sample) { ++graph_forms_checked()[sample.name]; }

void record_sample_done(const OpSample& sample, DerivativeProbe probe) {
  SampleInfo& s = sample_info()[sample.name];
  s.done = true;
  s.probe = std::move(probe);
  s.backward = sample.backward;
  s.no_backward_reason = sample.no_backward_reason;
}

bool sample_done(const OpSample& sample) { return sample_info()[sample.name].done; }

CoverageReport coverage_report() {
  CoverageReport report;
  std::ostringstream table;
  table << "op-db coverage: op | samples | input placements | meshes | gradient\n";
  for (const auto& op : ops_with_sharding_rules()) {
    if (op.rfind("aten::", 0) != 0) continue;  // custom ops registered by tests have their own tests
    // Composite ops decompose before eager dispatch sees them: every_strategy_test checks their rules.
    if (sharding_rule_family(op) == "composite") continue;
    if (const std::string functional = functional_form_sharing_rule(op); !functional.empty()) {
      // Its rule is the functional form's, covered on its own line; OutFormsTest checks the sharing.
      table << "  " << op << " | out= form of " << functional << "\n";
      continue;
    }
    if (!runs_on_cpu(op)) {
      table << "  " << op << " | CUDA kernel only: every_strategy_test checks it through shapes, tests/cuda runs it on a GPU where eager dispatch reaches it\n";
      continue;
    }
    const auto it = coverage().find(op);
    if (it == coverage().end()) {
      table << "  " << op << " | 0 | | | \n";
      report.problems.push_back(op + " has a sharding rule but no op-db sample runs it (without an error)");
      continue;
    }
    const OpCoverage& c = it->second;
    const auto [gradient, gap] = gradient_column(c);
    table << "  " << op << " | " << c.samples.size() << " | " << placements_column(c.placements) << " | "
          << meshes_column(c.meshes) << " | " << gradient << "\n";
    if (gap) report.problems.push_back(op + ": " + gradient);
  }
  table << "graph forms of local kernels, checked op by op (combinations per sample):";
  for (const auto& [sample, combinations] : graph_forms_checked()) table << " " << sample << " " << combinations;
  table << "\n";
  report.table = table.str();
  return report;
}

}  // namespace dtensor::testing
