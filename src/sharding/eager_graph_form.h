#pragma once
// Running a local kernel's graph form on tensors, as eager dispatch would run the kernel: each op
// through the dispatcher, each all-reduce on the mesh. Graph programs run these ops through the
// interpreter; tests run them here, so that the op database checks every graph form against one
// device on every layout it tries (tests/dist/op_db.cpp), as it checks the kernels.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>

#include "dtensor/device_mesh.h"
#include "dtensor/op_schema.h"

namespace dtensor::detail {

// Replaces the op's arguments on `stack` (local values, as a LocalKernel gets them) by the outputs
// `form` computes from them.
void run_graph_form(const GraphForm& form, const DeviceMesh& mesh, const c10::OperatorHandle& op, torch::jit::Stack& stack);

// For tests, per thread: whether eager dispatch runs a kernel's graph form instead of the kernel where
// it has one (off unless asked), and how many calls so far had a graph form to run.
void set_graph_forms_run_eagerly(bool on);
bool graph_forms_run_eagerly();
uint64_t calls_with_a_graph_form();
void count_call_with_a_graph_form();

}  // namespace dtensor::detail
