// Samples for random ops: every call seeds the default generator first, so the DTensor call must draw
// exactly what the single-device call draws, whatever the placements.

#include <ATen/CPUGeneratorImpl.h>

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// Calls `draw` right after seeding the default generator (as every rank does alike).
template <typename Draw>
std::function<std::vector<at::Tensor>(In)> seeded(Draw draw) {
  return [draw](In x) {
    at::manual_seed(1234);
    return draw(x);
  };
}

// Values in (0, 1), distinct per element: probabilities and standard deviations.
at::Tensor probabilities(size_t, const Shape& shape) {
  const int64_t n = numel(shape);
  return ((at::arange(n, at::kDouble) + 0.5) / n).reshape(shape);
}

// A gradient, then a dropout mask (every third element dropped).
at::Tensor grad_and_mask(size_t i, const Shape& shape) {
  if (i == 0) return test_tensor(shape, at::kDouble, 7);
  return (at::arange(numel(shape)) % 3 != 0).reshape(shape);
}

// A generator of the call's own, made alike on every rank (the *.generator overloads).
at::Generator own_generator() { return at::detail::createCPUGenerator(99); }

// Rows of positive weights for multinomial.
at::Tensor weights(size_t, const Shape& shape) { return probabilities(0, shape) + 0.1; }

// Every sample also runs on the 2x2 mesh.
OpSample sample(std::string name, std::vector<Shape> shapes, std::function<std::vector<at::Tensor>(In)> run) {
  OpSample s{std::move(name), std::move(shapes), std::move(run)};
  s.two_d = true;
  return s;
}

OpSample with_input(OpSample s, std::function<at::Tensor(size_t, const Shape&)> make) {
  s.make_input = std::move(make);
  return s;
}

// For ops whose gradient LibTorch does not implement.
OpSample forward_only(OpSample s) {
  s.backward = false;
  return s;
}

const bool random_samples_registered = add_op_samples({
    sample("uniform_", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).uniform_(-1, 2)); })),
    sample("normal_", {{7, 5}}, seeded([](In x) { return outputs(at::empty_like(x[0]).normal_(1, 2)); })),
    sample("bernoulli_float", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).bernoulli_(0.3)); })),
    forward_only(sample("bernoulli_p", {{5, 3}}, seeded([](In x) { return outputs(at::bernoulli(x[0], 0.6)); }))),
    sample("exponential_", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).exponential_(2)); })),
    sample("cauchy_", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).cauchy_(1, 2)); })),
    sample("log_normal_", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).log_normal_(0, 0.5)); })),
    sample("geometric_", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).geometric_(0.4)); })),
    sample("random_", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).random_()); })),
    sample("random_to", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).random_(10)); })),
    sample("random_from", {{5, 3}}, seeded([](In x) { return outputs(at::empty_like(x[0]).random_(-4, 10)); })),
    // Composites of empty_like and the ops above.
    sample("rand_like", {{5, 3}}, seeded([](In x) { return outputs(at::rand_like(x[0]) * x[0]); })),
    sample("randn_like", {{7}}, seeded([](In x) { return outputs(at::randn_like(x[0]) * x[0]); })),
    forward_only(sample("randint_like", {{5, 3}}, seeded([](In x) { return outputs(at::randint_like(x[0], 3, 9)); }))),
    // Functional forms of the fills, and the *_like overloads taking a generator.
    sample("uniform", {{5, 3}}, seeded([](In x) { return outputs(at::uniform(x[0], -1, 2) * x[0]); })),
    forward_only(sample("normal_functional", {{7, 5}}, seeded([](In x) { return outputs(at::normal_functional(x[0], 1, 2)); }))),
    sample("exponential", {{5, 3}}, seeded([](In x) { return outputs(at::exponential(x[0], 2)); })),
    sample("cauchy", {{5, 3}}, seeded([](In x) { return outputs(at::cauchy(x[0], 1, 2)); })),
    sample("log_normal", {{5, 3}}, seeded([](In x) { return outputs(at::log_normal(x[0], 0, 0.5)); })),
    sample("geometric", {{5, 3}}, seeded([](In x) { return outputs(at::geometric(x[0], 0.4)); })),
    sample("random", {{5, 3}}, seeded([](In x) {
             return outputs(at::random(x[0]), at::random(x[0], 10), at::random(x[0], -4, 10));
           })),
    sample("rand_like_generator", {{5, 3}}, seeded([](In x) { return outputs(at::rand_like(x[0], own_generator()) * x[0]); })),
    sample("randn_like_generator", {{7}}, seeded([](In x) { return outputs(at::randn_like(x[0], own_generator()) * x[0]); })),
    forward_only(sample("randint_like_high", {{5, 3}}, seeded([](In x) { return outputs(at::randint_like(x[0], 9)); }))),
    forward_only(sample("randint_like_generators", {{5, 3}}, seeded([](In x) {
                          return outputs(at::randint_like(x[0], 9, own_generator()), at::randint_like(x[0], 3, 9, own_generator()));
                        }))),
    // Rows of weights, drawn from whole: the samples of a row depend on all of its weights.
    forward_only(with_input(sample("multinomial", {{5, 4}}, seeded([](In x) {
                                     return outputs(at::multinomial(x[0], 3), at::multinomial(x[0], 6, true));
                                   })),
                            weights)),
    // rrelu in training draws each negative element's slope into noise (written in place, or returned).
    sample("rrelu_with_noise", {{5, 3}}, seeded([](In x) {
             at::Tensor noise = at::empty_like(x[0]);
             at::Tensor out = at::rrelu_with_noise(x[0], noise, 0.1, 0.3, true);
             return outputs(out, noise);
           })),
    sample("rrelu_with_noise_functional", {{5, 3}}, seeded([](In x) {
             auto [out, noise] = at::rrelu_with_noise_functional(x[0], at::zeros_like(x[0]), 0.1, 0.3, true);
             return outputs(out, noise);
           })),
    // Probability and parameter tensors: each element's draw reads its own parameter.
    with_input(sample("bernoulli_tensor", {{5, 3}}, seeded([](In x) { return outputs(at::bernoulli(x[0])); })),
               probabilities),
    with_input(sample("bernoulli_tensor_p", {{5, 3}, {5, 3}}, seeded([](In x) { return outputs(at::bernoulli(x[0], x[1])); })),
               probabilities),
    // The zero gradients of bernoulli_'s and normal's tensor parameters are at::zeros of their sizes:
    // plain tensors, compared by value.
    with_input(sample("bernoulli__tensor_broadcast", {{5, 3}, {3}},
                      seeded([](In x) { return outputs(at::empty_like(x[0]).bernoulli_(x[1])); })),
               probabilities),
    with_input(sample("normal_tensor_tensor", {{5, 3}, {5, 3}}, seeded([](In x) { return outputs(at::normal(x[0], x[1])); })),
               probabilities),
    with_input(sample("normal_tensor_tensor_broadcast", {{5, 3}, {3}},
                      seeded([](In x) { return outputs(at::normal(x[0], x[1])); })),
               probabilities),
    with_input(sample("normal_tensor_float", {{5, 3}}, seeded([](In x) { return outputs(at::normal(x[0], 0.5)); })),
               probabilities),
    with_input(sample("normal_float_tensor", {{5, 3}}, seeded([](In x) { return outputs(at::normal(2.0, x[0])); })),
               probabilities),
    // Dropout: native_dropout (and its backward, native_dropout_backward, through the gradient), and
    // dropout, which on CPU is empty_like + bernoulli_ + div_ + mul.
    sample("native_dropout", {{5, 3}}, seeded([](In x) {
             auto [out, mask] = at::native_dropout(x[0], 0.4, true);
             return outputs(out, mask);
           })),
    sample("native_dropout_eval", {{7}}, seeded([](In x) {
             auto [out, mask] = at::native_dropout(x[0], 0.4, false);
             return outputs(out, mask);
           })),
    sample("dropout", {{5, 3}}, seeded([](In x) { return outputs(at::dropout(x[0], 0.5, true)); })),
    with_input(sample("native_dropout_backward", {{5, 3}, {5, 3}},
                      [](In x) { return outputs(at::native_dropout_backward(x[0], x[1], 2.0)); }),
               grad_and_mask),
});

}  // namespace
}  // namespace dtensor::testing
