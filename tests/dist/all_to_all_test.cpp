// The uneven all-to-all (dtensor/all_to_all.h) between real processes, on MPI and Gloo, along every dim
// of the 1-d mesh of 4 and the 2x2 one: routings with uneven blocks, members that send or receive
// nothing at all (a 0-row input included), and one member receiving every row. Each rank's result is
// checked against what every sender's rows are, computed here again from the sender's coordinate
// (no collective in the oracle); split sizes given and exchanged; the backward against the gradient
// each row must get from the member it went to; bad split sizes refused before anything is sent.

#include "dtensor/all_to_all.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

// How many rows member `from` sends member `to` of an n-member group, by routing.
enum class Routing { Uneven, AllToTheFirst, SecondSendsNothing };

int64_t rows_sent(Routing routing, int64_t from, int64_t to, int64_t n) {
  switch (routing) {
    case Routing::Uneven: return (from + 2 * to) % (n + 1);  // zeros on some pairs
    case Routing::AllToTheFirst: return to == 0 ? from + 3 : 0;
    case Routing::SecondSendsNothing: return from == 1 ? 0 : to + 1;
  }
  return 0;
}

std::vector<int64_t> splits_from(Routing routing, int64_t from, int64_t n) {
  std::vector<int64_t> sizes;
  for (int64_t to = 0; to < n; ++to) sizes.push_back(rows_sent(routing, from, to, n));
  return sizes;
}

// Row k of the block `from` sends `to`: values that name the pair and the row, [2, 3] per row.
at::Tensor block(int64_t from, int64_t to, int64_t rows, at::ScalarType dtype) {
  at::Tensor base = at::arange(rows * 6, at::kDouble).reshape({rows, 2, 3}).add(1000 * from + 100 * to);
  return base.to(dtype);
}

at::Tensor input_of(Routing routing, int64_t from, int64_t n, at::ScalarType dtype) {
  std::vector<at::Tensor> blocks;
  for (int64_t to = 0; to < n; ++to) blocks.push_back(block(from, to, rows_sent(routing, from, to, n), dtype));
  return at::cat(blocks);
}

at::Tensor expected_output(Routing routing, int64_t me, int64_t n, at::ScalarType dtype) {
  std::vector<at::Tensor> blocks;
  for (int64_t from = 0; from < n; ++from) blocks.push_back(block(from, me, rows_sent(routing, from, me, n), dtype));
  return at::cat(blocks);
}

const Routing kRoutings[] = {Routing::Uneven, Routing::AllToTheFirst, Routing::SecondSendsNothing};

class AllToAllTest : public DistTest {};

TEST_F(AllToAllTest, UnevenRowsReachTheirMembersWithSplitSizesGivenOrExchanged) {
  for (const MeshPtr& m : meshes()) {
    for (int64_t dim = 0; dim < m->ndim(); ++dim) {
      const int64_t n = m->size(dim), me = m->local_rank(dim);
      for (const Routing routing : kRoutings) {
        for (const at::ScalarType dtype : {at::kFloat, at::kLong, at::kComplexDouble}) {
          SCOPED_TRACE(m->str() + " dim " + std::to_string(dim) + " routing " + std::to_string(int(routing)) + " " +
                       c10::toString(dtype));
          const at::Tensor input = input_of(routing, me, n, dtype);
          std::vector<int64_t> receive;
          for (int64_t from = 0; from < n; ++from) receive.push_back(rows_sent(routing, from, me, n));
          EXPECT_EQ(exchange_split_sizes(splits_from(routing, me, n), m, dim), receive);
          const at::Tensor given = all_to_all_single(input, receive, splits_from(routing, me, n), m, dim);
          const at::Tensor exchanged = all_to_all_single(input, std::nullopt, splits_from(routing, me, n), m, dim);
          EXPECT_TRUE(tensors_equal(given, expected_output(routing, me, n, dtype)));
          EXPECT_TRUE(tensors_equal(exchanged, expected_output(routing, me, n, dtype)));
        }
      }
    }
  }
}

TEST_F(AllToAllTest, EmptySplitSizesMeanEqualBlocks) {
  const MeshPtr m = mesh({4});
  const int64_t me = m->local_rank(0);
  const at::Tensor input = at::arange(8 * 3, at::kFloat).reshape({8, 3}).add(100 * me);
  const at::Tensor output = all_to_all_single(input, std::vector<int64_t>{}, {}, m, 0);
  std::vector<at::Tensor> expected;
  for (int64_t from = 0; from < 4; ++from)
    expected.push_back(at::arange(8 * 3, at::kFloat).reshape({8, 3}).add(100 * from).narrow(0, 2 * me, 2));
  EXPECT_TRUE(tensors_equal(output, at::cat(expected)));
}

// The gradient of each sent row is the gradient its receiver's loss gives it: here the weight the
// receiver multiplies that output row by, a function of the receiver and the row's place there.
at::Tensor output_weights(int64_t receiver, int64_t rows) {
  return at::arange(rows * 6, at::kDouble).reshape({rows, 2, 3}).mul(0.5).add(receiver + 1);
}

TEST_F(AllToAllTest, BackwardSendsEachRowItsReceiversGradient) {
  for (const MeshPtr& m : meshes()) {
    for (const Routing routing : kRoutings) {
      const int64_t dim = m->ndim() - 1, n = m->size(dim), me = m->local_rank(dim);
      SCOPED_TRACE(m->str() + " routing " + std::to_string(int(routing)));
      const at::Tensor input = input_of(routing, me, n, at::kDouble).requires_grad_();
      const at::Tensor output = all_to_all_single(input, std::nullopt, splits_from(routing, me, n), m, dim);
      (output * output_weights(me, output.size(0))).sum().backward();
      // Where each of my blocks lands in its receiver's output: after the blocks of lower senders.
      std::vector<at::Tensor> expected;
      for (int64_t to = 0; to < n; ++to) {
        int64_t at_row = 0, total = 0;
        for (int64_t from = 0; from < n; ++from) {
          if (from < me) at_row += rows_sent(routing, from, to, n);
          total += rows_sent(routing, from, to, n);
        }
        expected.push_back(output_weights(to, total).narrow(0, at_row, rows_sent(routing, me, to, n)));
      }
      ASSERT_TRUE(input.grad().defined());
      EXPECT_TRUE(tensors_equal(input.grad(), at::cat(expected)));
    }
  }
}

TEST_F(AllToAllTest, BadSplitSizesAreRefusedBeforeAnythingIsSent) {
  const MeshPtr m = mesh({4});
  const at::Tensor input = at::ones({5, 2});
  EXPECT_THAT(error_of([&] { all_to_all_single(input, std::nullopt, {1, 1, 3}, m, 0); }),
              HasSubstr("has 3 entries; give one per member of the dim"));
  EXPECT_THAT(error_of([&] { all_to_all_single(input, std::nullopt, {1, 1, 1, 1}, m, 0); }),
              HasSubstr("sums to 4 but the input has 5 rows"));
  EXPECT_THAT(error_of([&] { all_to_all_single(input, std::nullopt, {-1, 2, 2, 2}, m, 0); }),
              HasSubstr("holds a negative size"));
  EXPECT_THAT(error_of([&] { all_to_all_single(input, std::nullopt, {}, m, 0); }),
              HasSubstr("the input's 5 rows do not divide into 4 equal blocks"));
  EXPECT_THAT(error_of([&] { all_to_all_single(input, std::vector<int64_t>{1, 1}, {2, 1, 1, 1}, m, 0); }),
              HasSubstr("output_split_sizes [1, 1] has 2 entries"));
  EXPECT_THAT(error_of([&] { all_to_all_single(input, std::nullopt, {2, 1, 1, 1}, m, 1); }),
              HasSubstr("mesh dim 1 does not exist on a 1-d mesh"));
  const at::Tensor sharded = distribute_tensor(at::ones({8, 2}), m, Placements{Shard(0)});
  EXPECT_THAT(error_of([&] { all_to_all_single(sharded, std::nullopt, {}, m, 0); }),
              HasSubstr("the input is a DTensor; pass its local tensor"));
  // The group still works after the refusals: nothing was half sent.
  const at::Tensor rows = at::full({4, 2}, double(m->local_rank(0)), at::kDouble);
  EXPECT_TRUE(tensors_equal(all_to_all_single(rows, std::nullopt, {}, m, 0), at::arange(4, at::kDouble).unsqueeze(1).expand({4, 2})));
}

}  // namespace
}  // namespace dtensor::testing
