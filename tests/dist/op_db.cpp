#include "op_db.h"

#include <ATen/core/grad_mode.h>

#include <map>
#include <set>
#include <sstream>

#include "dtensor/comm_debug.h"
#include "dtensor/sharding.h"

namespace dtensor::testing {
namespace {

std::vector<OpSample>& samples() {
  static std::vector<OpSample> s;
  return s;
}

at::Tensor make(const OpSample& sample, size_t i) {
  return sample.make_input ? sample.make_input(i, sample.shapes[i]) : test_tensor(sample.shapes[i], at::kDouble, 100 + i);
}

std::vector<Placement> candidates(const OpSample& sample, size_t i) {
  if (!sample.placements.empty()) return sample.placements[i];
  std::vector<Placement> out = {Replicate()};
  for (int64_t d = 0; d < static_cast<int64_t>(sample.shapes[i].size()); ++d) out.push_back(Shard(d));
  return out;
}

// Every choice of one placement per (input, mesh dim).
std::vector<std::vector<Placements>> combinations(const OpSample& sample, int64_t mesh_ndim) {
  std::vector<std::vector<Placements>> out = {std::vector<Placements>(sample.shapes.size())};
  for (size_t i = 0; i < sample.shapes.size(); ++i)
    for (int64_t m = 0; m < mesh_ndim; ++m) {
      std::vector<std::vector<Placements>> next;
      for (const auto& partial : out)
        for (const auto& p : candidates(sample, i)) {
          auto c = partial;
          c[i].push_back(p);
          next.push_back(std::move(c));
        }
      out = std::move(next);
    }
  return out;
}

bool floating(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

::testing::AssertionResult same_values(const at::Tensor& actual, const at::Tensor& expected, const OpSample& sample) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  if (actual.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << " != expected " << expected.scalar_type();
  const bool ok = floating(expected) ? at::allclose(actual, expected, sample.rtol, sample.atol, /*equal_nan=*/true)
                                     : at::equal(actual, expected);
  if (!ok) return ::testing::AssertionFailure() << "values differ:\n" << actual << "\nexpected\n" << expected;
  return ::testing::AssertionSuccess();
}

at::Tensor sum_of_floating(const std::vector<at::Tensor>& outs) {
  at::Tensor loss;
  for (const auto& o : outs) {
    if (!floating(o) || !o.requires_grad()) continue;
    loss = loss.defined() ? loss + o.sum() : o.sum();
  }
  return loss;
}

// One sample with one placement per input and mesh dim, against the single-device call. Every rank
// runs every collective (gathering all outputs and gradients) before comparing, so a mismatch seen
// by some ranks cannot leave the others waiting in a collective.
::testing::AssertionResult check(const OpSample& sample, const MeshPtr& mesh, const std::vector<Placements>& placements) {
  std::vector<at::Tensor> full, dist;
  for (size_t i = 0; i < sample.shapes.size(); ++i) {
    at::Tensor t = make(sample, i);
    const bool grad = sample.backward && floating(t) && (sample.differentiable.empty() || sample.differentiable[i]);
    full.push_back(t.clone().requires_grad_(grad));
    dist.push_back(distribute_tensor(t.clone().requires_grad_(grad), mesh, placements[i]));
  }
  const auto expected = sample.run(full);
  if (!sample.expect_error.empty()) {
    try {
      sample.run(dist);
    } catch (const DTensorError& e) {
      if (std::string(e.what()).find(sample.expect_error) != std::string::npos) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure() << "wrong error: " << e.what();
    }
    return ::testing::AssertionFailure() << "expected a DTensorError containing '" << sample.expect_error << "'";
  }
  const auto actual = sample.run(dist);
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "different number of outputs";
  for (size_t k = 0; k < actual.size(); ++k)
    if (!is_dtensor(actual[k])) return ::testing::AssertionFailure() << "output " << k << " is not a DTensor";

  std::vector<at::Tensor> gathered;
  {
    at::NoGradGuard no_grad;
    for (const auto& a : actual) gathered.push_back(full_tensor(a));
  }
  std::vector<at::Tensor> gathered_grads(full.size());
  if (sample.backward) {
    at::Tensor loss = sum_of_floating(expected), dist_loss = sum_of_floating(actual);
    if (loss.defined()) {
      loss.backward();
      dist_loss.backward();
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < dist.size(); ++i)
        if (dist[i].requires_grad() && dist[i].grad().defined() && is_dtensor(dist[i].grad()))
          gathered_grads[i] = full_tensor(dist[i].grad());
    }
  }

  for (size_t k = 0; k < actual.size(); ++k) {
    auto r = same_values(gathered[k], expected[k], sample);
    if (!r) return r << " (output " << k << ", placements " << to_string(placements_of(actual[k])) << ")";
  }
  for (size_t i = 0; i < full.size(); ++i) {
    // Zero gradients that autograd makes with _efficientzerotensor (sgn, floor, ...) are plain
    // tensors, as no DTensor input reaches that factory: only their values can be compared.
    if (!full[i].requires_grad() || (full[i].grad().defined() && full[i].grad()._is_zerotensor())) continue;
    if (full[i].grad().defined() != gathered_grads[i].defined())
      return ::testing::AssertionFailure() << "gradient of input " << i << " defined on one side only";
    if (!full[i].grad().defined()) continue;
    auto r = same_values(gathered_grads[i], full[i].grad(), sample);
    if (!r) return r << " (gradient of input " << i << ")";
  }
  return ::testing::AssertionSuccess();
}

// On the 1-d mesh every combination runs. On the 2x2 mesh they multiply (9^3 for three 2-d inputs):
// an evenly spaced subset keeps the suite's time bounded while still mixing every kind of placement.
constexpr size_t kMaxTwoDimCombinations = 48;

template <typename T>
std::vector<T> spread(std::vector<T> all, size_t limit) {
  if (all.size() <= limit) return all;
  std::vector<T> out;
  for (size_t i = 0; i < limit; ++i) out.push_back(std::move(all[i * all.size() / limit]));
  return out;
}

class OpSampleTest : public DistTest {
 public:
  explicit OpSampleTest(const OpSample& sample) : sample_(sample) {}
  void TestBody() override {
    std::vector<MeshPtr> meshes = {mesh({4})};
    if (sample_.two_d) meshes.push_back(mesh({2, 2}));
    int failures = 0;
    for (const auto& m : meshes) {
      auto all = combinations(sample_, m->ndim());
      if (m->ndim() > 1) all = spread(std::move(all), kMaxTwoDimCombinations);
      for (const auto& placements : all) {
        ::testing::AssertionResult r = ::testing::AssertionFailure();
        try {
          r = check(sample_, m, placements);
        } catch (const std::exception& e) {
          r = ::testing::AssertionFailure() << "threw: " << e.what();
        }
        if (r) continue;
        std::string where;
        for (const auto& p : placements) where += "(" + to_string(p) + ") ";
        if (failures++ < 30) ADD_FAILURE() << sample_.name << " on " << m->str() << " with inputs " << where << ": " << r.message();
      }
    }
  }

 private:
  const OpSample& sample_;
};

// Runs every sample once (all inputs Replicate) under CommDebugMode and records the ops it dispatched.
std::map<std::string, std::set<std::string>> ops_exercised() {
  std::map<std::string, std::set<std::string>> by_op;
  for (const auto& sample : samples()) {
    CommDebugMode debug;
    try {
      check(sample, mesh({4}), std::vector<Placements>(sample.shapes.size(), Placements{Replicate()}));
    } catch (const std::exception&) {
      // the sample's own test reports it
    }
    for (const auto& op : debug.ops()) by_op[op].insert(sample.name);
  }
  return by_op;
}

class OpDbCoverageTest : public DistTest {
 public:
  void TestBody() override {
    const auto exercised = ops_exercised();
    std::ostringstream table;
    std::vector<std::string> missing;
    table << "op-db coverage: op | samples that dispatch it\n";
    for (const auto& op : ops_with_sharding_rules()) {
      if (op.rfind("aten::", 0) != 0) continue;  // custom ops registered by tests have their own tests
      auto it = exercised.find(op);
      table << "  " << op << " | " << (it == exercised.end() ? 0 : it->second.size()) << "\n";
      if (it == exercised.end()) missing.push_back(op);
    }
    if (world()->rank() == 0) std::cout << table.str();
    std::string list;
    for (const auto& m : missing) list += " " + m;
    EXPECT_TRUE(missing.empty()) << missing.size() << " op(s) with a sharding rule have no op-db sample:" << list;
  }
};

}  // namespace

bool add_op_samples(std::vector<OpSample> more) {
  for (auto& s : more) samples().push_back(std::move(s));
  return true;
}

const std::vector<OpSample>& op_samples() { return samples(); }

void register_op_db_tests() {
  for (const auto& sample : samples()) {
    ::testing::RegisterTest("OpDb", sample.name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [&sample]() -> DistTest* { return new OpSampleTest(sample); });
  }
  ::testing::RegisterTest("OpDb", "Coverage", nullptr, nullptr, __FILE__, __LINE__,
                          []() -> DistTest* { return new OpDbCoverageTest(); });
}

}  // namespace dtensor::testing
