#pragma once
// What a root mesh (made by create, from_group or unflatten) shares with every mesh sliced or
// flattened from it: the dims flattened from it so far, which the root then slices by name.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mesh_group.h"

namespace dtensor::detail {

struct MeshFamily {
  struct Flattened {
    std::vector<int64_t> root_dims;      // the root's dims it spans, row-major
    std::shared_ptr<MeshGroup> group;    // this rank's group over them (null on a planning-only mesh)
  };

  std::vector<std::string> root_dim_names;
  std::mutex mutex;
  std::map<std::string, Flattened> flattened;  // guarded by mutex
};

}  // namespace dtensor::detail
