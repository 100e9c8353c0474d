#pragma once
// Where integer indices fall relative to a window of rows [offset, offset + size): the building block
// of lookups into a row-sharded table (vocab_rows.h) and of loss parallelism's class-sharded targets.
// CPU indices are scanned on the host in one pass; the tensor-op form costs about ten dispatched ops,
// which on a small batch took longer than the lookup itself (the GPT step's embedding and loss).

#include <ATen/core/Tensor.h>

#include "dtensor/op_schema.h"

#include <cstdint>
#include <optional>

namespace dtensor::rules {

// Which indices fall in the window, and their positions there.
struct IndexWindow {
  at::Tensor held;         // bool, like the indices: offset <= index < offset + size and index != dropped
  at::Tensor local_index;  // index - offset where held, `elsewhere` where not; the indices' dtype
  bool all_held = false;   // known to hold for every index (only ever set for CPU indices)
};

// `dropped` (padding_idx, ignore_index) counts as not held even inside the window; -1 drops nothing
// a table could hold.
IndexWindow index_window(const at::Tensor& indices, int64_t offset, int64_t size, int64_t elsewhere = 0,
                         int64_t dropped = -1);

// index_window as graph ops (GraphForm): the same `held` and `local_index`, for indices on any device.
struct FormIndexWindow {
  FormValue held, local_index;
};
FormIndexWindow index_window_form(GraphFormBuilder& b, FormValue indices, int64_t offset, int64_t size,
                                  int64_t elsewhere = 0, int64_t dropped = -1);

// The first index outside [0, rows) that is not `ignored`; nullopt when there is none. CPU indices are
// scanned on the host (no op dispatched); on other devices the answer waits for the device, so a
// check that need not stop the host asserts on the device instead (check_indices in vocab_rows.h).
std::optional<int64_t> first_index_outside(const at::Tensor& indices, int64_t rows,
                                           std::optional<int64_t> ignored = std::nullopt);

}  // namespace dtensor::rules
