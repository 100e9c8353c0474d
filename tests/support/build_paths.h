#pragma once
// Paths of this build that the tests read. Each test program gets the ones it uses from a file generated
// by cmake/BuildPaths.cmake (not from compile definitions, which would make ccache miss in every clone).

namespace dtensor::build_paths {

extern const char* const graph_models;        // the models scripts/export_*.py exported (dtensor_test_support)
extern const char* const graph_saved;         // where tests save programs for PyTorch to load (dtensor_test_support)
extern const char* const checkpoint_interop;  // checkpoints PyTorch wrote, and dtensor's for PyTorch to read
extern const char* const goldens;             // tests/goldens in the source tree (dtensor_unit_tests)
extern const char* const census_pytorch_ops;  // the aten overloads PyTorch's DTensor shards (scripts/pytorch_dtensor_ops.py)
extern const char* const census_exclusions;   // tests/op_census_exclusions.txt
extern const char* const pipeline_orders;     // PyTorch's pipeline orders (scripts/write_pipeline_orders.py)

}  // namespace dtensor::build_paths
