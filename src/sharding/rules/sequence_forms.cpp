// Graph forms of context-parallel attention (sequence_attention.h): what a per-rank program saves in
// place of the ring or all-to-all kernel. _c10d_functional has no point-to-point transfers, so both
// methods save as the all-gather form of ring attention (PyTorch's context parallelism with
// rotate_method "allgather"): the keys and values gathered whole, the rank's queries attended to the
// blocks before theirs whole and to their own block causally (or to all of it, without a causal
// mask), the two parts merged by their logsumexp; in backward each part's gradients with the merged
// output and logsumexp, the key and value gradients of every position summed over the ranks and each
// rank keeping its block's (a reduce-scatter). The same math as the kernels, in another order of sums.
// Load-balanced sequences, and blocks without positions, have no form (such programs run, not save).

#include <ATen/ATen.h>

#include "dtensor/layout.h"
#include "dtensor/sharding.h"
#include "sequence_attention.h"

namespace dtensor::rules {
namespace {

constexpr int64_t kFormSequenceAxis = 2;

// This rank's block of the sequence and the layouts the form moves between, from the call's strategy.
struct SequenceBlocks {
  int64_t mesh_dim, length;
  ChunkExtent own;
  bool is_causal;
  c10::IValue scale;

  // The keys' (or values') placements with the sequence whole, or summed over the ranks, on the mesh dim.
  Placements gathered(Placements p) const {
    p[static_cast<size_t>(mesh_dim)] = Replicate();
    return p;
  }
  Placements summed(Placements p) const {
    p[static_cast<size_t>(mesh_dim)] = Partial();
    return p;
  }
};

std::optional<SequenceBlocks> blocks_of(const OpSchema& s, const PlacementStrategy& chosen, int64_t mesh_dim, size_t causal_arg,
                                        size_t scale_arg) {
  if (load_balanced_sequence(chosen, mesh_dim)) return std::nullopt;
  const int64_t ranks = s.mesh->size(mesh_dim), length = s.input(0).meta.shape[kFormSequenceAxis];
  for (int64_t r = 0; r < ranks; ++r)
    if (chunk_extent(length, ranks, r).size == 0) return std::nullopt;
  return SequenceBlocks{mesh_dim, length, chunk_extent(length, ranks, s.mesh->local_rank(mesh_dim)), s.args[causal_arg].toBool(),
                        s.args[scale_arg]};
}

FormValue positions(GraphFormBuilder& b, FormValue t, int64_t start, int64_t end, const std::string& name) {
  return b.op("aten::slice.Tensor", {t, kFormSequenceAxis, start, end}, name);
}

// `t` laid out [batch, positions, heads, head dim] in memory, as the CPU kernel lays out gradients.
FormValue heads_last(GraphFormBuilder& b, FormValue t, const std::string& name) {
  const std::vector<int64_t> swap{0, 2, 1, 3};
  const FormValue dense = b.op("aten::clone", {b.op("aten::permute", {t, swap}, name + "_swapped"), int64_t{0}}, name + "_dense");
  return b.op("aten::permute", {dense, swap}, name);
}

// The merged output laid out as the CPU kernel lays out its output: like the queries (empty_like), whose
// global layout the program's later views rely on (heads-last, where q is a transposed projection).
FormValue laid_out_like_queries(GraphFormBuilder& b, FormValue out, const TensorMeta& query_meta) {
  if (query_meta.stride[1] < query_meta.stride[2]) return heads_last(b, out, "out");
  return b.op("aten::clone", {out, int64_t{0}}, "out");  // memory_format=torch.contiguous_format
}

// The flash forward's (output, logsumexp) of the rank's queries over keys and values.
std::vector<FormValue> attend(GraphFormBuilder& b, FormValue q, FormValue k, FormValue v, bool causal, const SequenceBlocks& blocks,
                              const std::string& name) {
  return b.call("aten::_scaled_dot_product_flash_attention_for_cpu", {q, k, v, 0.0, causal, c10::IValue(), blocks.scale}, name);
}

}  // namespace

GraphForm sequence_forward_form(const OpSchema& s, const PlacementStrategy& chosen, int64_t mesh_dim) {
  const auto found = blocks_of(s, chosen, mesh_dim, /*causal_arg=*/4, /*scale_arg=*/6);
  if (!found) return {};
  const TensorMeta query_meta = s.input(0).meta, key_meta = s.input(1).meta, value_meta = s.input(2).meta;
  const Placements key_placements = chosen.inputs[1], value_placements = chosen.inputs[2];
  return [=, blocks = *found](GraphFormBuilder& b) -> std::vector<FormValue> {
    const FormValue q = b.input(0);
    const FormValue keys = b.reshard(b.input(1), key_meta, key_placements, blocks.gathered(key_placements));
    const FormValue values = b.reshard(b.input(2), value_meta, value_placements, blocks.gathered(value_placements));
    if (!blocks.is_causal) return attend(b, q, keys, values, false, blocks, "attention");
    const int64_t own_end = blocks.own.offset + blocks.own.size;
    const std::vector<FormValue> own = attend(b, q, positions(b, keys, blocks.own.offset, own_end, "own_keys"),
                                              positions(b, values, blocks.own.offset, own_end, "own_values"), true, blocks, "own_block");
    if (blocks.own.offset == 0) return own;
    const std::vector<FormValue> before = attend(b, q, positions(b, keys, 0, blocks.own.offset, "earlier_keys"),
                                                 positions(b, values, 0, blocks.own.offset, "earlier_values"), false, blocks, "earlier_blocks");
    // The online-softmax merge: each part reweighed to the joint normaliser.
    const FormValue lse = b.op("aten::logaddexp", {before[1], own[1]}, "lse");
    auto weighed = [&](const std::vector<FormValue>& part, const std::string& name) {
      const FormValue weight = b.op("aten::exp", {b.op("aten::sub.Tensor", {part[1], lse}, name + "_shift")}, name + "_weight");
      return b.op("aten::mul.Tensor", {part[0], b.op("aten::unsqueeze", {weight, int64_t{-1}}, name + "_weights")}, name);
    };
    return {laid_out_like_queries(b, b.op("aten::add.Tensor", {weighed(before, "earlier_part"), weighed(own, "own_part")}, "merged"), query_meta),
            lse};
  };
}

GraphForm sequence_backward_form(const OpSchema& s, const PlacementStrategy& chosen, int64_t mesh_dim) {
  const auto found = blocks_of(s, chosen, mesh_dim, /*causal_arg=*/7, /*scale_arg=*/9);
  if (!found) return {};
  const TensorMeta key_meta = s.input(2).meta, value_meta = s.input(3).meta;
  const Placements key_placements = chosen.inputs[2], value_placements = chosen.inputs[3];
  return [=, blocks = *found](GraphFormBuilder& b) -> std::vector<FormValue> {
    const FormValue grad_out = b.input(0), q = b.input(1), out = b.input(4), lse = b.input(5);
    const FormValue keys = b.reshard(b.input(2), key_meta, key_placements, blocks.gathered(key_placements));
    const FormValue values = b.reshard(b.input(3), value_meta, value_placements, blocks.gathered(value_placements));
    auto gradients = [&](FormValue k, FormValue v, bool causal, const std::string& name) {
      return b.call("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                    {grad_out, q, k, v, out, lse, 0.0, causal, c10::IValue(), blocks.scale}, name);
    };
    // The gradients of the whole keys and values from this rank's queries: summed over the ranks, each
    // keeps its block's, laid out as the kernel lays them out.
    auto to_block = [&](FormValue whole, const TensorMeta& meta, const Placements& placements, const std::string& name) {
      return heads_last(b, b.reshard(whole, meta, blocks.summed(placements), placements), name);
    };
    if (!blocks.is_causal) {
      const std::vector<FormValue> g = gradients(keys, values, false, "gradients");
      return {g[0], to_block(g[1], key_meta, key_placements, "grad_key"), to_block(g[2], value_meta, value_placements, "grad_value")};
    }
    const int64_t own_end = blocks.own.offset + blocks.own.size, later = blocks.length - own_end;
    const std::vector<FormValue> own = gradients(positions(b, keys, blocks.own.offset, own_end, "own_keys"),
                                                 positions(b, values, blocks.own.offset, own_end, "own_values"), true, "own_block");
    std::vector<FormValue> grads = own;
    if (blocks.own.offset > 0) {
      const std::vector<FormValue> before = gradients(positions(b, keys, 0, blocks.own.offset, "earlier_keys"),
                                                      positions(b, values, 0, blocks.own.offset, "earlier_values"), false, "earlier_blocks");
      grads[0] = b.op("aten::add.Tensor", {before[0], own[0]}, "grad_query");
      for (size_t k = 1; k < 3; ++k) grads[k] = b.op("aten::cat", {std::vector<FormValue>{before[k], own[k]}, kFormSequenceAxis}, "through_own_block");
    }
    // No query of this rank sees the later positions: their gradients here are zeros.
    if (later > 0)
      for (size_t k = 1; k < 3; ++k) grads[k] = b.op("aten::constant_pad_nd", {grads[k], std::vector<int64_t>{0, 0, 0, later}}, "every_position");
    return {grads[0], to_block(grads[1], key_meta, key_placements, "grad_key"), to_block(grads[2], value_meta, value_placements, "grad_value")};
  };
}

}  // namespace dtensor::rules
