// copy_to_bytes and packed_back_to_back against ATen's contiguous(): every layout a redistribution
// cuts (blocks along each dim of a contiguous tensor), and the layouts the row copy must refuse.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "../../src/mesh/packing.h"

namespace dtensor::detail {
namespace {

// `t` copied by copy_to_bytes, as a contiguous tensor of t's shape.
at::Tensor through_bytes(const at::Tensor& t) {
  at::Tensor out = at::full(t.sizes(), -1, t.options());
  copy_to_bytes(t, out.data_ptr());
  return out;
}

void expect_copied(const at::Tensor& t, const char* what) {
  EXPECT_TRUE(at::equal(through_bytes(t), t.contiguous())) << what << " sizes " << t.sizes() << " strides " << t.strides();
}

TEST(PackingTest, EveryBlockOfEveryDimCopiesAsATenDoes) {
  const at::Tensor x = at::arange(5 * 7 * 33, at::kFloat).view({5, 7, 33});
  for (int64_t dim = 0; dim < x.dim(); ++dim)
    for (int64_t pieces : {2, 3, 4})
      for (const at::Tensor& block : x.chunk(pieces, dim)) expect_copied(block, "torch.chunk block");
  const at::Tensor wide = at::arange(9 * 1000, at::kDouble).view({9, 1000});
  for (const at::Tensor& block : wide.chunk(3, 1)) expect_copied(block, "rows of 2.6 kB");
  expect_copied(wide.narrow(0, 2, 5).narrow(1, 100, 300), "narrowed on both dims");
  expect_copied(x.unsqueeze(1).narrow(3, 4, 20), "a size-1 dim between rows");
  expect_copied(x, "contiguous");
}

TEST(PackingTest, LayoutsThatAreNotEvenlySpacedRowsStillCopy) {
  const at::Tensor x = at::arange(6 * 8 * 40, at::kFloat).view({6, 8, 40});
  expect_copied(x.transpose(0, 2), "transposed");
  expect_copied(x.narrow(1, 0, 4).narrow(2, 0, 32), "two levels of spacing");
  expect_copied(x.narrow(2, 0, 3), "rows shorter than a memcpy is worth");
  expect_copied(at::arange(64, at::kFloat).expand({3, 64}), "expanded (stride 0)");
  expect_copied(x.narrow(0, 0, 0), "empty");
  expect_copied(at::arange(12, at::kLong).view({3, 4}).narrow(1, 1, 2), "int64");
}

TEST(PackingTest, PackedBackToBackIsThePiecesInOrder) {
  const at::Tensor x = at::randn({11, 50});
  const std::vector<at::Tensor> pieces = x.chunk(4, 1);
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : pieces) flat.push_back(p.reshape({-1}));
  EXPECT_TRUE(at::equal(packed_back_to_back(pieces), at::cat(flat)));
}

TEST(PackingTest, PiecesAlreadyBackToBackAreSentFromTheirOwnMemory) {
  const at::Tensor x = at::randn({10, 3});
  const at::Tensor packed = packed_back_to_back(x.chunk(4, 0));
  EXPECT_EQ(packed.data_ptr(), x.data_ptr()) << "a contiguous tensor cut along dim 0 needs no copy";
  EXPECT_TRUE(at::equal(packed, x.view({-1})));
  EXPECT_FALSE(back_to_back({x.narrow(0, 0, 2), x.narrow(0, 3, 2)}).has_value()) << "a gap";
  EXPECT_FALSE(back_to_back({x.narrow(0, 2, 2), x.narrow(0, 0, 2)}).has_value()) << "out of order";
  EXPECT_FALSE(back_to_back({x.narrow(0, 0, 2), at::randn({2, 3})}).has_value()) << "another storage";
}

}  // namespace
}  // namespace dtensor::detail
