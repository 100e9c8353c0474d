// local_map, visualize_sharding and the DTENSOR_LOG_REDISTRIBUTE log.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "../../src/redistribute/redistribute_log.h"
#include "dtensor/comm_debug.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

std::vector<at::Tensor> local_mm(const std::vector<at::Tensor>& in) { return {at::mm(in[0], in[1])}; }

class ToolsTest : public DistTest {};

TEST_F(ToolsTest, LocalMapRowParallelLinearMatchesOneDevice) {
  // Rows of x (5 over 4 ranks: 2,2,1,0) times a replicated weight; the weight's local gradients are
  // each rank's rows' contribution, so they are Partial.
  auto m = mesh({4});
  const at::Tensor x = test_tensor({5, 4}, at::kDouble, 1), w = test_tensor({4, 3}, at::kDouble, 2);
  auto linear = local_map(local_mm, {{Shard(0)}}, PlacementsPerInput{Placements{Shard(0)}, Placements{Replicate()}},
                          false, nullptr, PlacementsPerInput{std::nullopt, Placements{Partial()}});
  at::Tensor fx = x.clone().requires_grad_(), fw = w.clone().requires_grad_();
  at::Tensor dx = distribute_tensor(x.clone().requires_grad_(), m, Placements{Shard(0)});
  at::Tensor dw = distribute_tensor(w.clone().requires_grad_(), m, Placements{Replicate()});

  const at::Tensor expected = at::mm(fx, fw);
  at::Tensor out = linear({dx, dw})[0];
  EXPECT_EQ(placements_of(out), Placements{Shard(0)});
  EXPECT_EQ(out.sizes(), expected.sizes());
  EXPECT_TRUE(tensors_close(full_tensor(out), expected));

  (expected * expected).sum().backward();
  (out * out).sum().backward();
  EXPECT_TRUE(tensors_close(full_tensor(dx.grad()), fx.grad()));
  EXPECT_TRUE(tensors_close(full_tensor(dw.grad()), fw.grad()));
}

TEST_F(ToolsTest, LocalMapPartialOutputOnA2dMesh) {
  // x^T y over row-sharded x and y: each rank's product is a contribution to the sum.
  auto m = mesh({2, 2});
  const at::Tensor x = test_tensor({7, 3}, at::kDouble, 3), y = test_tensor({7, 2}, at::kDouble, 4);
  const Placements rows{Shard(0), Shard(0)};
  auto xty = local_map([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{at::mm(in[0].t(), in[1])}; },
                       {{Partial(), Partial()}}, PlacementsPerInput{rows, rows});
  at::Tensor fx = x.clone().requires_grad_(), fy = y.clone().requires_grad_();
  at::Tensor dx = distribute_tensor(x.clone().requires_grad_(), m, rows);
  at::Tensor dy = distribute_tensor(y.clone().requires_grad_(), m, rows);
  const at::Tensor expected = at::mm(fx.t(), fy);
  at::Tensor out = xty({dx, dy})[0];
  EXPECT_TRUE(tensors_close(full_tensor(out), expected));
  (expected * 3).sum().backward();
  (out * 3).sum().backward();
  EXPECT_TRUE(tensors_close(full_tensor(dx.grad()), fx.grad()));
  EXPECT_TRUE(tensors_close(full_tensor(dy.grad()), fy.grad()));
}

TEST_F(ToolsTest, LocalMapChecksOrRedistributesInputs) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({6, 4}, at::kDouble, 5), w = test_tensor({4, 2}, at::kDouble, 6);
  at::Tensor replicated_x = distribute_tensor(x, m), dw = distribute_tensor(w, m);
  const PlacementsPerInput wanted{Placements{Shard(0)}, Placements{Replicate()}};
  auto strict = local_map(local_mm, {{Shard(0)}}, wanted);
  EXPECT_THROW(strict({replicated_x, dw}), DTensorError);
  auto moving = local_map(local_mm, {{Shard(0)}}, wanted, /*redistribute_inputs=*/true);
  EXPECT_TRUE(tensors_close(full_tensor(moving({replicated_x, dw})[0]), at::mm(x, w)));
  // A DTensor argument needs an in_placements entry; the output count must match.
  EXPECT_THROW(local_map(local_mm, {{Shard(0)}}, PlacementsPerInput{std::nullopt, Placements{Replicate()}})({replicated_x, dw}),
               DTensorError);
  EXPECT_THROW(local_map(local_mm, {{Shard(0)}, {Shard(0)}})({replicated_x, dw}), DTensorError);
  // Without DTensor arguments the function runs on the plain tensors as they are.
  const auto plain = strict({x, w});
  EXPECT_FALSE(is_dtensor(plain[0]));
  EXPECT_TRUE(tensors_equal(plain[0], at::mm(x, w)));
}

TEST_F(ToolsTest, VisualizeShardingOf2dLayouts) {
  const TensorMeta meta{{5, 6}, {6, 1}, at::kFloat};
  const std::string grid = visualize_sharding(DTensorSpec{mesh({2, 2}), {Shard(0), Shard(1)}, meta});
  EXPECT_EQ(grid,
            "DTensor shape=[5, 6], dtype=Float, placements=(S(0),S(1)), mesh=DeviceMesh([[0, 1], [2, 3]])\n"
            "          cols 0:3  cols 3:6\n"
            "rows 0:3  0         1\n"
            "rows 3:5  2         3\n");
  const std::string mixed = visualize_sharding(DTensorSpec{mesh({2, 2}), {Partial(), Shard(1)}, meta});
  EXPECT_EQ(mixed,
            "DTensor shape=[5, 6], dtype=Float, placements=(P(sum),S(1)), mesh=DeviceMesh([[0, 1], [2, 3]])\n"
            "          cols 0:3  cols 3:6\n"
            "rows 0:5  0, 2      1, 3\n"
            "mesh dim 0 is Partial(sum): the ranks along it hold contributions whose sum is the value\n");
  if (world()->rank() == 0) std::cout << grid << mixed;
}

TEST_F(ToolsTest, VisualizeShardingOfA1dUnevenDTensor) {
  at::Tensor dt = zeros({5}, mesh({4}), Placements{Shard(0)});
  EXPECT_EQ(visualize_sharding(dt),
            "DTensor shape=[5], dtype=Float, placements=(S(0)), mesh=DeviceMesh([0, 1, 2, 3])\n"
            "     ranks\n"
            "0:2  0\n"
            "2:4  1\n"
            "4:5  2\n"
            "empty shards on ranks: 3\n");
  EXPECT_THROW(visualize_sharding(zeros({2, 2, 2}, mesh({4}))), DTensorError);
  EXPECT_THROW(visualize_sharding(at::zeros({5})), DTensorError);
}

// Everything written to stderr (file descriptor 2) while `body` runs.
std::string capture_stderr(const std::function<void()>& body) {
  std::fflush(stderr);
  FILE* file = std::tmpfile();
  const int saved = dup(2);
  dup2(fileno(file), 2);
  struct Restore {
    int saved;
    ~Restore() {
      std::fflush(stderr);
      dup2(saved, 2);
      close(saved);
    }
  };
  {
    Restore restore{saved};
    body();
  }
  std::string out;
  std::rewind(file);
  for (int c; (c = std::fgetc(file)) != EOF;) out += static_cast<char>(c);
  std::fclose(file);
  return out;
}

TEST_F(ToolsTest, LogRedistributeNamesTheOpAndThePlan) {
  auto m = mesh({4});
  at::Tensor x = distribute_tensor(test_tensor({8, 4}, at::kFloat, 1), m, Placements{Shard(0)});
  at::Tensor w = distribute_tensor(test_tensor({4, 4}, at::kFloat, 2), m, Placements{Shard(0)});
  setenv("DTENSOR_LOG_REDISTRIBUTE", "1", 1);
  detail::reload_redistribute_log_setting();
  const std::string by_op = capture_stderr([&] { (void)at::mm(x, w); });
  const std::string by_api = capture_stderr([&] { (void)redistribute(x, Placements{Replicate()}); });
  unsetenv("DTENSOR_LOG_REDISTRIBUTE");
  detail::reload_redistribute_log_setting();
  const std::string rank = std::to_string(world()->rank());
  // mm's plan depends on its strategy choice; the line names the op either way.
  EXPECT_THAT(by_op, ::testing::StartsWith("dtensor redistribute (rank " + rank + ", aten::mm): Float["));
  EXPECT_EQ(by_api, "dtensor redistribute (rank " + rank + ", redistribute): Float[8, 4] on DeviceMesh([0, 1, 2, 3]), "
                    "S(0) -> R: all-gather on dim 0 (96 B/rank); 96 B/rank in total\n");
  // Off again: nothing is logged.
  EXPECT_EQ(capture_stderr([&] { (void)redistribute(x, Placements{Replicate()}); }), "");
}

// rot90 has no rule, and its ATen implementation is composite (flips and transposes, which have
// rules): it runs on the DTensors, forward and backward, equal to one device, and says so in
// CommDebugMode and the redistribution log. (An op with neither gives DispatchTest's clear error.)
TEST_F(ToolsTest, CompositeFallbackRunsAtensImplementationAndSaysSo) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({5, 6}, at::kDouble, 3), grad = test_tensor({6, 5}, at::kDouble, 4);
  at::Tensor dx = distribute_tensor(x, m, Placements{Shard(0)}).requires_grad_();
  at::Tensor y;
  {
    CommDebugMode debug;
    y = at::rot90(dx, 1, {0, 1});
    EXPECT_EQ(debug.composite_fallbacks(), std::vector<std::string>{"aten::rot90"});
    const auto ops = debug.ops();
    EXPECT_NE(std::find(ops.begin(), ops.end(), "aten::flip"), ops.end()) << debug.summary();
    EXPECT_THAT(debug.summary(), ::testing::HasSubstr("composite fallback: aten::rot90"));
  }
  const at::Tensor leaf = x.clone().requires_grad_();
  const at::Tensor expected = at::rot90(leaf, 1, {0, 1});
  EXPECT_TRUE(tensors_equal(full_tensor(y), expected));
  expected.backward(grad);
  y.backward(distribute_tensor(grad, m, placements_of(y)));
  EXPECT_TRUE(tensors_equal(full_tensor(dx.grad()), leaf.grad()));

  setenv("DTENSOR_LOG_REDISTRIBUTE", "1", 1);
  detail::reload_redistribute_log_setting();
  const std::string logged = capture_stderr([&] { (void)at::rot90(dx.detach(), 2, {0, 1}); });
  unsetenv("DTENSOR_LOG_REDISTRIBUTE");
  detail::reload_redistribute_log_setting();
  EXPECT_THAT(logged, ::testing::HasSubstr("dtensor composite fallback (rank " + std::to_string(world()->rank()) +
                                           "): aten::rot90 has no sharding rule; ATen's composite implementation runs"));
}

// Composite ops PyTorch's DTensor has handlers for, and dtensor runs through the fallback: a size
// query answers from the global sizes, and the out= forms of 1-d pooling (whose functional forms are
// CompositeImplicit, decomposed before they reach dtensor) run the 2-d pooling on the shards.
TEST_F(ToolsTest, CompositeFallbackAnswersSizeQueriesAndRunsOutForms) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({2, 5, 9}, at::kDouble, 3);
  const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(1)});  // 5 channels over 4 ranks
  {
    CommDebugMode debug;
    EXPECT_TRUE(at::is_same_size(dx, distribute_tensor(x, m, Placements{Replicate()})));
    EXPECT_FALSE(at::is_same_size(dx, distribute_tensor(x.transpose(1, 2).contiguous(), m, Placements{Shard(1)})));
    EXPECT_EQ(debug.composite_fallbacks(), (std::vector<std::string>{"aten::is_same_size", "aten::is_same_size"}));
  }
  at::Tensor pooled = distribute_tensor(at::zeros({2, 5, 4}, at::kDouble), m, Placements{Shard(1)});
  at::avg_pool1d_out(pooled, dx, {2});
  EXPECT_TRUE(tensors_close(full_tensor(pooled), at::avg_pool1d(x, {2})));
  at::Tensor adapted = distribute_tensor(at::zeros({2, 5, 3}, at::kDouble), m, Placements{Shard(1)});
  at::adaptive_avg_pool1d_out(adapted, dx, {3});
  EXPECT_TRUE(tensors_close(full_tensor(adapted), at::adaptive_avg_pool1d(x, {3})));
  EXPECT_EQ(to_local(adapted).size(1), to_local(dx).size(1));
}

}  // namespace
}  // namespace dtensor::testing
