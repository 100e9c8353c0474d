#include "packing.h"

#include <ATen/ATen.h>

namespace dtensor::detail {

at::Tensor packed_back_to_back(const std::vector<at::Tensor>& pieces) {
  int64_t total = 0;
  for (const at::Tensor& piece : pieces) total += piece.numel();
  at::Tensor packed = at::empty({total}, pieces.front().options());
  // One copy per piece, into its place: a whole piece moves as its contiguous runs (its extent along
  // the cut dim times the dims after it), not as the single elements a transpose of that dim would.
  int64_t at = 0;
  for (const at::Tensor& piece : pieces) {
    packed.narrow(0, at, piece.numel()).view(piece.sizes()).copy_(piece);
    at += piece.numel();
  }
  return packed;
}

}  // namespace dtensor::detail
