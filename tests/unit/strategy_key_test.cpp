// The key under which graph expansion shares one node's sharding strategies with every node that asks
// the same question (src/graph/strategy_key.h): calls that differ in anything a rule reads get
// different keys, and arguments the key cannot spell leave the node uncached.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <gmock/gmock.h>

#include "../../src/graph/strategy_key.h"

namespace dtensor::testing {
namespace {

using dtensor::graph::detail::strategy_key;

const c10::OperatorHandle& add_op() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  return op;
}

at::Tensor meta(std::vector<int64_t> shape) { return at::empty(shape, at::TensorOptions().device(at::kMeta)); }

std::optional<std::string> key_of(const std::vector<c10::IValue>& args, const Placements& a, const Placements& b,
                                  const std::vector<Placements>* possible = nullptr) {
  return strategy_key(add_op(), args, {&a, &b}, possible);
}

TEST(StrategyKeyTest, EqualCallsShareAKey) {
  const Placements s0{Shard(0)}, r{Replicate()};
  const auto first = key_of({meta({4, 8}), meta({4, 8}), 1.0}, s0, r);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first, key_of({meta({4, 8}), meta({4, 8}), 1.0}, s0, r));
}

TEST(StrategyKeyTest, AnythingARuleReadsChangesTheKey) {
  const Placements s0{Shard(0)}, s1{Shard(1)}, r{Replicate()};
  const auto base = key_of({meta({4, 8}), meta({4, 8}), 1.0}, s0, r);
  // shape, strides, dtype of a tensor
  EXPECT_NE(base, key_of({meta({4, 9}), meta({4, 8}), 1.0}, s0, r));
  EXPECT_NE(base, key_of({meta({8, 4}).t(), meta({4, 8}), 1.0}, s0, r));
  EXPECT_NE(base, key_of({meta({4, 8}).to(at::kDouble), meta({4, 8}), 1.0}, s0, r));
  // a constant, to its last bit, and its type
  EXPECT_NE(base, key_of({meta({4, 8}), meta({4, 8}), std::nextafter(1.0, 2.0)}, s0, r));
  EXPECT_NE(base, key_of({meta({4, 8}), meta({4, 8}), int64_t{1}}, s0, r));
  // the value of a wrapped number (a real 0-d tensor)
  EXPECT_NE(key_of({meta({4, 8}), at::scalar_tensor(2.0), 1.0}, s0, r), key_of({meta({4, 8}), at::scalar_tensor(3.0), 1.0}, s0, r));
  // the inputs' placements, and the placements the input may take
  EXPECT_NE(base, key_of({meta({4, 8}), meta({4, 8}), 1.0}, s1, r));
  const std::vector<Placements> possible{s0, s1};
  EXPECT_NE(base, key_of({meta({4, 8}), meta({4, 8}), 1.0}, s0, r, &possible));
  // lists, strings and None
  EXPECT_NE(key_of({std::vector<int64_t>{1, 2}}, s0, r), key_of({std::vector<int64_t>{12}}, s0, r));
  EXPECT_NE(key_of({std::string("ab"), std::string("c")}, s0, r), key_of({std::string("a"), std::string("bc")}, s0, r));
  EXPECT_NE(key_of({c10::IValue()}, s0, r), key_of({false}, s0, r));
}

TEST(StrategyKeyTest, ArgumentsItCannotSpellLeaveTheNodeUncached) {
  const Placements r{Replicate()};
  c10::Dict<std::string, int64_t> dict;
  dict.insert("k", 1);
  EXPECT_FALSE(key_of({c10::IValue(dict)}, r, r).has_value());
  // a real tensor that is not one real number: its values would be part of the call
  EXPECT_FALSE(key_of({meta({4, 8}), at::ones({2})}, r, r).has_value());
  EXPECT_FALSE(key_of({meta({4, 8}), at::ones({0})}, r, r).has_value());
  EXPECT_FALSE(key_of({meta({4, 8}), at::scalar_tensor(c10::complex<double>(1, 2), at::kComplexDouble)}, r, r).has_value());
}

}  // namespace
}  // namespace dtensor::testing
