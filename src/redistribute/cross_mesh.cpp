#include "cross_mesh.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "../mesh/collectives.h"
#include "executor.h"
#include "dtensor/pieces.h"
#include "dtensor/world.h"

namespace dtensor::detail {
namespace {

struct Transfer {
  int64_t source;       // global ranks
  int64_t destination;
  Box box;
};

// Every rank of `to` that holds a piece receives each overlapping range from one holder of it in
// `from`: itself when it holds it, else one picked by its rank, so replicas share the sending.
std::vector<Transfer> plan_transfers(const DTensorSpec& from, const DTensorSpec& to) {
  const Shape& global = from.meta.shape;
  const auto sources = pieces_of(global, from.mesh->shape(), from.mesh->ranks(), from.placements);
  const auto destinations = pieces_of(global, to.mesh->shape(), to.mesh->ranks(), to.placements);
  std::vector<Transfer> out;
  for (const Piece& wanted : destinations)
    for (int64_t destination : wanted.holders)
      for (const Piece& held : sources) {
        const auto overlap = intersect(held.box, wanted.box);
        if (!overlap) continue;
        const auto& h = held.holders;
        const bool holds = std::find(h.begin(), h.end(), destination) != h.end();
        const int64_t source = holds ? destination : h[static_cast<size_t>(destination) % h.size()];
        out.push_back(Transfer{source, destination, *overlap});
      }
  return out;
}

Box box_of(const DTensorSpec& spec) {
  const LocalLayout l = local_layout(spec.meta.shape, spec.mesh->shape(), *spec.mesh->coordinate(), spec.placements);
  return Box{l.offset, l.shape};
}

// The part of a local shard (holding `held`) at global `box`.
at::Tensor region(const at::Tensor& local, const Box& held, const Box& box) {
  at::Tensor out = local;
  for (size_t d = 0; d < box.shape.size(); ++d)
    out = out.narrow(static_cast<int64_t>(d), box.offset[d] - held.offset[d], box.shape[d]);
  return out;
}

}  // namespace

at::Tensor move_across_meshes(const at::Tensor& shard, const DTensorSpec& from, const DTensorSpec& to) {
  const at::Tensor local = with_views_resolved(shard);
  const MeshPtr bridge = from.mesh->bridge_to(*to.mesh);
  const int64_t me = from.mesh->world()->rank();
  at::Tensor out = at::empty(to.local_shape(), local.options());
  if (!bridge->contains_this_rank()) return out;
  const std::vector<Transfer> transfers = plan_transfers(from, to);
  const std::optional<Box> mine_from = from.mesh->contains_this_rank() ? std::optional(box_of(from)) : std::nullopt;
  const std::optional<Box> mine_to = to.mesh->contains_this_rank() ? std::optional(box_of(to)) : std::nullopt;

  const auto& members = bridge->ranks();
  const auto member_index = [&](int64_t rank) {
    return static_cast<size_t>(std::lower_bound(members.begin(), members.end(), rank) - members.begin());
  };
  std::vector<std::vector<at::Tensor>> sends(members.size());
  std::vector<int64_t> send_counts(members.size(), 0), recv_counts(members.size(), 0);
  bool any_remote = false;
  for (const Transfer& t : transfers) {
    if (t.source == t.destination) {
      if (t.source == me) region(out, *mine_to, t.box).copy_(region(local, *mine_from, t.box));
      continue;
    }
    any_remote = true;
    if (t.source == me) {
      sends[member_index(t.destination)].push_back(region(local, *mine_from, t.box).reshape({-1}));
      send_counts[member_index(t.destination)] += numel(t.box.shape);
    } else if (t.destination == me) {
      recv_counts[member_index(t.source)] += numel(t.box.shape);
    }
  }
  if (!any_remote) return out;  // every rank knows: the plan is the same everywhere
  std::vector<at::Tensor> flat;
  for (auto& pieces : sends)
    for (auto& p : pieces) flat.push_back(p);
  const at::Tensor send = flat.empty() ? at::empty({0}, local.options()) : at::cat(flat);
  const at::Tensor received = all_to_all(*bridge, 0, send, send_counts, recv_counts);
  // Unpack in the plan's order, which is the order each source packed its part for this rank.
  std::vector<int64_t> cursor(members.size(), 0);
  for (size_t i = 1; i < members.size(); ++i) cursor[i] = cursor[i - 1] + recv_counts[i - 1];
  for (const Transfer& t : transfers) {
    if (t.destination != me || t.source == me) continue;
    const size_t from_member = member_index(t.source);
    const int64_t n = numel(t.box.shape);
    region(out, *mine_to, t.box).copy_(received.narrow(0, cursor[from_member], n).view(t.box.shape));
    cursor[from_member] += n;
  }
  return out;
}

}  // namespace dtensor::detail
