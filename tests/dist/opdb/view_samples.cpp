// Samples for the view family: uneven shapes over 4 ranks (5, 7, 14 ...), 3-d tensors, and views
// whose shards do and do not line up with the reshaped dims.

#include <ATen/core/LegacyTypeDispatch.h>

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// In-place indexing writes into self, whose placements cannot change, and it cannot be sharded along
// the indexed dim (1 here): self is tried Replicate and Shard(0) only.
const std::vector<Placement> kAny2d = {Replicate(), Shard(0), Shard(1)};
const std::vector<std::vector<Placement>> kInPlaceIndexing = {{Replicate(), Shard(0)}, kAny2d, kAny2d};
const std::vector<std::vector<Placement>> kInPlaceIndexPut = {{Replicate(), Shard(1)}, {Replicate()}, {Replicate(), Shard(1)}};
const std::vector<std::vector<Placement>> kInPlaceIndexAdd = {
    {Replicate(), Shard(0)}, {Replicate(), Shard(0)}, kAny2d};

// Input `index_at` is an index tensor with entries in [0, bound) (3k mod bound: no repeats within a
// row of up to `bound` entries, repeats across rows); the others are the default doubles.
std::function<at::Tensor(size_t, const Shape&)> index_input(size_t index_at, int64_t bound) {
  return [index_at, bound](size_t i, const Shape& shape) {
    if (i != index_at) return test_tensor(shape, at::kDouble, 100 + i);
    return at::arange(numel(shape), at::kLong).mul(3).remainder(bound).view(shape);
  };
}

const bool view_samples_registered = add_op_samples({
    // dims reordered or broadcast
    {.name = "t", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].t() * 1); }, .two_d = true},
    {.name = "transpose", .shapes = {{2, 5, 3}}, .run = [](In x) { return outputs(x[0].transpose(0, 2) * 1); }},
    {.name = "permute", .shapes = {{2, 5, 3}}, .run = [](In x) { return outputs(x[0].permute({2, 0, 1}) * 1); }},
    {.name = "detach", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].detach() * 1); }, .backward = false},
    // Autograd's own detach_ does not call down; below autograd it reaches dtensor.
    {.name = "detach_", .shapes = {{5, 3}}, .run = [](In x) {
       at::Tensor y = x[0] * 1;
       at::AutoDispatchBelowADInplaceOrView below_autograd;
       return outputs(y.detach_());
     }},
    {.name = "alias", .shapes = {{5, 3}}, .run = [](In x) { return outputs(at::alias(x[0]) * 1); }},
    {.name = "expand", .shapes = {{5, 1}}, .run = [](In x) { return outputs(x[0].expand({5, 4}) * 1); }},
    {.name = "expand_new_dims", .shapes = {{3}}, .run = [](In x) { return outputs(x[0].expand({2, 5, 3}) * 1); }},
    {.name = "repeat", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].repeat({2, 1, 2})); }, .two_d = true},
    // In-place reorders and squeezes that keep the shape (the others are refused, see view_ops_test).
    {.name = "t_1d", .shapes = {{5}}, .run = [](In x) { return outputs(x[0].clone().t_()); }},
    {.name = "transpose_same_dim", .shapes = {{5, 3}},
     .run = [](In x) { return outputs(x[0].clone().transpose_(1, 1)); }},
    {.name = "squeeze_", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].clone().squeeze_()); }},
    {.name = "squeeze_dim_", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].clone().squeeze_(0)); }},
    {.name = "squeeze_dims_", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].clone().squeeze_({0, 1})); }},

    // view, reshape: [B, S, H*D] -> [B, S, H, D]. H*D = 14 over 4 ranks is chunked 4,4,4,2: whole
    // rows of D = 2, so H stays sharded (2,2,2,1); 10 = 5 * 2 is chunked 3,3,3,1: replicated first.
    {.name = "view_split_dim", .shapes = {{2, 3, 14}},
     .run = [](In x) { return outputs(x[0].view({2, 3, 7, 2}) * 1); }, .two_d = true},
    {.name = "view_split_dim_misaligned", .shapes = {{2, 3, 10}},
     .run = [](In x) { return outputs(x[0].view({2, 3, 5, 2}) * 1); }},
    // [7, 3, 2] -> [21, 2]: 7 rows chunked 2,2,2,1 are 6,6,6,3 of 21 (aligned); on 2x2 they are not.
    {.name = "view_merge_dims", .shapes = {{7, 3, 2}},
     .run = [](In x) { return outputs(x[0].view({21, 2}) * 1); }, .two_d = true},
    {.name = "view_regroup", .shapes = {{6, 4}}, .run = [](In x) { return outputs(x[0].view({4, -1}) * 1); }},
    {.name = "view_size_one_dims", .shapes = {{5, 1, 3}},
     .run = [](In x) { return outputs(x[0].view({1, 5, 3, 1}) * 1); }},
    {.name = "view_dtype", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].view(at::kLong)); }},
    {.name = "view_dtype_resized", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].view(at::kInt)); }},
    {.name = "reshape", .shapes = {{2, 3, 14}},
     .run = [](In x) { return outputs(x[0].reshape({6, 7, 2}) * 1); }, .two_d = true},
    {.name = "reshape_copy", .shapes = {{5, 4}}, .run = [](In x) { return outputs(x[0].t().reshape({10, 2})); }},
    {.name = "flatten", .shapes = {{2, 5, 3}}, .run = [](In x) { return outputs(x[0].flatten(1) * 1); }},
    {.name = "unflatten", .shapes = {{5, 6}}, .run = [](In x) { return outputs(x[0].unflatten(1, {3, 2}) * 1); }},
    {.name = "contiguous", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].t().contiguous()); }},
    {.name = "sum_to_size", .shapes = {{2, 5, 3}}, .run = [](In x) { return outputs(x[0].sum_to_size({5, 1})); }},
    {.name = "new_empty_strided", .shapes = {{5, 3}},
     .run = [](In x) { return outputs(x[0].new_empty_strided({5, 3}, {1, 5}).fill_(2) * x[0]); }},
    {.name = "new_empty_strided_other_shape", .shapes = {{5, 3}},
     .run = [](In x) { return outputs(x[0].new_empty_strided({2, 4}, {4, 1}).fill_(2)); }},

    // squeeze, unsqueeze: shards of 5 over 4 ranks include a local size-1 dim that must stay.
    {.name = "squeeze", .shapes = {{5, 1, 3}}, .run = [](In x) { return outputs(x[0].squeeze() * 1); }, .two_d = true},
    {.name = "squeeze_dim", .shapes = {{5, 1, 3}}, .run = [](In x) { return outputs(x[0].squeeze(1) * 1); }},
    {.name = "squeeze_dim_not_one", .shapes = {{5, 1, 3}}, .run = [](In x) { return outputs(x[0].squeeze(0) * 1); }},
    {.name = "squeeze_dims", .shapes = {{5, 1, 3}}, .run = [](In x) { return outputs(x[0].squeeze({0, 1}) * 1); }},
    {.name = "unsqueeze", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].unsqueeze(1) * 1); }},
    // In-place views reshape the DTensor itself (its shape and placements follow the view).
    {.name = "t_", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].clone().t_() * 1); }, .two_d = true},
    {.name = "transpose_", .shapes = {{2, 5, 3}}, .run = [](In x) { return outputs(x[0].clone().transpose_(0, 2) * 1); }},
    {.name = "unsqueeze_", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].clone().unsqueeze_(1) * 1); }},
    {.name = "squeeze_dim_", .shapes = {{5, 1, 3}}, .run = [](In x) { return outputs(x[0].clone().squeeze_(1) * 1); },
     .two_d = true},
    {.name = "squeeze_", .shapes = {{1, 5, 1}}, .run = [](In x) { return outputs(x[0].clone().squeeze_() * 1); }},

    // slices and selections
    {.name = "slice", .shapes = {{5, 7}},
     .run = [](In x) { return outputs(x[0].slice(1, 1, 6, 2) * 1); }, .two_d = true},
    {.name = "slice_whole", .shapes = {{5, 7}}, .run = [](In x) { return outputs(x[0].slice(0, 0, 5) * 1); }},
    {.name = "narrow", .shapes = {{2, 5, 3}}, .run = [](In x) { return outputs(x[0].narrow(1, 1, 3) * 1); }},
    {.name = "select", .shapes = {{2, 5, 3}},
     .run = [](In x) { return outputs(x[0].select(1, 2) * 1); }, .two_d = true},
    {.name = "select_last", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].select(0, -1) * 1); }},

    // splits and concatenation
    {.name = "split", .shapes = {{5, 7}}, .run = [](In x) { return x[0].split(3, 1); }, .two_d = true},
    {.name = "split_with_sizes", .shapes = {{5, 3}}, .run = [](In x) { return x[0].split_with_sizes({2, 3}, 0); }},
    {.name = "chunk", .shapes = {{2, 5, 3}}, .run = [](In x) { return x[0].chunk(2, 1); }},
    {.name = "unbind", .shapes = {{3, 5}}, .run = [](In x) { return x[0].unbind(0); }},
    {.name = "cat", .shapes = {{5, 3}, {5, 4}},
     .run = [](In x) { return outputs(at::cat({x[0], x[1]}, 1)); }, .two_d = true},
    {.name = "cat_rows", .shapes = {{2, 3}, {5, 3}, {1, 3}},
     .run = [](In x) { return outputs(at::cat({x[0], x[1], x[2]}, 0)); }},
    {.name = "stack", .shapes = {{5, 3}, {5, 3}}, .run = [](In x) { return outputs(at::stack({x[0], x[1]}, 1)); }},

    // indexing
    {.name = "index_select", .shapes = {{5, 4}, {6}}, .run = [](In x) { return outputs(x[0].index_select(0, x[1])); },
     .make_input = index_input(1, 5), .two_d = true},
    // As many indices as rows: the backward adds into grad.new_zeros(input's shape).
    {.name = "index_select_same_shape", .shapes = {{5, 4}, {5}}, .run = [](In x) { return outputs(x[0].index_select(0, x[1])); },
     .make_input = index_input(1, 5), .two_d = true},
    {.name = "index_add", .shapes = {{5, 4}, {3}, {5, 3}},
     .run = [](In x) { return outputs(x[0].index_add(1, x[1], x[2], 2)); }, .make_input = index_input(1, 4)},
    {.name = "index_fill", .shapes = {{5, 4}, {3}},
     .run = [](In x) { return outputs(x[0].index_fill(1, x[1], 2.5)); }, .make_input = index_input(1, 4), .two_d = true},
    {.name = "index_fill_tensor_value", .shapes = {{5, 4}, {3}},
     .run = [](In x) { return outputs(x[0].index_fill(1, x[1], at::scalar_tensor(-1.5, at::kDouble))); },
     .make_input = index_input(1, 4)},
    {.name = "index_fill_", .shapes = {{5, 4}, {3}},
     .run = [](In x) { return outputs(x[0].clone().index_fill_(1, x[1], 0.5)); }, .make_input = index_input(1, 4),
     .placements = {{Replicate(), Shard(0)}, {Replicate(), Shard(0)}}},
    {.name = "index_fill_tensor_value_", .shapes = {{5, 4}, {3}},
     .run = [](In x) { return outputs(x[0].clone().index_fill_(1, x[1], at::scalar_tensor(3.0, at::kDouble))); },
     .make_input = index_input(1, 4), .placements = {{Replicate(), Shard(0)}, {Replicate(), Shard(0)}}},
    {.name = "index_reduce_amax", .shapes = {{5, 4}, {3}, {5, 3}},
     .run = [](In x) { return outputs(x[0].index_reduce(1, x[1], x[2], "amax")); }, .make_input = index_input(1, 4)},
    {.name = "index_reduce_", .shapes = {{5, 4}, {3}, {5, 3}},
     .run = [](In x) { return outputs(x[0].clone().index_reduce_(1, x[1], x[2], "prod", false)); },
     .make_input = index_input(1, 4), .placements = kInPlaceIndexAdd},
    {.name = "index_add_", .shapes = {{5, 4}, {3}, {5, 3}},
     .run = [](In x) { return outputs(x[0].clone().index_add_(1, x[1], x[2])); },
     .make_input = index_input(1, 4), .placements = kInPlaceIndexAdd},
    {.name = "gather", .shapes = {{5, 4}, {5, 3}}, .run = [](In x) { return outputs(x[0].gather(1, x[1])); },
     .make_input = index_input(1, 4), .two_d = true},
    {.name = "gather_fewer_rows", .shapes = {{5, 4}, {3, 4}}, .run = [](In x) { return outputs(x[0].gather(0, x[1])); },
     .make_input = index_input(1, 5)},
    // The index of the input's own shape: gather's backward scatters into grad.new_zeros(input's shape).
    {.name = "gather_same_shape", .shapes = {{5, 4}, {5, 4}}, .run = [](In x) { return outputs(x[0].gather(1, x[1])); },
     .make_input = index_input(1, 4), .two_d = true},
    {.name = "index_rows", .shapes = {{5, 4}, {6}},
     .run = [](In x) { return outputs(x[0].index({x[1]})); }, .make_input = index_input(1, 5), .two_d = true},
    {.name = "index_two_indices", .shapes = {{5, 3, 2}, {2, 3}, {2, 3}},
     .run = [](In x) { return outputs(x[0].index({x[1], x[2]})); },
     .make_input = [](size_t i, const Shape& shape) { return i == 0 ? test_tensor(shape, at::kDouble, 100) : index_input(i, 3)(i, shape); }},
    {.name = "index_put_accumulate", .shapes = {{5, 4}, {6}, {6, 4}},
     .run = [](In x) { return outputs(x[0].index_put({x[1]}, x[2], true)); }, .make_input = index_input(1, 5),
     .two_d = true},
    {.name = "index_put_rows_3d", .shapes = {{5, 3}, {2, 3}, {2, 3, 3}},
     .run = [](In x) { return outputs(x[0].index_put({x[1]}, x[2], true)); }, .make_input = index_input(1, 5)},
    // In place, self keeps its placement: sharded off the indexed dim, or replicated.
    {.name = "index_put_", .shapes = {{5, 4}, {6}, {6, 4}},
     .run = [](In x) { return outputs(x[0].clone().index_put_({x[1]}, x[2], true)); }, .make_input = index_input(1, 5),
     .placements = kInPlaceIndexPut},
    {.name = "_index_put_impl_", .shapes = {{5, 4}, {6}, {6, 4}},
     .run =
         [](In x) {
           at::Tensor self = x[0].clone();
           at::_index_put_impl_(self, {x[1]}, x[2], /*accumulate=*/true, /*unsafe=*/false);
           return outputs(self);
         },
     .make_input = index_input(1, 5), .placements = kInPlaceIndexPut},
    {.name = "_index_put_impl", .shapes = {{5, 4}, {6}, {6, 4}},
     .run =
         [](In x) {
           return outputs(at::_index_put_impl(x[0], c10::List<std::optional<at::Tensor>>({x[1]}), x[2], /*accumulate=*/true));
         },
     .make_input = index_input(1, 5)},
    // The accumulating samples above check index_put's gradients.
    {.name = "index_put", .shapes = {{5, 4}, {3}, {3, 4}},
     .run = [](In x) { return outputs(x[0].index_put({x[1]}, x[2])); }, .make_input = index_input(1, 5), .backward = false},
    // constant_pad_nd: padded dims replicated, the others keep their shards; Partial(sum) only for a
    // zero value. Negative amounts crop (the backward of a pad is a crop).
    {.name = "constant_pad_nd_last_dim", .shapes = {{5, 3, 7}},
     .run = [](In x) { return outputs(at::constant_pad_nd(x[0], {1, 2}, 0.5)); }, .two_d = true},
    {.name = "constant_pad_nd_zero_value", .shapes = {{5, 6}},
     .run = [](In x) { return outputs(at::constant_pad_nd(x[0], {0, 0, 2, 1})); }, .two_d = true},
    {.name = "constant_pad_nd_crop", .shapes = {{5, 6}},
     .run = [](In x) { return outputs(at::constant_pad_nd(x[0], {-1, 2}, -3)); }},
    // triu / tril: every dim may be sharded, each rank shifting the diagonal by its block's offset
    // (uneven rows and columns over 4 ranks; a batch dim; a negative diagonal; in place).
    {.name = "triu", .shapes = {{5, 7}}, .run = [](In x) { return outputs(x[0].triu(1)); }, .two_d = true},
    {.name = "tril_batched", .shapes = {{3, 6, 5}}, .run = [](In x) { return outputs(x[0].tril(-2)); }, .two_d = true},
    {.name = "triu_", .shapes = {{6, 5}}, .run = [](In x) { return outputs(x[0].clone().triu_()); }},
    {.name = "tril_", .shapes = {{2, 5, 6}}, .run = [](In x) { return outputs(x[0].clone().tril_(3)); }},
    // view_as_complex / view_as_real: the pairs' dim whole, the others sharded; a complex square mixes
    // each pair's parts, so a misread pairing shows.
    {.name = "view_as_complex_and_real", .shapes = {{5, 3, 2}},
     .run = [](In x) {
       const at::Tensor c = at::view_as_complex(x[0]);
       return outputs(at::view_as_real(c * c));
     },
     .two_d = true},
    {.name = "diagonal", .shapes = {{5, 4, 3}}, .run = [](In x) { return outputs(x[0].diagonal(1, 0, 2) * 1); }, .two_d = true},
    {.name = "diagonal_copy", .shapes = {{2, 5, 4}}, .run = [](In x) { return outputs(at::diagonal_copy(x[0], -1, 2, 1)); }},
    {.name = "diag_embed", .shapes = {{5, 3}}, .run = [](In x) { return outputs(at::diag_embed(x[0], 1, 0, 2)); }, .two_d = true},
    {.name = "roll", .shapes = {{5, 4, 3}}, .run = [](In x) { return outputs(x[0].roll({2, -1}, {0, 2})); }, .two_d = true},
    {.name = "roll_flattened", .shapes = {{5, 3}}, .run = [](In x) { return outputs(x[0].roll(4)); }},
    {.name = "expand_copy", .shapes = {{5, 1}}, .run = [](In x) { return outputs(at::expand_copy(x[0], {5, 4})); }},
    {.name = "view_copy", .shapes = {{5, 4, 3}}, .run = [](In x) { return outputs(at::view_copy(x[0], {5, 12})); }, .two_d = true},
    {.name = "view_copy_dtype", .shapes = {{5, 4}}, .run = [](In x) { return outputs(at::view_copy(x[0], at::kLong)); },
     .backward = false, .no_backward_reason = "a reinterpretation of the bits as integers", .partial_inputs = false},
    {.name = "split_with_sizes_copy", .shapes = {{5, 7}},
     .run = [](In x) { return at::split_with_sizes_copy(x[0], {3, 4}, 1); }},
    {.name = "select_scatter", .shapes = {{5, 4, 3}, {5, 3}},
     .run = [](In x) { return outputs(at::select_scatter(x[0], x[1], 1, 2)); }, .backward = false, .two_d = true,
     .no_backward_reason = "LibTorch's derivative zero-fills with a plain tensor it makes, which dtensor refuses to mix "
                           "with DTensors"},
    {.name = "diagonal_scatter", .shapes = {{5, 4, 4}, {5, 4}},
     .run = [](In x) { return outputs(at::diagonal_scatter(x[0], x[1], 0, 1, 2)); }, .backward = false,
     .no_backward_reason = "LibTorch's derivative zero-fills with a plain tensor it makes, which dtensor refuses to mix "
                           "with DTensors"},
    {.name = "slice_scatter", .shapes = {{5, 4}, {5, 2}},
     .run = [](In x) { return outputs(at::slice_scatter(x[0], x[1], 1, 1, 3)); }, .backward = false, .two_d = true,
     .no_backward_reason = "LibTorch's derivative zero-fills with a plain tensor it makes, which dtensor refuses to mix "
                           "with DTensors (exported joint graphs hold the decomposed backward instead)"},
    {.name = "scatter_src", .shapes = {{5, 4}, {5, 2}, {5, 2}},
     .run = [](In x) { return outputs(x[0].scatter(1, x[1], x[2])); }, .make_input = index_input(1, 4)},
    {.name = "scatter_value", .shapes = {{5, 4}, {5, 2}},
     .run = [](In x) { return outputs(x[0].scatter(1, x[1], 2.5)); }, .make_input = index_input(1, 4)},
    {.name = "scatter_reduce", .shapes = {{5, 4}, {5, 2}, {5, 2}},
     .run = [](In x) { return outputs(x[0].scatter(1, x[1], x[2], "add")); }, .make_input = index_input(1, 4),
     .backward = false},
    {.name = "scatter_value_reduce", .shapes = {{5, 4}, {5, 2}},
     .run = [](In x) { return outputs(x[0].scatter(1, x[1], 2.0, "multiply")); }, .make_input = index_input(1, 4),
     .backward = false},
    {.name = "scatter_add", .shapes = {{5, 4}, {5, 2}, {5, 2}},
     .run = [](In x) { return outputs(x[0].scatter_add(1, x[1], x[2])); }, .make_input = index_input(1, 4)},
    {.name = "scatter_src_", .shapes = {{5, 4}, {5, 2}, {5, 2}},
     .run = [](In x) { return outputs(x[0].clone().scatter_(1, x[1], x[2])); },
     .make_input = index_input(1, 4), .placements = kInPlaceIndexing},
    {.name = "scatter_value_", .shapes = {{5, 4}, {5, 2}},
     .run = [](In x) { return outputs(x[0].clone().scatter_(1, x[1], 2.5)); },
     .make_input = index_input(1, 4), .placements = kInPlaceIndexing},
    {.name = "scatter_reduce_", .shapes = {{5, 4}, {5, 2}, {5, 2}},
     .run = [](In x) { return outputs(x[0].clone().scatter_(1, x[1], x[2], "multiply")); },
     .make_input = index_input(1, 4), .placements = kInPlaceIndexing, .backward = false},
    {.name = "scatter_value_reduce_", .shapes = {{5, 4}, {5, 2}},
     .run = [](In x) { return outputs(x[0].clone().scatter_(1, x[1], 2.0, "add")); },
     .make_input = index_input(1, 4), .placements = kInPlaceIndexing,
     .backward = false},
    {.name = "scatter_add_", .shapes = {{5, 4}, {5, 2}, {5, 2}},
     .run = [](In x) { return outputs(x[0].clone().scatter_add_(1, x[1], x[2])); },
     .make_input = index_input(1, 4), .placements = kInPlaceIndexing},
});

}  // namespace
}  // namespace dtensor::testing
