#include "dtensor/pieces.h"

#include <algorithm>

namespace dtensor {

bool Box::empty() const {
  return std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s == 0; });
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out{Shape(a.offset.size()), Shape(a.offset.size())};
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t begin = std::max(a.offset[d], b.offset[d]);
    const int64_t end = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (end <= begin) return std::nullopt;
    out.offset[d] = begin;
    out.shape[d] = end - begin;
  }
  return out;
}

std::vector<Piece> pieces_of(const Shape& global_shape, const Shape& mesh_shape, const std::vector<int64_t>& mesh_ranks,
                             const Placements& placements) {
  std::vector<Piece> pieces;
  Shape coordinate(mesh_shape.size(), 0);
  for (int64_t rank : mesh_ranks) {
    const LocalLayout local = local_layout(global_shape, mesh_shape, coordinate, placements);
    Box box{local.offset, local.shape};
    if (!box.empty()) {
      auto same = std::find_if(pieces.begin(), pieces.end(), [&](const Piece& p) { return p.box == box; });
      if (same == pieces.end()) pieces.push_back(Piece{std::move(box), {rank}});
      else same->holders.push_back(rank);
    }
    for (int64_t d = static_cast<int64_t>(coordinate.size()) - 1; d >= 0; --d) {  // row-major increment
      if (++coordinate[static_cast<size_t>(d)] < mesh_shape[static_cast<size_t>(d)]) break;
      coordinate[static_cast<size_t>(d)] = 0;
    }
  }
  return pieces;
}

std::vector<ContiguousRun> runs_within(const Box& piece, const Box& part) {
  const auto ndim = static_cast<int64_t>(piece.shape.size());
  if (part.empty()) return {};
  // Dims from `inner` on form one run: every dim after `inner` is covered whole by `part`.
  int64_t inner = ndim;
  int64_t run = 1;
  while (inner > 0) {
    const auto d = static_cast<size_t>(inner - 1);
    run *= part.shape[d];
    --inner;
    if (part.shape[d] != piece.shape[d]) break;
  }
  const Shape piece_strides = contiguous_strides(piece.shape);
  const Shape part_strides = contiguous_strides(part.shape);
  std::vector<ContiguousRun> runs;
  Shape index(static_cast<size_t>(inner), 0);  // over the dims before `inner`
  int64_t count = 1;
  for (int64_t d = 0; d < inner; ++d) count *= part.shape[static_cast<size_t>(d)];
  runs.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    int64_t piece_offset = 0, part_offset = 0;
    for (int64_t d = 0; d < ndim; ++d) {
      const auto u = static_cast<size_t>(d);
      const int64_t i = d < inner ? index[u] : 0;
      piece_offset += (part.offset[u] - piece.offset[u] + i) * piece_strides[u];
      part_offset += i * part_strides[u];
    }
    runs.push_back(ContiguousRun{piece_offset, part_offset, run});
    for (int64_t d = inner - 1; d >= 0; --d) {
      const auto u = static_cast<size_t>(d);
      if (++index[u] < part.shape[u]) break;
      index[u] = 0;
    }
  }
  return runs;
}

}  // namespace dtensor
