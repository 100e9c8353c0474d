#pragma once
// Applying one parallel style to one module (parallelize_module walks the plan and calls this).

#include "dtensor/parallel.h"

namespace dtensor::detail {

struct StyleContext {
  MeshPtr mesh;
  int64_t tp_dim = 0;  // the tensor-parallel mesh dim
};

void apply_style(const StyleContext& context, const std::string& path, torch::nn::Module& module,
                 const ParallelStyle& style);

}  // namespace dtensor::detail
