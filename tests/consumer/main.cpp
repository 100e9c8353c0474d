// Uses dtensor's headers, its library and LibTorch through the installed CMake package.
#include <dtensor/redistribute_plan.h>
#include <dtensor/spec.h>

#include <iostream>

int main() {
  using namespace dtensor;
  const auto plan = plan_redistribute({8, 4}, c10::elementSize(c10::ScalarType::Float), {4}, {0}, {Shard(0)}, {Replicate()});
  const std::string expected = "S(0) -> R: all-gather on dim 0 (96 B/rank)";
  std::cout << plan.str() << std::endl;
  return plan.str() == expected ? 0 : 1;
}
