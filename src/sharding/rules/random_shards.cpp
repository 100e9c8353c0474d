#include "random_shards.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <cmath>
#include <limits>
#include <unordered_map>

#include "../registry.h"
#include "dtensor/errors.h"

namespace dtensor::rules {

uint64_t draw_key(const std::optional<at::Generator>& generator, c10::Device device) {
  // random_ on int64 draws uniformly from [0, 2^63), through the generator's own lock.
  const at::Tensor key = at::empty({}, at::TensorOptions(at::kLong).device(device)).random_(generator);
  return static_cast<uint64_t>(key.item<int64_t>());
}

namespace {

// 52 random bits as a double in the open interval (0, 1): (bits + 1/2) / 2^52 is exact, never 0 or 1,
// so log and tan of it stay finite.
double open_unit(uint32_t high, uint32_t low) {
  const uint64_t bits = (static_cast<uint64_t>(high) << 20) | (low >> 12);
  return (static_cast<double>(bits) + 0.5) * 0x1p-52;
}

}  // namespace

Variates::Variates(uint64_t key, Shape global_shape, LocalLayout part, c10::Device device)
    : key_(key), global_shape_(std::move(global_shape)), part_(std::move(part)), device_(device) {}

std::vector<at::Tensor> Variates::uniform(int count) const {
  std::vector<at::Tensor> out;
  for (int c = 0; c < count; ++c) out.push_back(at::empty(part_.shape, at::kDouble));
  double* first = out[0].data_ptr<double>();
  double* second = count > 1 ? out[1].data_ptr<double>() : nullptr;
  const Shape global_stride = contiguous_strides(global_shape_);
  const auto ndim = static_cast<int64_t>(part_.shape.size());
  at::parallel_for(0, numel(part_.shape), 4096, [&](int64_t begin, int64_t end) {
    // The part's element `begin` (row-major in the part): its index in the part and in the whole.
    Shape index(ndim);
    int64_t global = 0;
    for (int64_t d = ndim - 1, rest = begin; d >= 0; --d) {
      index[d] = rest % part_.shape[d];
      rest /= part_.shape[d];
      global += (part_.offset[d] + index[d]) * global_stride[d];
    }
    for (int64_t i = begin; i < end; ++i) {
      at::Philox4_32 block(key_, static_cast<uint64_t>(global));
      const uint32_t w0 = block(), w1 = block(), w2 = block(), w3 = block();
      first[i] = open_unit(w0, w1);
      if (second != nullptr) second[i] = open_unit(w2, w3);
      for (int64_t d = ndim - 1; d >= 0; --d) {  // on to the next element
        global += global_stride[d];
        if (++index[d] < part_.shape[d]) break;
        global -= part_.shape[d] * global_stride[d];
        index[d] = 0;
      }
    }
  });
  if (device_ != c10::Device(at::kCPU))
    for (auto& t : out) t = t.to(device_);
  return out;
}

at::Tensor Variates::standard_normal() const {
  auto u = uniform(2);
  return u[0].log_().mul_(-2).sqrt_().mul_(u[1].mul_(2 * M_PI).cos_());
}

at::Tensor Variates::part_of(const at::Tensor& whole) const {
  // Broadcasting aligns trailing dims; a dim of size 1 is read whole by every element.
  const int64_t lead = static_cast<int64_t>(global_shape_.size()) - whole.dim();
  at::Tensor part = whole;
  for (int64_t d = 0; d < whole.dim(); ++d)
    if (whole.size(d) != 1) part = part.narrow(d, part_.offset[lead + d], part_.shape[lead + d]);
  return part;
}

namespace {

// ---- each op's values from the variates (doubles; the caller casts them to the output dtypes) -------
// Scalar parameters were checked by LibTorch itself (see check_arguments in random.cpp); tensor
// parameters are checked here, as LibTorch checks them.

using Args = c10::ArrayRef<c10::IValue>;

// A parameter given as a number or as a tensor (already cut to the part).
at::Tensor parameter(const c10::IValue& v) {
  return v.isTensor() ? v.toTensor().to(at::kDouble) : at::scalar_tensor(v.toDouble(), at::kDouble);
}

// Variates in [from, to) rounded down to the precision of `dtype` (as many bits as LibTorch's uniform_
// draws), so that `to` itself is never drawn.
at::Tensor uniform_in(const Variates& v, c10::ScalarType dtype, double from, double to) {
  int digits = 52;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "uniform_",
                                  [&] { digits = std::min(digits, std::numeric_limits<scalar_t>::digits); });
  const double grid = std::ldexp(1.0, digits);
  return v.uniform(1)[0].mul_(grid).floor_().div_(grid).mul_(to - from).add_(from);
}

// uniform_(self, from, to), uniform(self, from, to)
std::vector<at::Tensor> uniform(const Variates& v, Args args) {
  return {uniform_in(v, args[0].toTensor().scalar_type(), args[1].toDouble(), args[2].toDouble())};
}

// rand_like(self, dtype, ...) and rand_like.generator(self, generator, dtype, ...): [0, 1) at the
// output dtype's precision (self's where none is given).
template <size_t kDtypeArg>
std::vector<at::Tensor> rand_like(const Variates& v, Args args) {
  const c10::IValue& dtype = args[kDtypeArg];
  return {uniform_in(v, dtype.isNone() ? args[0].toTensor().scalar_type() : dtype.toScalarType(), 0, 1)};
}

std::vector<at::Tensor> randn_like(const Variates& v, Args) { return {v.standard_normal()}; }

at::Tensor normal_at(const Variates& v, const c10::IValue& mean, const c10::IValue& std) {
  if (std.isTensor() && std.toTensor().lt(0).any().item<bool>())
    throw DTensorError("normal expects all elements of std >= 0.0");
  return v.standard_normal().mul_(parameter(std)).add_(parameter(mean));
}

// normal_(self, mean, std)
std::vector<at::Tensor> normal_fill(const Variates& v, Args args) { return {normal_at(v, args[1], args[2])}; }
// normal(mean, std) with either or both a tensor
std::vector<at::Tensor> normal(const Variates& v, Args args) { return {normal_at(v, args[0], args[1])}; }

// bernoulli_(self, p), bernoulli(self, p): p a number or a tensor of probabilities.
std::vector<at::Tensor> bernoulli(const Variates& v, Args args) {
  const at::Tensor p = parameter(args[1]);
  if (args[1].isTensor() && (p.lt(0).any().item<bool>() || p.gt(1).any().item<bool>()))
    throw DTensorError("bernoulli expects every element of p in [0, 1]");
  return {v.uniform(1)[0].lt(p)};
}

// bernoulli(self): self holds the probabilities.
std::vector<at::Tensor> bernoulli_of_self(const Variates& v, Args args) {
  const c10::IValue with_p[] = {args[0], args[0]};
  return bernoulli(v, with_p);
}

// The inverse distribution functions of one variate.
std::vector<at::Tensor> exponential(const Variates& v, Args args) {
  return {v.uniform(1)[0].log_().div_(-args[1].toDouble())};
}
std::vector<at::Tensor> cauchy(const Variates& v, Args args) {
  return {v.uniform(1)[0].sub_(0.5).mul_(M_PI).tan_().mul_(args[2].toDouble()).add_(args[1].toDouble())};
}
std::vector<at::Tensor> log_normal(const Variates& v, Args args) { return {normal_at(v, args[1], args[2]).exp_()}; }
std::vector<at::Tensor> geometric(const Variates& v, Args args) {
  // log(u) < 0 for u in (0, 1), so every value is at least 1.
  return {v.uniform(1)[0].log_().div_(std::log1p(-args[1].toDouble())).ceil_()};
}

// native_dropout(input, p, train) in training: the mask keeps an element with probability 1 - p, and
// the output is computed as LibTorch's kernel computes it (ATen/native/Dropout.cpp).
std::vector<at::Tensor> dropout(const Variates& v, Args args) {
  const double keep = 1 - args[1].toDouble();
  if (!(keep >= 0 && keep <= 1)) throw DTensorError("native_dropout expects p in [0, 1], got " + std::to_string(1 - keep));
  const at::Tensor mask = v.uniform(1)[0].lt(keep);
  return {args[0].toTensor().mul(mask).mul_(keep == 0 ? 0 : 1 / keep), mask};
}

}  // namespace

ShardDraw shard_draw(const c10::OperatorName& op) {
  static const std::unordered_map<std::string, ShardDraw> draws = {
      {"aten::uniform_", uniform},           {"aten::normal_", normal_fill},
      {"aten::normal.Tensor_Tensor", normal}, {"aten::normal.Tensor_float", normal},
      {"aten::normal.float_Tensor", normal},  {"aten::bernoulli_.float", bernoulli},
      {"aten::bernoulli_.Tensor", bernoulli}, {"aten::bernoulli.p", bernoulli},
      {"aten::exponential_", exponential},   {"aten::cauchy_", cauchy},
      {"aten::log_normal_", log_normal},     {"aten::geometric_", geometric},
      {"aten::native_dropout", dropout},
      // The functional forms take the in-place forms' arguments.
      {"aten::uniform", uniform},            {"aten::normal_functional", normal_fill},
      {"aten::bernoulli.Tensor", bernoulli}, {"aten::bernoulli", bernoulli_of_self},
      {"aten::exponential", exponential},    {"aten::cauchy", cauchy},
      {"aten::log_normal", log_normal},      {"aten::geometric", geometric},
      {"aten::rand_like", rand_like<1>},     {"aten::rand_like.generator", rand_like<2>},
      {"aten::randn_like", randn_like},      {"aten::randn_like.generator", randn_like}};
  const auto it = draws.find(detail::qualified_name(op));
  return it == draws.end() ? nullptr : it->second;
}

}  // namespace dtensor::rules
