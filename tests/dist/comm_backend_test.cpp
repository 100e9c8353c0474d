// The process-group backends dtensor runs on, through c10d's Backend interface (what every collective
// of dtensor calls): each collective against a single-process oracle built from every rank's inputs,
// on Gloo always and on MPI when the job runs under mpirun (dtensor's launcher uses it when built
// with MPI), on a 1-d mesh and along both dims of a 2-d one.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <map>
#include <numeric>

#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

bool mpi_available() { return mpi_built_in() && world()->launcher().find("mpirun") != std::string::npos; }

std::vector<CommBackend> backends() {
  std::vector<CommBackend> out{CommBackend::Gloo};
  if (mpi_available()) out.push_back(CommBackend::Mpi);
  return out;
}

// make() with environment variable `name` set to `value`, then as it was: groups read
// DTENSOR_MPI_SHARED_MEMORY when they are made.
template <typename Make>
auto with_env(const char* name, const char* value, Make&& make) {
  const char* before = std::getenv(name);
  const std::string saved = before ? before : "";
  setenv(name, value, 1);
  auto made = make();
  if (before) setenv(name, saved.c_str(), 1);
  else unsetenv(name);
  return made;
}

// A mesh of its own per backend and shape (cached: every rank asks in the same order).
MeshPtr mesh_on(CommBackend backend, const Shape& shape) {
  static std::map<std::pair<CommBackend, Shape>, MeshPtr> meshes;
  auto& m = meshes[{backend, shape}];
  if (!m) m = DeviceMesh::create(world(), shape, {.backend = backend});
  return m;
}

// The members of this rank's group along `dim`, in group order (their global ranks).
std::vector<int64_t> members(const MeshPtr& mesh, int64_t dim) {
  std::vector<int64_t> out;
  Shape c = *mesh->coordinate();
  for (int64_t i = 0; i < mesh->size(dim); ++i) {
    c[dim] = i;
    out.push_back(mesh->global_rank_at(c));
  }
  return out;
}

// What global rank `r` contributes: small integers, so every reduction is exact in every dtype.
at::Tensor input_of(int64_t r, const Shape& shape, at::ScalarType dtype) {
  at::Tensor t = test_tensor(shape, at::kFloat, 100 + static_cast<uint64_t>(r)).remainder(5) - 2;
  return dtype == at::kBool ? t.gt(0) : t.to(dtype);
}

at::Tensor reduce_oracle(const std::vector<int64_t>& group, const Shape& shape, at::ScalarType dtype,
                         c10d::ReduceOp::RedOpType op) {
  at::Tensor acc = input_of(group[0], shape, dtype).to(at::kDouble);
  for (size_t i = 1; i < group.size(); ++i) {
    const at::Tensor x = input_of(group[i], shape, dtype).to(at::kDouble);
    if (op == c10d::ReduceOp::SUM) acc = dtype == at::kBool ? acc.logical_or(x).to(at::kDouble) : acc + x;
    else if (op == c10d::ReduceOp::PRODUCT) acc = acc * x;
    else if (op == c10d::ReduceOp::MAX) acc = at::maximum(acc, x);
    else acc = at::minimum(acc, x);
  }
  return acc.to(dtype);
}

class CommBackendTest : public DistTest {};

TEST_F(CommBackendTest, EveryCollectiveMatchesTheOracle) {
  const int64_t me = world()->rank();
  for (const CommBackend backend : backends()) {
    for (const Shape& shape : {Shape{4}, Shape{2, 2}}) {
      const MeshPtr mesh = mesh_on(backend, shape);
      ASSERT_EQ(mesh->backend(), backend);
      for (int64_t dim = 0; dim < mesh->ndim(); ++dim) {
        SCOPED_TRACE(to_string(backend) + " mesh " + mesh->str() + " dim " + std::to_string(dim));
        auto group = mesh->group(dim);
        const auto ranks = members(mesh, dim);
        const int64_t n = static_cast<int64_t>(ranks.size());
        const int64_t index = (*mesh->coordinate())[dim];

        // all-reduce, every dtype and reduction dtensor uses; the large shape (over 256 KiB, its element
        // count not divisible by the group) takes MPI's ring of ATen reductions
        for (const Shape& data : {Shape{3, 5}, Shape{513, 301}})
          for (const auto dtype : {at::kFloat, at::kDouble, at::kLong, at::kInt, at::kBFloat16, at::kHalf}) {
            for (const auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX, c10d::ReduceOp::MIN, c10d::ReduceOp::PRODUCT}) {
              std::vector<at::Tensor> t{input_of(me, data, dtype)};
              c10d::AllreduceOptions options;
              options.reduceOp = op;
              group->allreduce(t, options)->wait();
              EXPECT_TRUE(tensors_equal(t[0], reduce_oracle(ranks, data, dtype, op)))
                  << c10::toString(dtype) << " op " << int(op) << " shape " << data;
            }
            // out of place (a Partial -> Replicate that keeps its input; the ring writes straight
            // into a new tensor), the input untouched
            for (const auto& [partial, op] : {std::pair{ReduceOp::Sum, c10d::ReduceOp::SUM},
                                              std::pair{ReduceOp::Max, c10d::ReduceOp::MAX},
                                              std::pair{ReduceOp::Min, c10d::ReduceOp::MIN}}) {
              Placements placements(static_cast<size_t>(mesh->ndim()), Replicate());
              placements[static_cast<size_t>(dim)] = Partial(partial);
              const at::Tensor local = input_of(me, data, dtype), before = local.clone();
              const at::Tensor dt = from_local(local, mesh, placements, {.run_check = false});
              const at::Tensor reduced = to_local(redistribute(dt, Placements(placements.size(), Replicate())));
              EXPECT_TRUE(tensors_equal(reduced, reduce_oracle(ranks, data, dtype, op)))
                  << "out of place, " << c10::toString(dtype) << " op " << int(op) << " shape " << data;
              EXPECT_TRUE(tensors_equal(local, before)) << "an out-of-place all-reduce changed its input";
            }
          }
        // all-gather of uneven-looking (3 x 5) blocks, and of blocks larger than MPI's shared-memory
        // slots (512 KiB) and not a multiple of them; into a flat tensor, into a list of tensors, and
        // in place (the input is this member's block of the output)
        for (const Shape& block : {Shape{3, 5}, Shape{700, 1001}}) {
          std::vector<at::Tensor> expected;
          for (auto r : ranks) expected.push_back(input_of(r, block, at::kFloat));
          const at::Tensor all = at::cat(expected);
          at::Tensor in = input_of(me, block, at::kFloat), out = at::empty({block[0] * n, block[1]});
          group->all_gather_single(out, in)->wait();
          EXPECT_TRUE(tensors_equal(out, all)) << "all-gather of " << block;
          std::vector<std::vector<at::Tensor>> list{{}};
          for (int64_t m = 0; m < n; ++m) list[0].push_back(at::empty(block));
          std::vector<at::Tensor> inputs{in};
          group->allgather(list, inputs)->wait();
          EXPECT_TRUE(tensors_equal(at::cat(list[0]), all)) << "all-gather into a list, " << block;
          at::Tensor in_place = at::zeros({block[0] * n, block[1]});
          at::Tensor mine = in_place.narrow(0, block[0] * index, block[0]);
          mine.copy_(in);
          group->all_gather_single(in_place, mine)->wait();
          EXPECT_TRUE(tensors_equal(in_place, all)) << "in-place all-gather of " << block;
        }
        // reduce-scatter: block i of everyone's input, reduced, lands on member i (small and ring-sized)
        for (const int64_t rows : {int64_t{2}, int64_t{40000}})
          for (const auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX}) {
            const at::Tensor in = input_of(me, {rows * n, 3}, at::kFloat), before = in.clone();
            at::Tensor out = at::empty({rows, 3});
            c10d::ReduceScatterOptions options;
            options.reduceOp = op;
            group->reduce_scatter_single(out, const_cast<at::Tensor&>(in), options)->wait();
            EXPECT_TRUE(tensors_equal(out, reduce_oracle(ranks, {rows * n, 3}, at::kFloat, op).narrow(0, rows * index, rows)));
            EXPECT_TRUE(tensors_equal(in, before)) << "reduce-scatter changed its input";
          }
        // all-to-all with uneven splits: member i sends (i + j) % 3 rows to member j (zero included);
        // scaled by 20000 (up to 640 KB a block), MPI's shared memory moves them in several rounds
        for (const int64_t scale : {int64_t{1}, int64_t{20000}}) {
          const auto rows = [scale](int64_t from, int64_t to) { return (from + to) % 3 * scale; };
          std::vector<int64_t> send, recv;
          for (int64_t j = 0; j < n; ++j) {
            send.push_back(rows(index, j));
            recv.push_back(rows(j, index));
          }
          const auto total = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); };
          at::Tensor in = input_of(me, {total(send), 4}, at::kDouble), out = at::empty({total(recv), 4}, at::kDouble);
          group->all_to_all_single(out, in, recv, send)->wait();
          std::vector<at::Tensor> expected;
          for (int64_t j = 0; j < n; ++j) {
            int64_t offset = 0;  // where member j's rows for this member start in its input
            for (int64_t k = 0; k < index; ++k) offset += rows(j, k);
            int64_t their_total = 0;
            for (int64_t k = 0; k < n; ++k) their_total += rows(j, k);
            expected.push_back(input_of(ranks[j], {their_total, 4}, at::kDouble).narrow(0, offset, rows(j, index)));
          }
          EXPECT_TRUE(tensors_equal(out, at::cat(expected))) << "all-to-all, rows scaled by " << scale;
        }
        // broadcast from the last member, scatter from the first
        {
          std::vector<at::Tensor> t{input_of(me, {7}, at::kLong)};
          c10d::BroadcastOptions options;
          options.rootRank = n - 1;
          group->broadcast(t, options)->wait();
          EXPECT_TRUE(tensors_equal(t[0], input_of(ranks[n - 1], {7}, at::kLong)));
        }
        {
          std::vector<at::Tensor> out{at::empty({2, 3})};
          std::vector<std::vector<at::Tensor>> chunks;
          if (index == 0) {
            chunks.emplace_back();
            for (int64_t j = 0; j < n; ++j) chunks[0].push_back(input_of(1000 + j, {2, 3}, at::kFloat));
          }
          c10d::ScatterOptions options;
          options.rootRank = 0;
          group->scatter(out, chunks, options)->wait();
          EXPECT_TRUE(tensors_equal(out[0], input_of(1000 + index, {2, 3}, at::kFloat)));
        }
        // send/recv around the ring, then a barrier
        {
          std::vector<at::Tensor> outgoing{input_of(me, {5}, at::kFloat)}, incoming{at::empty({5})};
          const int next = static_cast<int>((index + 1) % n), previous = static_cast<int>((index + n - 1) % n);
          auto sent = group->send(outgoing, next, 7);
          group->recv(incoming, previous, 7)->wait();
          sent->wait();
          EXPECT_TRUE(tensors_equal(incoming[0], input_of(ranks[static_cast<size_t>(previous)], {5}, at::kFloat)));
          group->barrier()->wait();
        }
      }
    }
  }
}

TEST_F(CommBackendTest, MpiReducesBoolAndRefusesWhatItCannotReduce) {
  if (!mpi_available()) GTEST_SKIP() << "not under mpirun (DTENSOR_LAUNCHER=fork or no MPI): Gloo only";
  const MeshPtr mesh = mesh_on(CommBackend::Mpi, {4});
  auto group = mesh->group(0);
  const std::vector<int64_t> ranks{0, 1, 2, 3};
  for (const auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX, c10d::ReduceOp::MIN}) {
    std::vector<at::Tensor> t{input_of(world()->rank(), {6}, at::kBool)};
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    group->allreduce(t, options)->wait();
    const auto expected = op == c10d::ReduceOp::MIN ? reduce_oracle(ranks, {6}, at::kBool, c10d::ReduceOp::MIN)
                                                    : reduce_oracle(ranks, {6}, at::kBool, c10d::ReduceOp::SUM);
    EXPECT_TRUE(tensors_equal(t[0], expected));
  }
  std::vector<at::Tensor> t{at::ones({3}, at::kFloat)};
  c10d::AllreduceOptions avg;
  avg.reduceOp = c10d::ReduceOp::AVG;
  EXPECT_THAT(error_of([&] { group->allreduce(t, avg)->wait(); }), HasSubstr("cannot all-reduce Float tensors with AVG"));
  at::Tensor strided = at::ones({4, 4}).t();
  std::vector<at::Tensor> s{strided};
  EXPECT_THAT(error_of([&] { group->allreduce(s)->wait(); }), HasSubstr("the output tensor must be contiguous"));
}

// MPI's list all-to-all takes strided inputs (a redistribution's column blocks): member i sends member
// j its rows' columns of chunk j (torch.chunk of the columns, so uneven), through shared memory in one
// round or several; with slices too large for a slot's share (every member falls back together), and
// on groups without shared memory, through MPI.
TEST_F(CommBackendTest, MpiAllToAllOfStridedBlocks) {
  if (!mpi_available()) GTEST_SKIP() << "not under mpirun (DTENSOR_LAUNCHER=fork or no MPI): Gloo only";
  const auto made_with = [](const char* shared_memory, const Shape& shape) {
    return with_env("DTENSOR_MPI_SHARED_MEMORY", shared_memory,
                    [&] { return DeviceMesh::create(world(), shape, {.backend = CommBackend::Mpi}); });
  };
  const int64_t me = world()->rank();
  for (const MeshPtr& mesh : {made_with("1", {4}), made_with("1", {2, 2}), made_with("0", {4})})
    for (int64_t dim = 0; dim < mesh->ndim(); ++dim) {
      auto group = mesh->group(dim);
      const auto ranks = members(mesh, dim);
      const int64_t n = static_cast<int64_t>(ranks.size()), index = (*mesh->coordinate())[dim];
      // rows x columns: one round; several rounds (uneven columns, 3 MB a member); slices of 300-600 KB,
      // more than a share
      for (const Shape& shape : {Shape{5, 7}, Shape{1501, 501}, Shape{3, 300007}}) {
        SCOPED_TRACE("mesh " + mesh->str() + " dim " + std::to_string(dim) + " shape " + c10::str(shape));
        const auto columns = [&](const at::Tensor& t, int64_t j) { return t.chunk(n, 1)[static_cast<size_t>(j)]; };
        const at::Tensor mine = input_of(me, shape, at::kFloat);
        std::vector<at::Tensor> inputs, expected;
        for (int64_t j = 0; j < n; ++j) {
          inputs.push_back(columns(mine, j));
          expected.push_back(columns(input_of(ranks[static_cast<size_t>(j)], shape, at::kFloat), index));
        }
        ASSERT_FALSE(inputs[0].is_contiguous());
        // into separate tensors, and into blocks back to back in one (as a redistribution receives)
        const at::Tensor block = at::empty_like(columns(mine, index), at::MemoryFormat::Contiguous);
        const at::Tensor received = at::empty({n * block.numel()});
        for (const bool one_buffer : {false, true}) {
          std::vector<at::Tensor> outputs;
          for (int64_t j = 0; j < n; ++j)
            outputs.push_back(one_buffer ? received.narrow(0, j * block.numel(), block.numel()).view(block.sizes())
                                         : at::empty_like(block));
          group->alltoall(outputs, inputs)->wait();
          for (int64_t j = 0; j < n; ++j)
            EXPECT_TRUE(tensors_equal(outputs[static_cast<size_t>(j)], expected[static_cast<size_t>(j)]))
                << "from member " << j << (one_buffer ? ", into one buffer" : "");
        }
      }
    }
  // Split sizes that do not cut dim 0 exactly are refused on every member before anything moves.
  auto group = mesh_on(CommBackend::Mpi, {4})->group(0);
  at::Tensor in = at::zeros({5, 2}), out = at::zeros({5, 2});
  std::vector<int64_t> fits{2, 1, 1, 1}, short_of_it{1, 1, 1, 1}, too_few{4, 1};
  EXPECT_THAT(error_of([&] { group->all_to_all_single(out, in, fits, short_of_it)->wait(); }),
              HasSubstr("the split sizes must add up to dim 0"));
  EXPECT_THAT(error_of([&] { group->all_to_all_single(out, in, too_few, fits)->wait(); }),
              HasSubstr("give one split size per member"));
}

// Under mpirun CPU meshes default to MPI (DTENSOR_BACKEND=gloo says otherwise), and meshes of both
// backends work side by side on the same ranks, giving equal results.
TEST_F(CommBackendTest, MeshesOfBothBackendsAgree) {
  const char* asked = std::getenv("DTENSOR_BACKEND");
  const CommBackend expected_default =
      asked ? (std::string(asked) == "mpi" ? CommBackend::Mpi : CommBackend::Gloo)
            : (mpi_available() ? CommBackend::Mpi : CommBackend::Gloo);
  EXPECT_EQ(mesh({4})->backend(), expected_default);
  const at::Tensor full = test_tensor({7, 6}, at::kFloat, 11);
  for (const CommBackend backend : backends()) {
    SCOPED_TRACE(to_string(backend));
    const MeshPtr m = mesh_on(backend, {2, 2});
    at::Tensor dt = make_dtensor_holding(full, m, {Partial(), Shard(1)}, 3);
    EXPECT_TRUE(tensors_equal(full_tensor(redistribute(dt, {Shard(0), Replicate()})), full));
    // A Partial too large for MPI's own reduction (the ring), not donated: reduced out of place, the
    // input's contributions untouched.
    const at::Tensor big = test_tensor({300, 301}, at::kFloat, 12);
    at::Tensor partial = make_dtensor_holding(big, m, {Replicate(), Partial()}, 4);
    const at::Tensor contribution = to_local(partial).clone();
    EXPECT_TRUE(tensors_equal(full_tensor(redistribute(partial, {Replicate(), Replicate()})), big));
    EXPECT_TRUE(tensors_equal(to_local(partial), contribution));
  }
}

// A backend joins through one registration: here Gloo's description under another name, whose groups
// count how many were made. A mesh asking for it by name runs its collectives there; a name nobody
// registered is refused with the registered ones.
TEST_F(CommBackendTest, ARegisteredBackendCarriesTheMeshesThatNameIt) {
  static int groups_made = 0;
  CommBackendDescription twin = comm_backend_description(CommBackend::Gloo);
  twin.backend = CommBackend("gloo_twin");
  twin.default_for_device = false;
  twin.make_group = [gloo = twin.make_group](const CommBackendDescription::GroupRequest& request) {
    ++groups_made;
    return gloo(request);
  };
  register_comm_backend(twin);
  EXPECT_THAT(comm_backends_for(c10::DeviceType::CPU), HasSubstr("gloo_twin"));
  const MeshPtr m = DeviceMesh::create(world(), {2, 2}, {.backend = CommBackend("gloo_twin")});
  EXPECT_EQ(m->backend(), CommBackend("gloo_twin"));
  EXPECT_EQ(groups_made, 2);  // one per mesh dim
  const at::Tensor full = test_tensor({5, 3}, at::kFloat, 13);
  EXPECT_TRUE(tensors_equal(full_tensor(make_dtensor_holding(full, m, {Partial(), Shard(0)}, 5)), full));
  EXPECT_THAT(error_of([&] { DeviceMesh::create(world(), {4}, {.backend = CommBackend("ucc")}); }),
              HasSubstr("no communication backend 'ucc' in this build of dtensor (it has gloo"));
}

// Rank 1 of a pair joining a collective late: once rank 0 has given up on it (`key`/gave-up, from
// error_of_abandoned_redistribute), runs `join`, then tells rank 0 (`key`/done). Rank 1 waits for rank
// 0's word, not for a fixed time: on a loaded machine rank 0 may reach the collective long after rank 1.
template <typename Join>
void join_late(const std::string& key, Join&& join) {
  world()->store()->wait({key + "/gave-up"}, std::chrono::seconds(60));
  join();
  world()->store()->set(key + "/done", std::vector<uint8_t>{1});
}

// What rank 0's redistribute of `dt` to Replicate says when its peer stays away, after checking that
// it waited the whole 1 s timeout and that the group then refuses the next collective; then it lets
// the peer join (join_late under `key`).
std::string error_of_abandoned_redistribute(const at::Tensor& dt, const std::string& key) {
  const auto started = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { redistribute(dt, {Replicate()}); });
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(1000));
  EXPECT_THAT(error_of([&] { redistribute(dt, {Replicate()}); }), HasSubstr("its communicator is unusable"));
  world()->store()->set(key + "/gave-up", std::vector<uint8_t>{1});
  return error;
}

// A collective a peer never joins fails on the others after the mesh's timeout with this rank, the
// operation and the mesh dim, and the group refuses further collectives rather than mixing them up.
// MPI keeps the abandoned collective: when the peer joins late, it completes as soon as the first
// rank drives MPI again, so the job still finalizes cleanly.
TEST_F(CommBackendTest, MpiCollectiveThatTimesOutFailsAndPoisonsItsGroup) {
  if (!mpi_available()) GTEST_SKIP() << "not under mpirun (DTENSOR_LAUNCHER=fork or no MPI): Gloo only";
  MeshOptions options{.dim_names = {"pair"}, .timeout = std::chrono::milliseconds(1000), .backend = CommBackend::Mpi};
  // Groups made while DTENSOR_MPI_SHARED_MEMORY=0 leave every collective to MPI (small all-reduces
  // otherwise go through shared memory, which has no abandoned requests to complete late).
  auto [pair, witness] = with_env("DTENSOR_MPI_SHARED_MEMORY", "0", [&] {
    return std::pair{DeviceMesh::create(world(), {2}, {0, 1}, options),
                     DeviceMesh::create(world(), {2}, {0, 2}, options)};  // the witness drives MPI on rank 0 below
  });
  const int64_t me = world()->rank();
  const std::string late = "comm_backend_test/late-all-reduce";
  // Rank 1 completes only while rank 0 makes MPI progress: rank 0 and 2 all-reduce "has rank 1
  // finished?" until both see yes (the same answer on both, so they stop together).
  const auto drive_until_rank1_done = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (bool done = false; !done;) {
      std::vector<at::Tensor> flag{at::full({1}, world()->store()->check({late + "/done"}) ? 1 : 0, at::kInt)};
      c10d::AllreduceOptions max;
      max.reduceOp = c10d::ReduceOp::MAX;
      witness->group(0)->allreduce(flag, max)->wait(std::chrono::seconds(40));
      done = flag[0].item<int>() == 1 || std::chrono::steady_clock::now() > deadline;
    }
  };
  if (me == 2) drive_until_rank1_done();
  if (me > 1) return;
  at::Tensor dt = make_dtensor_holding(at::ones({4}), pair, {Partial()});
  if (me == 1) {
    join_late(late, [&] {
      std::vector<at::Tensor> t{to_local(dt).clone()};
      pair->group(0)->allreduce(t)->wait(std::chrono::seconds(30));
      EXPECT_TRUE(tensors_equal(t[0], at::ones({4})));
    });
    return;
  }
  const std::string error = error_of_abandoned_redistribute(dt, late);
  EXPECT_THAT(error, HasSubstr("rank 0: all-reduce on mesh dim 0 (pair) of DeviceMesh([0, 1], names=(pair))"));
  EXPECT_THAT(error, HasSubstr("no answer within the time limit of 1.0"));
  EXPECT_THAT(error, HasSubstr("MPI all-reduce did not complete"));
  drive_until_rank1_done();
  EXPECT_TRUE(world()->store()->check({late + "/done"}));
}

// The same for an all-gather, which goes through shared memory rather than MPI: the member that waits
// fails after the timeout, naming the operation, and the group refuses further collectives. The late
// member finds the others' blocks published and completes on its own.
TEST_F(CommBackendTest, MpiAllGatherThatTimesOutFailsAndPoisonsItsGroup) {
  if (!mpi_available()) GTEST_SKIP() << "not under mpirun (DTENSOR_LAUNCHER=fork or no MPI): Gloo only";
  MeshOptions options{.dim_names = {"pair"}, .timeout = std::chrono::milliseconds(1000), .backend = CommBackend::Mpi};
  auto pair = DeviceMesh::create(world(), {2}, {0, 1}, options);
  const int64_t me = world()->rank();
  const std::string late = "comm_backend_test/late-all-gather";
  if (me > 1) return;
  const at::Tensor full = test_tensor({6, 3}, at::kFloat, 5);
  at::Tensor dt = make_dtensor_holding(full, pair, {Shard(0)});
  if (me == 1) {
    join_late(late, [&] { EXPECT_TRUE(tensors_equal(full_tensor(dt), full)); });
    return;
  }
  const std::string error = error_of_abandoned_redistribute(dt, late);
  EXPECT_THAT(error, HasSubstr("rank 0: all-gather on mesh dim 0 (pair)"));
  EXPECT_THAT(error, HasSubstr("MPI all-gather did not complete"));
  world()->store()->wait({late + "/done"}, std::chrono::seconds(30));
}

}  // namespace
}  // namespace dtensor::testing
