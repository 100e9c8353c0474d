#include "op_db.h"

#include <ATen/core/grad_mode.h>

#include <set>

#include "../../src/sharding/eager_graph_form.h"
#include "dtensor/comm_debug.h"
#include "op_db_coverage.h"

namespace dtensor::testing {
namespace {

std::vector<OpSample>& samples() {
  static std::vector<OpSample> s;
  return s;
}

at::Tensor make(const OpSample& sample, size_t i) {
  return sample.make_input ? sample.make_input(i, sample.shapes[i]) : test_tensor(sample.shapes[i], at::kDouble, 100 + i);
}

// ---- the placements a sample runs with ------------------------------------------------------------

std::vector<Placement> base_candidates(const OpSample& sample, size_t i) {
  if (!sample.placements.empty()) return sample.placements[i];
  std::vector<Placement> out = {Replicate()};
  for (int64_t d = 0; d < static_cast<int64_t>(sample.shapes[i].size()); ++d) out.push_back(Shard(d));
  return out;
}

// Every choice of one base placement per (input, mesh dim).
std::vector<std::vector<Placements>> base_combinations(const OpSample& sample, int64_t mesh_ndim) {
  std::vector<std::vector<Placements>> out = {std::vector<Placements>(sample.shapes.size())};
  for (size_t i = 0; i < sample.shapes.size(); ++i)
    for (int64_t m = 0; m < mesh_ndim; ++m) {
      std::vector<std::vector<Placements>> next;
      for (const auto& partial : out)
        for (const auto& p : base_candidates(sample, i)) {
          auto c = partial;
          c[i].push_back(p);
          next.push_back(std::move(c));
        }
      out = std::move(next);
    }
  return out;
}

// Boolean tensors have no sums; every other input may arrive as a Partial value.
bool can_be_partial(const OpSample& sample, size_t i) {
  return sample.partial_inputs && make(sample, i).scalar_type() != at::kBool;
}

// Per input that can be Partial and per reduction: the input Partial on one mesh dim (the other
// dim Replicate or one of its base shardings) or on both; the other inputs Replicate, or Partial
// alike (which is what linear ops with several operands accept).
std::vector<std::vector<Placements>> partial_combinations(const OpSample& sample, int64_t mesh_ndim) {
  const size_t n = sample.shapes.size();
  std::set<std::string> seen;
  std::vector<std::vector<Placements>> out;
  auto add = [&](std::vector<Placements> c) {
    std::string key;
    for (const auto& p : c) key += to_string(p) + ";";
    if (seen.insert(key).second) out.push_back(std::move(c));
  };
  for (size_t i = 0; i < n; ++i) {
    if (!can_be_partial(sample, i)) continue;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      const Placement p = Partial(op);
      std::vector<Placements> patterns;
      if (mesh_ndim == 1) {
        patterns.push_back({p});
      } else {
        patterns.push_back({p, p});
        for (const Placement& b : base_candidates(sample, i)) {
          if (b.is_partial()) continue;
          patterns.push_back({p, b});
          patterns.push_back({b, p});
        }
      }
      for (const auto& pattern : patterns) {
        std::vector<Placements> alone(n, Placements(mesh_ndim, Replicate()));
        alone[i] = pattern;
        add(alone);
        if (n == 1) continue;
        std::vector<Placements> alike(n, Placements(mesh_ndim, Replicate()));
        for (size_t j = 0; j < n; ++j)
          if (j == i || can_be_partial(sample, j)) alike[j] = pattern;
        // A pattern with a shard fits only inputs with that dim.
        bool fits = true;
        for (size_t j = 0; j < n; ++j)
          for (const auto& q : alike[j]) fits = fits && (!q.is_shard() || q.dim() < static_cast<int64_t>(sample.shapes[j].size()));
        if (fits) add(alike);
      }
    }
  }
  return out;
}

std::string describe_inputs(const std::vector<Placements>& placements) {
  std::string where;
  for (const auto& p : placements) where += "(" + to_string(p) + ") ";
  return where;
}

// The smallest number of blocks (above one) a dim of `length` splits into, or 0 when it cannot.
int64_t smallest_split(int64_t length) {
  for (int64_t k = 2; k <= length; ++k)
    if (length % k == 0) return k;
  return 0;
}

// On the 1-d mesh, per input and per dim it may be sharded along: the input StridedShard there, the
// other inputs Replicate, or every input with a dim of that length at that position strided alike
// (what ops with several operands keep without moving any).
std::vector<std::vector<Placements>> strided_combinations(const OpSample& sample, int64_t mesh_ndim) {
  if (mesh_ndim != 1 || !sample.expect_error.empty()) return {};
  const size_t n = sample.shapes.size();
  std::set<std::string> seen;
  std::vector<std::vector<Placements>> out;
  auto add = [&](std::vector<Placements> c) {
    if (seen.insert(describe_inputs(c)).second) out.push_back(std::move(c));
  };
  for (size_t i = 0; i < n; ++i)
    for (const Placement& b : base_candidates(sample, i)) {
      if (!b.is_shard()) continue;
      const int64_t d = b.normalized(static_cast<int64_t>(sample.shapes[i].size())).dim();
      const int64_t length = sample.shapes[i][d], blocks = smallest_split(length);
      if (blocks == 0) continue;
      const Placement strided = StridedShard(d, blocks);
      std::vector<Placements> alone(n, {Replicate()}), alike(n, {Replicate()});
      alone[i] = alike[i] = {strided};
      for (size_t j = 0; j < n; ++j)
        if (static_cast<int64_t>(sample.shapes[j].size()) > d && sample.shapes[j][d] == length) alike[j] = {strided};
      add(alone);
      add(alike);
    }
  return out;
}

// On the 1-d mesh every combination runs. On the 2x2 mesh they multiply (9^3 for three 2-d inputs):
// an evenly spaced subset keeps the suite's time bounded while still mixing every kind of placement.
constexpr size_t kMaxTwoDimCombinations = 48;
constexpr size_t kMaxTwoDimPartialCombinations = 24;

template <typename T>
std::vector<T> spread(std::vector<T> all, size_t limit) {
  if (all.size() <= limit) return all;
  std::vector<T> out;
  for (size_t i = 0; i < limit; ++i) out.push_back(std::move(all[i * all.size() / limit]));
  return out;
}

std::vector<std::vector<Placements>> all_combinations(const OpSample& sample, int64_t mesh_ndim) {
  auto base = base_combinations(sample, mesh_ndim);
  auto partial = partial_combinations(sample, mesh_ndim);
  if (mesh_ndim > 1) {
    base = spread(std::move(base), kMaxTwoDimCombinations);
    partial = spread(std::move(partial), kMaxTwoDimPartialCombinations);
  }
  base.insert(base.end(), partial.begin(), partial.end());
  const auto strided = strided_combinations(sample, mesh_ndim);
  base.insert(base.end(), strided.begin(), strided.end());
  return base;
}

// ---- one run against the single-device call ------------------------------------------------------

// The error dispatch raises when an in-place op would have to move the tensor it writes to.
constexpr const char* kInPlaceRefusal = "that keeps the placements of the tensor it writes to";

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

bool wants_gradient(const OpSample& sample, size_t i, const at::Tensor& t) {
  return floating(t) && (sample.differentiable.empty() || sample.differentiable[i]);
}

// Whether single-device autograd differentiates the sample, and if not, why.
DerivativeProbe probe_derivative(const OpSample& sample) {
  std::vector<at::Tensor> full;
  for (size_t i = 0; i < sample.shapes.size(); ++i) {
    at::Tensor t = make(sample, i);
    full.push_back(t.requires_grad_(wants_gradient(sample, i, t)));
  }
  try {
    at::Tensor loss = sum_of_floating(sample.run(full));
    if (!loss.defined()) return {false, "no output depends differentiably on the inputs"};
    loss.backward();
    return {true, ""};
  } catch (const std::exception& e) {
    std::string what = e.what();
    return {false, "single-device backward fails: " + what.substr(0, what.find('\n'))};
  }
}

// One sample with one placement per input and mesh dim, against the single-device call. Partial
// inputs hold random contributions that reduce to the same values. Every rank runs every collective
// (gathering all outputs and gradients) before comparing, so a mismatch seen by some ranks cannot
// leave the others waiting in a collective. On success, `run` holds the ops it dispatched.
::testing::AssertionResult check(const OpSample& sample, const MeshPtr& mesh, const std::vector<Placements>& placements,
                                 uint64_t seed, SampleRun& run) {
  std::vector<at::Tensor> full, dist;
  for (size_t i = 0; i < sample.shapes.size(); ++i) {
    at::Tensor t = make(sample, i);
    const bool grad = sample.backward && wants_gradient(sample, i, t);
    full.push_back(t.clone().requires_grad_(grad));
    at::Tensor d = make_dtensor_holding(t, mesh, placements[i], seed * 31 + i);
    if (grad) d.set_requires_grad(true);
    dist.push_back(d);
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
  std::vector<at::Tensor> actual;
  try {
    CommDebugMode debug;
    actual = sample.run(dist);
    run.forward = debug.op_calls();
  } catch (const DTensorError& e) {
    // An in-place op cannot move the tensor it writes to (beyond reducing a Partial one): where the
    // placements would have to change, refusing with this error is the right outcome.
    if (std::string(e.what()).find(kInPlaceRefusal) == std::string::npos) throw;
    run.refused = true;
    return ::testing::AssertionSuccess();
  }
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "different number of outputs";
  for (size_t k = 0; k < actual.size(); ++k)
    if (!is_dtensor(actual[k])) return ::testing::AssertionFailure() << "output " << k << " is not a DTensor";

  std::vector<at::Tensor> gathered;
  {
    at::NoGradGuard no_grad;
    for (const auto& a : actual) gathered.push_back(full_tensor(a));
  }
  std::vector<at::Tensor> gathered_grads(full.size());
  run.gradient_compared = false;
  if (sample.backward) {
    at::Tensor loss = sum_of_floating(expected), dist_loss = sum_of_floating(actual);
    if (loss.defined()) {
      loss.backward();
      {
        CommDebugMode debug;
        dist_loss.backward();
        run.backward = debug.op_calls();
      }
      at::NoGradGuard no_grad;
      // A zero gradient that autograd makes with _efficientzerotensor (sgn, floor, comparisons ...) is
      // a plain tensor, as no DTensor input reaches that factory: its values are compared as they are.
      for (size_t i = 0; i < dist.size(); ++i)
        if (dist[i].requires_grad() && dist[i].grad().defined())
          gathered_grads[i] = is_dtensor(dist[i].grad()) ? full_tensor(dist[i].grad()) : dist[i].grad();
    }
  }

  for (size_t k = 0; k < actual.size(); ++k) {
    auto r = same_values(gathered[k], expected[k], sample);
    if (!r) return r << " (output " << k << ", placements " << to_string(placements_of(actual[k])) << ")";
  }
  for (size_t i = 0; i < full.size(); ++i) {
    if (!full[i].requires_grad()) continue;
    if (full[i].grad().defined() != gathered_grads[i].defined())
      return ::testing::AssertionFailure() << "gradient of input " << i << " defined on one side only";
    if (!full[i].grad().defined()) continue;
    auto r = same_values(gathered_grads[i], full[i].grad(), sample);
    if (!r) return r << " (gradient of input " << i << ")";
    run.gradient_compared = true;
  }
  return ::testing::AssertionSuccess();
}

// Whether `mine` holds on any rank of `m`: graph forms exist per rank (an empty shard's kernel only on
// the rank holding it), and every rank must take the same path, collectives and all.
bool on_any_rank(const MeshPtr& m, bool mine) {
  const at::Tensor flag = at::full({1}, mine ? 1.0 : 0.0, at::kDouble);
  return full_tensor(from_local(flag, m, Placements(m->ndim(), Partial(ReduceOp::Max)))).item<double>() > 0;
}

// The check again with every local kernel that has a graph form running as that form (run through
// the dispatcher op by op, as a saved program would run it), where the first check ran any such kernel.
::testing::AssertionResult check_graph_forms(const OpSample& sample, const MeshPtr& m, const std::vector<Placements>& placements,
                                             uint64_t seed) {
  struct FormsOn {
    FormsOn() { detail::set_graph_forms_run_eagerly(true); }
    ~FormsOn() { detail::set_graph_forms_run_eagerly(false); }
  } on;
  SampleRun run;
  ::testing::AssertionResult r = check(sample, m, placements, seed, run);
  if (!r) r << " (with graph forms)";
  return r;
}

// Runs every combination of `sample` on the meshes it asks for, recording what ran into the coverage
// table; returns the failures.
std::vector<std::string> run_sample(const OpSample& sample) {
  std::vector<MeshPtr> meshes = {mesh({4})};
  if (sample.two_d) meshes.push_back(mesh({2, 2}));
  std::vector<std::string> failures;
  uint64_t seed = 0;
  for (const auto& m : meshes) {
    for (const auto& placements : all_combinations(sample, m->ndim())) {
      ::testing::AssertionResult r = ::testing::AssertionFailure();
      SampleRun run;
      try {
        const uint64_t forms_before = detail::calls_with_a_graph_form();
        r = check(sample, m, placements, ++seed, run);
        if (on_any_rank(m, r && detail::calls_with_a_graph_form() != forms_before)) {
          ::testing::AssertionResult with_forms = check_graph_forms(sample, m, placements, seed);
          if (with_forms) record_graph_forms_checked(sample);
          if (r) r = with_forms;
        }
      } catch (const std::exception& e) {
        r = ::testing::AssertionFailure() << "threw: " << e.what();
      }
      if (r) {
        if (sample.expect_error.empty() && !run.refused) record_run(sample, m->ndim(), run);
        continue;
      }
      failures.push_back(sample.name + " on " + m->str() + " with inputs " + describe_inputs(placements) + ": " + r.message());
    }
  }
  record_sample_done(sample, probe_derivative(sample));
  return failures;
}

class OpSampleTest : public DistTest {
 public:
  explicit OpSampleTest(const OpSample& sample) : sample_(sample) {}
  void TestBody() override {
    const auto failures = run_sample(sample_);
    for (size_t k = 0; k < failures.size() && k < 30; ++k) ADD_FAILURE() << failures[k];
    if (failures.size() > 30) ADD_FAILURE() << "... and " << failures.size() - 30 << " more failing combinations";
  }

 private:
  const OpSample& sample_;
};

class OpDbCoverageTest : public DistTest {
 public:
  void TestBody() override {
    // Samples filtered out of this run still count: run them here (their failures are their tests').
    for (const auto& sample : samples())
      if (!sample_done(sample)) run_sample(sample);
    const CoverageReport report = coverage_report();
    if (world()->rank() == 0) std::cout << report.table;
    for (const auto& problem : report.problems) ADD_FAILURE() << problem;
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
