#pragma once
// What every fuzz target enforces besides the sanitizers: a reader refuses bad input only with a
// DTensorError whose text names the file. Any other exception (a raw nlohmann or LibTorch error)
// escapes the target, and libFuzzer reports it as a crash. (The text is not searched for other
// libraries' phrases: errors quote names from the file, and libFuzzer learns the strings a target
// compares, so it would write those phrases into names.)

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/errors.h"
#include "dtensor/graph/program.h"

namespace dtensor::fuzz {

// A per-process scratch path in shared memory (fuzzing writes one file per execution).
inline std::string scratch_path(const std::string& name) {
  return "/dev/shm/dtensor-fuzz-" + std::to_string(::getpid()) + "-" + name;
}

// Aborts (a crash libFuzzer reports, with the input) when `error` does not name `path`.
inline void check_error_text(const DTensorError& error, const std::string& path) {
  const std::string what = error.what();
  if (what.find(path) == std::string::npos) {
    std::fprintf(stderr, "fuzz: an error does not name the file %s:\n%s\n", path.c_str(), what.c_str());
    std::abort();
  }
}

// Tensors of ones for a program's user inputs, or nothing when one would be too large to be worth
// running (a crafted meta may ask for any size; what the program then computes is not the reader's
// business).
inline std::optional<std::vector<c10::IValue>> example_inputs(const graph::Program& program) {
  constexpr int64_t kMaxElements = int64_t{1} << 20;
  std::vector<c10::IValue> out;
  for (const graph::Value* v : program.user_inputs()) {
    if (!v->is_tensor()) {
      out.emplace_back(v->sym_hint);
      continue;
    }
    if (numel(v->meta.shape) > kMaxElements) return std::nullopt;
    out.emplace_back(at::ones(v->meta.shape, at::TensorOptions().dtype(v->meta.dtype)));
  }
  return out;
}

// The .pt2 targets' body: load the archive at `path` and run it; its refusals must name the file.
inline void load_and_run(const std::string& path) {
  try {
    graph::Program program = graph::load_program(path);
    if (const auto inputs = example_inputs(program)) graph::run(program, *inputs);
  } catch (const DTensorError& e) {
    check_error_text(e, path);
  }
}

}  // namespace dtensor::fuzz

// Sanitizer settings the targets need: a huge allocation a crafted file asks for returns null (LibTorch
// then throws, which dtensor reports) instead of ending the run; LibTorch keeps allocations until exit.
// Defined here because each target (one executable) includes this header once.
extern "C" __attribute__((used)) const char* __asan_default_options() { return "allocator_may_return_null=1:detect_leaks=0"; }
