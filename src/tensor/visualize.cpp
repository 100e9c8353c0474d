#include "dtensor/visualize.h"

#include <algorithm>
#include <set>

#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"

namespace dtensor {
namespace {

struct Block {
  int64_t rank;
  LocalLayout layout;
};

// Every rank's shard of the tensor, from its coordinate (mesh ranks are listed row-major).
std::vector<Block> blocks_of(const DTensorSpec& spec) {
  const DeviceMesh& mesh = *spec.mesh;
  std::vector<Block> blocks;
  Shape coordinate(mesh.ndim(), 0);
  for (int64_t rank : mesh.ranks()) {
    blocks.push_back({rank, local_layout(spec.meta.shape, mesh.shape(), coordinate, spec.placements)});
    for (int64_t m = mesh.ndim() - 1; m >= 0 && ++coordinate[m] == mesh.size(m); --m) coordinate[m] = 0;
  }
  return blocks;
}

struct Range {
  int64_t begin, end;
  std::string str() const { return std::to_string(begin) + ":" + std::to_string(end); }
};

// The ranges between consecutive shard boundaries along tensor dim `d`.
std::vector<Range> segments(const std::vector<Block>& blocks, size_t d, int64_t extent) {
  std::set<int64_t> cuts = {0, extent};
  for (const auto& b : blocks) {
    if (b.layout.shape[d] == 0) continue;
    cuts.insert(b.layout.offset[d]);
    cuts.insert(b.layout.offset[d] + b.layout.shape[d]);
  }
  std::vector<Range> out;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) out.push_back({*it, *std::next(it)});
  return out;
}

bool holds(const Block& b, size_t d, const Range& r) {
  return b.layout.offset[d] <= r.begin && r.end <= b.layout.offset[d] + b.layout.shape[d];
}

// The ranks holding the block of rows `row` (and columns `col` for a 2-d tensor): "0" or "0, 2".
std::string ranks_holding(const std::vector<Block>& blocks, const Range& row, const Range* col) {
  std::string out;
  for (const auto& b : blocks)
    if (holds(b, 0, row) && (col == nullptr || holds(b, 1, *col)))
      out += (out.empty() ? "" : ", ") + std::to_string(b.rank);
  return out;
}

// Rows of cells, each column padded to its widest cell.
std::string render(const std::vector<std::vector<std::string>>& table) {
  std::vector<size_t> width;
  for (const auto& row : table) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) line += row[c] + std::string(width[c] - row[c].size() + 2, ' ');
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

std::string notes(const DTensorSpec& spec, const std::vector<Block>& blocks) {
  std::string empty;
  for (const auto& b : blocks)
    if (numel(b.layout.shape) == 0) empty += (empty.empty() ? "" : ", ") + std::to_string(b.rank);
  std::string out = empty.empty() ? "" : "empty shards on ranks: " + empty + "\n";
  for (int64_t m = 0; m < spec.mesh->ndim(); ++m) {
    const Placement& p = spec.placements[m];
    if (p.is_partial())
      out += spec.mesh->dim_label(m) + " is Partial(" + to_string(p.reduce_op()) +
             "): the ranks along it hold contributions whose " + to_string(p.reduce_op()) + " is the value\n";
  }
  return out;
}

}  // namespace

std::string visualize_sharding(const DTensorSpec& spec) {
  const int64_t ndim = spec.ndim();
  if (ndim != 1 && ndim != 2)
    throw DTensorError("visualize_sharding shows 1-d and 2-d tensors, not a " + std::to_string(ndim) +
                       "-d one (" + shape_str(spec.meta.shape) + "); view it as 2-d first");
  const auto blocks = blocks_of(spec);
  const auto rows = segments(blocks, 0, spec.meta.shape[0]);
  std::vector<std::vector<std::string>> table;
  if (ndim == 1) {
    table.push_back({"", "ranks"});
    for (const auto& r : rows) table.push_back({r.str(), ranks_holding(blocks, r, nullptr)});
  } else {
    const auto cols = segments(blocks, 1, spec.meta.shape[1]);
    table.push_back({""});
    for (const auto& c : cols) table[0].push_back("cols " + c.str());
    for (const auto& r : rows) {
      table.push_back({"rows " + r.str()});
      for (const auto& c : cols) table.back().push_back(ranks_holding(blocks, r, &c));
    }
  }
  return "DTensor " + spec.str() + "\n" + render(table) + notes(spec, blocks);
}

std::string visualize_sharding(const at::Tensor& dtensor) {
  return visualize_sharding(dtensor_impl(dtensor, "visualize_sharding").spec());
}

}  // namespace dtensor
