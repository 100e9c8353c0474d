#pragma once
// What the op-db exercised, per op: the samples that ran it, the placements its inputs arrived with
// (Replicate, Shard, each kind of Partial), the meshes, and whether a gradient through it was
// compared with single device. The coverage test prints this table and fails on gaps: an op with a
// rule that no sample runs, or an op with a derivative whose gradient no sample checks (unless the
// sample says why it cannot).

#include <string>
#include <vector>

#include "dtensor/comm_debug.h"
#include "op_db.h"

namespace dtensor::testing {

// The ops one successful run of a sample dispatched, with their inputs' placements.
struct SampleRun {
  std::vector<CommDebugMode::OpCall> forward, backward;
  bool gradient_compared = false;
  bool refused = false;  // an in-place op refused to move the tensor it writes to (counts as no run)
};

// Whether single-device autograd differentiates a sample, and if not, why.
struct DerivativeProbe {
  bool differentiable = false;
  std::string reason;
};

void record_run(const OpSample& sample, int64_t mesh_ndim, const SampleRun& run);
// A combination of `sample` passed again with its local kernels' graph forms (op_db.cpp).
void record_graph_forms_checked(const OpSample& sample);
void record_sample_done(const OpSample& sample, DerivativeProbe probe);
bool sample_done(const OpSample& sample);

struct CoverageReport {
  std::string table;                  // one line per op with a rule
  std::vector<std::string> problems;  // gaps that fail the coverage test
};
CoverageReport coverage_report();

}  // namespace dtensor::testing
