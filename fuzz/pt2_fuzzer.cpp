// libFuzzer target: a .pt2 archive loaded with graph::load_program, then run on inputs made from its
// user inputs' metas. Seeds: the suite's exported archives (./dev fuzz copies them).

#include <ATen/ATen.h>

#include <cstdint>
#include <fstream>

#include "dtensor/graph/program.h"
#include "fuzz_checks.h"

namespace {

using namespace dtensor;

// Tensors of ones for the user inputs, or nothing when one would be too large to be worth running
// (a crafted meta may ask for any size; what the program then computes is not the reader's business).
std::optional<std::vector<c10::IValue>> example_inputs(const graph::Program& program) {
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("program.pt2");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    graph::Program program = graph::load_program(path);
    if (const auto inputs = example_inputs(program)) graph::run(program, *inputs);
  } catch (const DTensorError& e) {
    fuzz::check_error_text(e, path);
  }
  return 0;
}
