#pragma once
// Everything a dtensor user needs: meshes, placements, the DTensor API and the launcher. Modules and
// tensor parallelism are in dtensor/parallel.h (kept apart: torch::nn's headers are heavy to compile).

#include "dtensor/all_to_all.h"
#include "dtensor/api.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/factory.h"
#include "dtensor/launch.h"
#include "dtensor/layout.h"
#include "dtensor/local_map.h"
#include "dtensor/placement.h"
#include "dtensor/random.h"
#include "dtensor/redistribute_plan.h"
#include "dtensor/spec.h"
#include "dtensor/visualize.h"
#include "dtensor/world.h"
