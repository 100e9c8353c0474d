// DeviceMesh over real process groups (the launcher's backend): coordinates, per-dim groups, slicing, subsets, errors.

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "harness.h"

namespace dtensor::testing {
namespace {

// Sum of `value` over the group along mesh dim `dim`: proves the group holds the right ranks.
int64_t sum_over(const DeviceMesh& m, int64_t dim, int64_t value) {
  std::vector<at::Tensor> t{at::full({1}, value, at::kLong)};
  m.group(dim)->allreduce(t)->wait();
  return t[0].item<int64_t>();
}

class MeshTest : public DistTest {};

TEST_F(MeshTest, TwoByTwoMeshCoordinatesAndGroups) {
  auto m = mesh({2, 2}, {}, {"dp", "tp"});
  const int64_t r = world()->rank();
  EXPECT_EQ(m->ndim(), 2);
  EXPECT_EQ(m->size(), 4);
  EXPECT_EQ(m->size(1), 2);
  EXPECT_EQ(m->shape(), (Shape{2, 2}));
  ASSERT_TRUE(m->coordinate().has_value());
  EXPECT_EQ(*m->coordinate(), (Shape{r / 2, r % 2}));
  EXPECT_EQ(m->group(0)->getSize(), 2);
  EXPECT_EQ(m->group(1)->getRank(), r % 2);
  // dp groups ranks {0,2} and {1,3}; tp groups {0,1} and {2,3}.
  EXPECT_EQ(sum_over(*m, 0, r), (r % 2) + (r % 2 + 2));
  EXPECT_EQ(sum_over(*m, 1, r), 2 * (r / 2) * 2 + 1);
  EXPECT_EQ(m->str(), "DeviceMesh([[0, 1], [2, 3]], names=(dp, tp))");
}

TEST_F(MeshTest, SlicingByNameReusesGroups) {
  auto m = mesh({2, 2}, {}, {"dp", "tp"});
  const int64_t r = world()->rank();
  auto tp = (*m)["tp"];
  EXPECT_EQ(tp->ndim(), 1);
  EXPECT_EQ(tp->ranks(), (std::vector<int64_t>{2 * (r / 2), 2 * (r / 2) + 1}));
  EXPECT_EQ(tp->dim_names(), (std::vector<std::string>{"tp"}));
  EXPECT_EQ(tp->group(0).get(), m->group(1).get());
  EXPECT_EQ(sum_over(*tp, 0, 1), 2);

  auto swapped = m->slice({"tp", "dp"});
  EXPECT_EQ(swapped->ranks(), (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(*swapped->coordinate(), (Shape{r % 2, r / 2}));
  EXPECT_EQ(swapped->group(0).get(), m->group(1).get());
}

TEST_F(MeshTest, ThreeDimMeshSliceKeepsTwoDims) {
  auto m = mesh({2, 1, 2}, {}, {"pp", "dp", "tp"});
  const int64_t r = world()->rank();
  auto sub = m->slice({"pp", "tp"});
  EXPECT_EQ(sub->shape(), (Shape{2, 2}));
  EXPECT_EQ(sub->ranks(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(*sub->coordinate(), (Shape{r / 2, r % 2}));
  EXPECT_EQ(sum_over(*sub, 0, r), (r % 2) * 2 + 2);
}

TEST_F(MeshTest, MeshOverASubsetOfRanks) {
  auto m = mesh({2}, {3, 1});
  const int64_t r = world()->rank();
  if (r == 0 || r == 2) {
    EXPECT_FALSE(m->coordinate().has_value());
    EXPECT_THROW(m->group(0), DTensorError);
    return;
  }
  EXPECT_EQ(*m->coordinate(), (Shape{r == 3 ? 0 : 1}));
  EXPECT_EQ(m->group(0)->getRank(), r == 3 ? 0 : 1);
  EXPECT_EQ(sum_over(*m, 0, r), 4);
}

TEST_F(MeshTest, ExplicitRankArray) {
  auto m = mesh({2, 2}, {3, 2, 1, 0});
  const int64_t r = world()->rank();
  const int64_t flat = 3 - r;
  EXPECT_EQ(*m->coordinate(), (Shape{flat / 2, flat % 2}));
  EXPECT_EQ(m->global_rank_at({0, 1}), 2);
}


TEST_F(MeshTest, MeshConstructionErrors) {
  auto w = world();
  EXPECT_THAT(error_of([&] { DeviceMesh::create(w, {3}); }), ::testing::HasSubstr("world has 4"));
  EXPECT_THAT(error_of([&] { DeviceMesh::create(w, {2}, {0, 1, 2}); }), ::testing::HasSubstr("do not fill"));
  EXPECT_THAT(error_of([&] { DeviceMesh::create(w, {2}, {1, 1}); }), ::testing::HasSubstr("more than once"));
  EXPECT_THAT(error_of([&] { DeviceMesh::create(w, {2}, {0, 7}); }), ::testing::HasSubstr("rank 7 is not in the world"));
  EXPECT_THAT(error_of([&] { DeviceMesh::create(w, {2, 2}, MeshOptions{{"a", "a"}}); }),
              ::testing::HasSubstr("unique"));
  EXPECT_THAT(error_of([&] { DeviceMesh::create(w, {2, 2}, MeshOptions{{"a"}}); }),
              ::testing::HasSubstr("one name per dim"));
  auto m = mesh({2, 2}, {}, {"dp", "tp"});
  EXPECT_THAT(error_of([&] { (*m)["pp"]; }), ::testing::HasSubstr("its dims are: dp, tp"));
  EXPECT_THAT(error_of([&] { m->slice({"tp", "tp"}); }), ::testing::HasSubstr("repeated"));
  EXPECT_THAT(error_of([&] { (*mesh({4}))["tp"]; }), ::testing::HasSubstr("no dim names"));
}

}  // namespace
}  // namespace dtensor::testing
