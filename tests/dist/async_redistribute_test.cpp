// redistribute with async_op: the collective starts at once and the result's first use waits for it.
// Values against the blocking redistribute and the whole tensor, with other collectives run while
// transfers are in flight, on 1-d and 2-d meshes with uneven shapes, and gradients through it.

#include "dtensor/comm_debug.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

class AsyncRedistributeTest : public DistTest {};

struct Move {
  Shape mesh_shape;
  Placements from, to;
  bool in_flight;  // one collective: started, not waited for, when redistribute returns
};

TEST_F(AsyncRedistributeTest, ResultsEqualTheBlockingRedistribute) {
  const at::Tensor full = test_tensor({7, 5, 3}, at::kDouble, 11);
  const std::vector<Move> moves = {
      {{4}, {Shard(0)}, {Replicate()}, true},
      {{4}, {Shard(1)}, {Replicate()}, true},
      {{4}, {Partial()}, {Replicate()}, true},
      {{4}, {Partial(ReduceOp::Avg)}, {Shard(0)}, true},
      {{4}, {Partial()}, {Shard(2)}, true},
      {{4}, {Replicate()}, {Shard(1)}, false},   // a local chunk: nothing to wait for
      {{4}, {Shard(0)}, {Shard(1)}, false},      // an all-to-all completes before returning
      {{2, 2}, {Shard(0), Shard(1)}, {Replicate(), Shard(1)}, true},
      {{2, 2}, {Partial(), Shard(0)}, {Replicate(), Replicate()}, false},  // two collectives
  };
  for (const Move& move : moves) {
    SCOPED_TRACE(to_string(move.from) + " -> " + to_string(move.to));
    const auto m = mesh(move.mesh_shape);
    const at::Tensor x = make_dtensor_holding(full, m, move.from, 3);
    const at::Tensor blocking = redistribute(x, move.to);
    const at::Tensor started = redistribute(x, move.to, {.async_op = true});
    EXPECT_EQ(dtensor_impl(started).local_pending(), move.in_flight);
    EXPECT_EQ(placements_of(started), move.to);
    EXPECT_TRUE(tensors_equal(local_tensor_of(started), local_tensor_of(blocking)));
    EXPECT_FALSE(dtensor_impl(started).local_pending());
    EXPECT_TRUE(tensors_close(full_tensor(started), full, 1e-12, 1e-12));
  }
}

// Transfers in flight while other collectives run and while other ops compute; waited for in the
// reverse order of their start.
TEST_F(AsyncRedistributeTest, OtherWorkRunsWhileTransfersAreInFlight) {
  const auto m = mesh({4});
  const at::Tensor a = test_tensor({9, 4}, at::kFloat, 1), b = test_tensor({6, 10}, at::kFloat, 2);
  const at::Tensor da = distribute_tensor(a, m, Placements{Shard(0)}), db = distribute_tensor(b, m, Placements{Shard(1)});
  CommDebugMode comm;
  const at::Tensor ga = redistribute(da, {Replicate()}, {.async_op = true});
  const at::Tensor gb = redistribute(db, {Replicate()}, {.async_op = true});
  EXPECT_EQ(comm.count("all-gather"), 2) << "both started at redistribute";
  const at::Tensor meanwhile = full_tensor(distribute_tensor(a, m, Placements{Shard(0)}) * 2);  // a blocking all-gather
  const at::Tensor product = at::mm(b.t(), b);                                         // local compute
  EXPECT_TRUE(tensors_equal(meanwhile, a * 2));
  EXPECT_TRUE(tensors_equal(local_tensor_of(gb), b));
  EXPECT_TRUE(tensors_equal(local_tensor_of(ga), a));
  (void)product;
}

// Ops on a pending DTensor wait for it; its gradient goes back through the blocking backward.
TEST_F(AsyncRedistributeTest, OpsAndGradientsThroughAPendingDTensor) {
  const auto m = mesh({2, 2});
  const at::Tensor w = test_tensor({5, 6}, at::kDouble, 4);
  const at::Tensor dw = distribute_tensor(w, m, Placements{Shard(0), Shard(1)}).requires_grad_();
  const at::Tensor gathered = redistribute(dw, {Replicate(), Shard(1)}, {.async_op = true});
  const at::Tensor loss = (gathered * gathered).sum();
  loss.backward();
  EXPECT_TRUE(tensors_close(full_tensor(loss), (w * w).sum(), 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(full_tensor(dw.grad()), 2 * w, 1e-12, 1e-12));
  EXPECT_EQ(placements_of(dw.grad()), (Placements{Shard(0), Shard(1)}));
}

}  // namespace
}  // namespace dtensor::testing
