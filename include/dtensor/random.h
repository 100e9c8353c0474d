#pragma once
// How random ops (uniform_, normal_, bernoulli_, dropout, rand_like, dtensor::rand, ...) fill DTensors.
//
// RandomMode::Exact (the default): each rank draws the whole tensor with LibTorch's own generator and
// keeps its part, so a DTensor gets exactly what single-device LibTorch draws with the same seed, on
// any mesh and layout. Cost per rank: the time and memory of the whole tensor.
//
// RandomMode::LocalShards: each rank draws only its part, from a counter-based generator (Philox):
// every call takes one number from the op's generator (its Generator argument, else the default one of
// its device) as a key, and each element's value depends only on that key and the element's global
// index. Cost per rank: its shard's time and memory. For a given seed (at::manual_seed, on every rank
// alike) the global tensor is the same on any mesh, any world size and any layout, but it is not what
// single-device LibTorch draws. random_ (and so randint_like) and complex tensors draw in the exact
// mode whatever the mode.
//
// A call's mode: the innermost RandomModeGuard alive on the calling thread, else the process-wide mode,
// set by set_random_mode or else by the environment variable DTENSOR_RANDOM_MODE (exact or local).

namespace dtensor {

enum class RandomMode { Exact, LocalShards };

// The process-wide mode (what threads without a RandomModeGuard use).
void set_random_mode(RandomMode mode);
// The calling thread's mode.
RandomMode random_mode();

// Sets the calling thread's mode while alive.
class RandomModeGuard {
 public:
  explicit RandomModeGuard(RandomMode mode);
  ~RandomModeGuard();
  RandomModeGuard(const RandomModeGuard&) = delete;
  RandomModeGuard& operator=(const RandomModeGuard&) = delete;

 private:
  int previous_;  // the enclosing guard's mode, or -1 for none
};

}  // namespace dtensor
