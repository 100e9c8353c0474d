#pragma once
// How autograd nodes are held: c10::intrusive_ptr from LibTorch 2.15 on, std::shared_ptr before (the
// GPU machines' LibTorch 2.11). Edge::function names whichever this LibTorch uses, so dtensor's own
// nodes are made and passed through these two names only.

#include <torch/csrc/autograd/edge.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace dtensor::detail {

using NodePtr = decltype(torch::autograd::Edge::function);

template <class NodeType, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>)
    return std::make_shared<NodeType>(std::forward<Args>(args)...);
  else
    return c10::make_intrusive<NodeType>(std::forward<Args>(args)...);
}

}  // namespace dtensor::detail
