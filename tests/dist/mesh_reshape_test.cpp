// DeviceMesh's flatten, unflatten, from_group and local_rank over real process groups, checked against
// rank arithmetic done by hand (PyTorch's DeviceMesh semantics) and DTensors against the whole tensor.

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "harness.h"

namespace dtensor::testing {
namespace {

// The ranks of the group along mesh dim `dim` in the group's own order: proves whom it holds, and how.
std::vector<int64_t> members_of(const DeviceMesh& m, int64_t dim) {
  std::vector<at::Tensor> in{at::full({1}, world()->rank(), at::kLong)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int64_t i = 0; i < m.size(dim); ++i) out[0].push_back(at::empty({1}, at::kLong));
  m.group(dim)->allgather(out, in)->wait();
  std::vector<int64_t> ranks;
  for (const auto& t : out[0]) ranks.push_back(t.item<int64_t>());
  return ranks;
}

MeshPtr fresh_mesh(const Shape& shape, std::vector<std::string> names) {
  return DeviceMesh::create(world(), shape, MeshOptions{std::move(names)});
}

// A DTensor of `full` on `m`, which must hold exactly `expected_local` here and give back `full` whole.
void expect_sharded_as(const at::Tensor& full, const MeshPtr& m, const Placements& placements, const at::Tensor& expected_local) {
  const at::Tensor dt = distribute_tensor(full, m, placements);
  EXPECT_TRUE(at::equal(to_local(dt), expected_local));
  EXPECT_TRUE(at::equal(full_tensor(dt), full));
}

class MeshReshapeTest : public DistTest {};

TEST_F(MeshReshapeTest, FlatteningTwoDimsGivesOneGroupInRowMajorOrder) {
  const int64_t r = world()->rank();
  auto m = fresh_mesh({2, 2}, {"dp", "tp"});
  auto flat = m->flatten();
  EXPECT_EQ(flat->dim_names(), (std::vector<std::string>{"dp_tp"}));
  EXPECT_EQ(flat->ranks(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(members_of(*flat, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ((*m)["dp_tp"]->group(0).get(), flat->group(0).get());

  // (tp, dp) row-major: [0, 2, 1, 3], so rank r sits at (r % 2) * 2 + r / 2.
  auto swapped = m->slice({"tp", "dp"})->flatten("tp_dp");
  const int64_t position = (r % 2) * 2 + r / 2;
  EXPECT_EQ(swapped->ranks(), (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(swapped->local_rank(), position);
  EXPECT_EQ(members_of(*swapped, 0), (std::vector<int64_t>{0, 2, 1, 3}));
  const at::Tensor full = test_tensor({7, 3}, at::kFloat, 11);  // uneven: chunks of 2, 2, 2, 1 rows
  expect_sharded_as(full, swapped, {Shard(0)}, at::chunk(full, 4, 0)[static_cast<size_t>(position)]);
}

TEST_F(MeshReshapeTest, TheRootSlicesAFlattenedDimWithItsOwnDims) {
  const int64_t r = world()->rank();
  auto m = fresh_mesh({2, 2, 1}, {"dp_replicate", "dp_shard", "cp"});
  auto shard_cp = m->slice({"dp_shard", "cp"})->flatten();
  auto hsdp = m->slice({"dp_replicate", "dp_shard_cp"});
  EXPECT_EQ(hsdp->shape(), (Shape{2, 2}));
  EXPECT_EQ(hsdp->ranks(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(*hsdp->coordinate(), (Shape{r / 2, r % 2}));
  EXPECT_EQ(hsdp->group(1).get(), shard_cp->group(0).get());
  EXPECT_EQ(hsdp->group(0).get(), m->group(0).get());
  const at::Tensor full = test_tensor({5, 3}, at::kFloat, 12);
  const at::Tensor rows = at::chunk(full, 2, 0)[static_cast<size_t>(r / 2)];
  expect_sharded_as(full, hsdp, {Shard(0), Shard(1)}, at::chunk(rows, 2, 1)[static_cast<size_t>(r % 2)]);
}

TEST_F(MeshReshapeTest, FlatteningAgainIsTheSameGroupAndOneDimUnderItsNameIsItself) {
  auto m = fresh_mesh({2, 2}, {"dp", "tp"});
  auto first = m->flatten("all");
  auto again = m->flatten("all");
  EXPECT_EQ(*first, *again);
  EXPECT_EQ(first->group(0).get(), again->group(0).get());
  auto tp = (*m)["tp"];
  EXPECT_EQ(tp->flatten().get(), tp.get());
}

TEST_F(MeshReshapeTest, FlattenAndSliceErrors) {
  auto m = fresh_mesh({2, 2}, {"dp", "tp"});
  EXPECT_THAT(error_of([&] { mesh({4})->flatten(); }), ::testing::HasSubstr("has no dim names"));
  EXPECT_THAT(error_of([&] { m->slice({"tp", "dp"})->flatten("tp"); }), ::testing::HasSubstr("'tp' is already a dim"));
  m->slice({"dp"})->flatten("x");
  EXPECT_THAT(error_of([&] { (*m)["tp"]->flatten("x"); }), ::testing::HasSubstr("was given to other dims"));
  EXPECT_THAT(error_of([&] { (*m)["dp"]->slice({"x"}); }), ::testing::HasSubstr("are sliced from that mesh"));
  EXPECT_THAT(error_of([&] { m->slice({"dp", "x"}); }), ::testing::HasSubstr("'dp' and 'x' both cover"));
  EXPECT_THAT(error_of([&] { m->slice({"y"}); }), ::testing::HasSubstr("its dims are: dp, tp, x (flattened)"));
}

TEST_F(MeshReshapeTest, UnflatteningSplitsADimRowMajor) {
  const int64_t r = world()->rank();
  auto line = fresh_mesh({4}, {"world"});
  auto grid = line->unflatten("world", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(grid->shape(), (Shape{2, 2}));
  EXPECT_EQ(grid->dim_names(), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(*grid->coordinate(), (Shape{r / 2, r % 2}));
  EXPECT_EQ(members_of(*grid, 0), (std::vector<int64_t>{r % 2, r % 2 + 2}));
  EXPECT_EQ(members_of(*grid, 1), (std::vector<int64_t>{2 * (r / 2), 2 * (r / 2) + 1}));
  const at::Tensor full = test_tensor({6, 5}, at::kFloat, 13);
  const at::Tensor dt = redistribute(distribute_tensor(full, grid, Placements{Shard(0), Shard(1)}), {Replicate(), Shard(0)});
  EXPECT_TRUE(at::equal(to_local(dt), at::chunk(full, 2, 0)[static_cast<size_t>(r % 2)]));
  EXPECT_TRUE(at::equal(full_tensor(dt), full));
  // Its own root: it flattens and slices its own dims.
  grid->flatten("dp_tp");
  EXPECT_EQ((*grid)["dp_tp"]->ranks(), (std::vector<int64_t>{0, 1, 2, 3}));

  auto kept = fresh_mesh({2, 2}, {"a", "b"});
  auto three = kept->unflatten(1, {2, 1}, {"b1", "b2"});
  EXPECT_EQ(three->shape(), (Shape{2, 2, 1}));
  EXPECT_EQ(three->group(0).get(), kept->group(0).get());
  EXPECT_EQ(members_of(*three, 1), members_of(*kept, 1));
}

TEST_F(MeshReshapeTest, UnflattenErrors) {
  auto m = fresh_mesh({4}, {"world"});
  EXPECT_THAT(error_of([&] { m->unflatten(0, {3, 2}, {"a", "b"}); }), ::testing::HasSubstr("multiply to 6, not the dim's size 4"));
  EXPECT_THAT(error_of([&] { m->unflatten(0, {2, 2}, {"a"}); }), ::testing::HasSubstr("one name per size"));
  EXPECT_THAT(error_of([&] { m->unflatten(1, {2, 2}, {"a", "b"}); }), ::testing::HasSubstr("out of range"));
  EXPECT_THAT(error_of([&] { fresh_mesh({2, 2}, {"a", "b"})->unflatten("b", {2, 1}, {"a", "c"}); }),
              ::testing::HasSubstr("names must be unique"));
}

TEST_F(MeshReshapeTest, AMeshFromGroupsMadeElsewhereBorrowsThem) {
  const int64_t r = world()->rank();
  auto w = world();
  const auto backend = mesh({4})->backend();
  auto group = w->new_group({0, 1, 2, 3}, c10::DeviceType::CPU, w->timeout(), backend);
  {
    auto line = DeviceMesh::from_group(w, group, {0, 1, 2, 3}, MeshOptions{{"dp"}, c10::DeviceType::CPU, {}, backend});
    EXPECT_EQ(line->local_rank(), r);
    const at::Tensor full = test_tensor({9, 2}, at::kFloat, 14);  // torch.chunk: 3, 3, 3 rows, none for rank 3
    const auto chunks = at::chunk(full, 4, 0);
    expect_sharded_as(full, line, {Shard(0)}, r < 3 ? chunks[static_cast<size_t>(r)] : full.narrow(0, 9, 0));
    EXPECT_THAT(error_of([&] { DeviceMesh::from_group(w, group, {3, 2, 1, 0}); }), ::testing::HasSubstr("pass the ranks as the groups order them"));
    line->shutdown();
  }
  // The caller's group outlives the mesh and its shutdown.
  std::vector<at::Tensor> one{at::ones({1})};
  group->allreduce(one)->wait();
  EXPECT_EQ(one[0].item<float>(), 4.0f);

  auto made = mesh({2, 2}, {}, {"dp", "tp"});
  auto grid = DeviceMesh::from_group(w, {made->group(0), made->group(1)}, {2, 2}, {0, 1, 2, 3},
                                     MeshOptions{{"dp", "tp"}, c10::DeviceType::CPU, {}, backend});
  const at::Tensor full = test_tensor({5, 4}, at::kFloat, 15);
  const at::Tensor rows = at::chunk(full, 2, 0)[static_cast<size_t>(r / 2)];
  expect_sharded_as(full, grid, {Shard(0), Shard(1)}, at::chunk(rows, 2, 1)[static_cast<size_t>(r % 2)]);
  EXPECT_THAT(error_of([&] { DeviceMesh::from_group(w, {made->group(0)}, {2, 2}, {0, 1, 2, 3}); }),
              ::testing::HasSubstr("1 process groups for 2 mesh dims"));
}

TEST_F(MeshReshapeTest, LocalRankIsTheCoordinateAlongADim) {
  const int64_t r = world()->rank();
  auto m = mesh({2, 2}, {}, {"dp", "tp"});
  EXPECT_EQ(m->local_rank("dp"), r / 2);
  EXPECT_EQ(m->local_rank(1), r % 2);
  EXPECT_EQ(m->local_rank(1), m->group(1)->getRank());
  EXPECT_THAT(error_of([&] { m->local_rank(); }), ::testing::HasSubstr("has 2 dims; name the dim"));
  EXPECT_THAT(error_of([&] { m->local_rank(2); }), ::testing::HasSubstr("out of range"));
  auto subset = mesh({2}, {3, 1});
  if (r == 0 || r == 2) EXPECT_THAT(error_of([&] { subset->local_rank(); }), ::testing::HasSubstr("is not part of"));
  else EXPECT_EQ(subset->local_rank(), r == 3 ? 0 : 1);
}

}  // namespace
}  // namespace dtensor::testing
