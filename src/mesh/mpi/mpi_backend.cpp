#include "mpi_backend.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "../packing.h"
#include "dtensor/errors.h"
#include "mpi_ring.h"
#include "mpi_runtime.h"
#include "mpi_types.h"
#include "mpi_work.h"

namespace dtensor::detail {
namespace {

using std::chrono::milliseconds;

// Tensors at least this large are all-reduced and reduce-scattered by the ring (ATen arithmetic);
// below it, MPI's own latency-optimized algorithms win.
constexpr int64_t kRingBytes = 256 << 10;

using mpi::Communicator;
using mpi::Stage;

class MpiBackend final : public c10d::Backend {
 public:
  explicit MpiBackend(std::shared_ptr<Communicator> comm)
      : c10d::Backend(comm->rank, comm->size), comm_(std::move(comm)) {}

  const std::string getBackendName() const override { return "mpi"; }

  void shutdown() override {
    std::lock_guard<std::mutex> lock(mutex_);
    comm_.reset();
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    at::Tensor& t = single(tensors, "broadcast");
    writable(t, "broadcast");
    return start("broadcast", {t}, {t}, nullptr, [&](MPI_Comm comm, MPI_Request* request) {
      const auto unit = mpi::unit_for({static_cast<int64_t>(t.nbytes())}, "broadcast");
      return MPI_Ibcast(t.data_ptr(), unit.count(t.nbytes()), unit.type, static_cast<int>(opts.rootRank), comm, request);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    at::Tensor& t = single(tensors, "all-reduce");
    return all_reduce_into(t, t, opts.reduceOp);
  }

  // In place when `output` is `input`.
  c10::intrusive_ptr<c10d::Work> all_reduce_into(at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op) {
    writable(output, "all-reduce");
    const at::Tensor in = readable(input, "all-reduce");
    expect(in.numel() == output.numel() && in.scalar_type() == output.scalar_type(), "all-reduce",
           "the output must have the input's size and dtype");
    const bool in_place = in.data_ptr() == output.data_ptr();
    auto comm = communicator("all-reduce");
    if (rings(in, op))
      return begin(comm, "all-reduce", {in, output}, {output},
                   mpi::ring_all_reduce(comm, in.view({-1}), output.view({-1}), op.op_));
    if (comm->shared_memory && mpi::ring_reduces(in.scalar_type(), op.op_)) return shared_all_reduce(comm, in, output, op.op_);
    return start("all-reduce", {in, output}, {output}, nullptr, [&](MPI_Comm comm, MPI_Request* request) {
      const auto how = mpi::reduction_for(in.scalar_type(), op, "all-reduce");
      return MPI_Iallreduce(in_place ? MPI_IN_PLACE : in.data_ptr(), output.data_ptr(), element_count(output, "all-reduce"),
                            how.type, how.op, comm, request);
    });
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions&) override {
    writable(output, "all-gather");
    const at::Tensor in = readable(input, "all-gather");
    expect(output.nbytes() == in.nbytes() * static_cast<size_t>(size_), "all-gather",
           "the output must hold the group size times the input's bytes");
    if (auto comm = communicator("all-gather"); comm->shared_memory) return shared_all_gather(comm, in, output, {output}, nullptr);
    const int64_t bytes = static_cast<int64_t>(in.nbytes());
    return start("all-gather", {in, output}, {output}, nullptr, [&](MPI_Comm comm, MPI_Request* request) {
      const auto unit = mpi::unit_for({bytes}, "all-gather");
      return MPI_Iallgather(in.data_ptr(), unit.count(bytes), unit.type, output.data_ptr(), unit.count(bytes), unit.type,
                            comm, request);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const at::Tensor in = readable(single(inputs, "all-gather"), "all-gather");
    expect(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_), "all-gather",
           "give one output list with a tensor per member");
    at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
    auto copy_out = [flat, targets = outputs[0], n = in.numel()] {
      for (size_t i = 0; i < targets.size(); ++i)
        targets[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(targets[i].sizes()));
    };
    if (auto comm = communicator("all-gather"); comm->shared_memory) return shared_all_gather(comm, in, flat, outputs[0], copy_out);
    const int64_t bytes = static_cast<int64_t>(in.nbytes());
    return start("all-gather", {in, flat}, outputs[0], copy_out, [&](MPI_Comm comm, MPI_Request* request) {
      const auto unit = mpi::unit_for({bytes}, "all-gather");
      return MPI_Iallgather(in.data_ptr(), unit.count(bytes), unit.type, flat.data_ptr(), unit.count(bytes), unit.type,
                            comm, request);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override {
    writable(output, "reduce-scatter");
    const at::Tensor in = readable(input, "reduce-scatter");
    expect(in.numel() == output.numel() * size_ && in.scalar_type() == output.scalar_type(), "reduce-scatter",
           "the input must hold the group size times the output's elements, of the output's dtype");
    if (rings(in, opts.reduceOp)) {
      auto comm = communicator("reduce-scatter");
      std::vector<int64_t> blocks(static_cast<size_t>(size_), output.numel());
      return begin(comm, "reduce-scatter", {in, output}, {output},
                   mpi::ring_reduce_scatter(comm, in.view({-1}), output.view({-1}), blocks, opts.reduceOp.op_));
    }
    return start("reduce-scatter", {in, output}, {output}, nullptr, [&](MPI_Comm comm, MPI_Request* request) {
      const auto how = mpi::reduction_for(in.scalar_type(), opts.reduceOp, "reduce-scatter");
      return MPI_Ireduce_scatter_block(in.data_ptr(), output.data_ptr(), element_count(output, "reduce-scatter"), how.type,
                                       how.op, comm, request);
    });
  }

  // Split sizes count rows (slices along dim 0); empty means equal parts. The list all-to-all of the
  // row blocks, which lie back to back: MPI sends and receives them in place.
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                                   std::vector<int64_t>& input_splits,
                                                   const c10d::AllToAllOptions& opts) override {
    writable(output, "all-to-all");
    const at::Tensor in = readable(input, "all-to-all");
    expect(in.dim() > 0 && output.dim() > 0, "all-to-all", "0-d tensors cannot be split; give 1-d or more");
    std::vector<at::Tensor> outputs = row_blocks(output, output_splits), inputs = row_blocks(in, input_splits);
    return alltoall(outputs, inputs, opts);
  }

  // inputs[m] goes to member m and outputs[m] (contiguous) comes from it. An input may be strided (a
  // redistribution's column blocks): through shared memory it is copied straight into the slots. Over
  // MPI, inputs lying back to back in one buffer are sent from it (else packed into one first), and
  // outputs lying so are received into it (else into another buffer first).
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    expect(outputs.size() == static_cast<size_t>(size_) && inputs.size() == outputs.size(), "all-to-all",
           "give one input and one output per member");
    std::vector<int64_t> send, recv;
    for (int m = 0; m < size_; ++m) {
      const at::Tensor &in = inputs[static_cast<size_t>(m)], &out = outputs[static_cast<size_t>(m)];
      on_cpu(in, "all-to-all");
      writable(out, "all-to-all");
      expect(in.dim() > 0 && out.dim() > 0, "all-to-all", "0-d tensors cannot be cut in slices; give 1-d or more");
      expect(in.scalar_type() == inputs[0].scalar_type() && out.scalar_type() == inputs[0].scalar_type(), "all-to-all",
             "every input and output must have one dtype");
      send.push_back(static_cast<int64_t>(in.nbytes()));
      recv.push_back(static_cast<int64_t>(out.nbytes()));
    }
    if (auto comm = communicator("all-to-all"); comm->all_to_all_shared) {
      auto work = shared_all_to_all(comm, outputs, inputs);
      if (work) return work;
    }
    const at::Tensor packed = packed_back_to_back(inputs);
    if (const auto span = back_to_back(outputs)) return mpi_all_to_all(*span, packed, send, recv, nullptr);
    int64_t total = 0;
    for (const at::Tensor& out : outputs) total += out.numel();
    at::Tensor received = at::empty({total}, packed.options());
    auto unpack = [received, outputs] {
      int64_t at = 0;
      for (const at::Tensor& out : outputs) {
        out.view({-1}).copy_(received.narrow(0, at, out.numel()));
        at += out.numel();
      }
    };
    return mpi_all_to_all(received, packed, send, recv, unpack);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    at::Tensor& out = single(outputs, "scatter");
    writable(out, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor packed;
    if (rank_ == root) {
      expect(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_), "scatter",
             "the root gives one input list with a tensor per member");
      std::vector<at::Tensor> flat;
      for (const auto& chunk : inputs[0]) {
        expect(chunk.numel() == out.numel() && chunk.scalar_type() == out.scalar_type(), "scatter",
               "every chunk must match the output's shape and dtype");
        flat.push_back(chunk.reshape({-1}));
      }
      packed = at::cat(flat);
    }
    const int64_t bytes = static_cast<int64_t>(out.nbytes());
    return start("scatter", {packed, out}, {out}, nullptr, [&](MPI_Comm comm, MPI_Request* request) {
      const auto unit = mpi::unit_for({bytes}, "scatter");
      return MPI_Iscatter(packed.defined() ? packed.data_ptr() : nullptr, unit.count(bytes), unit.type, out.data_ptr(),
                          unit.count(bytes), unit.type, root, comm, request);
    });
  }

  // The functional collectives (graph programs) call the coalesced forms, with one tensor or more.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return each(tensors.size(), [&](size_t i) {
      std::vector<at::Tensor> one{tensors[i]};
      return allreduce(one, opts);
    });
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) override {
    expect(outputs.size() == inputs.size(), "all-gather", "give one output per input");
    return each(inputs.size(), [&](size_t i) { return all_gather_single(outputs[i], inputs[i], opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    expect(outputs.size() == inputs.size(), "reduce-scatter", "give one output per input");
    return each(inputs.size(), [&](size_t i) { return reduce_scatter_single(outputs[i], inputs[i], opts); });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return start("barrier", {}, {}, nullptr, [&](MPI_Comm comm, MPI_Request* request) { return MPI_Ibarrier(comm, request); });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int destination, int tag) override {
    const at::Tensor t = readable(single(tensors, "send"), "send");
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    return start("send", {t}, {}, nullptr, [&](MPI_Comm comm, MPI_Request* request) {
      const auto unit = mpi::unit_for({bytes}, "send");
      return MPI_Isend(t.data_ptr(), unit.count(bytes), unit.type, destination, tag, comm, request);
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int source, int tag) override {
    at::Tensor& t = single(tensors, "recv");
    writable(t, "recv");
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    return start("recv", {t}, {t}, nullptr, [&](MPI_Comm comm, MPI_Request* request) {
      const auto unit = mpi::unit_for({bytes}, "recv");
      return MPI_Irecv(t.data_ptr(), unit.count(bytes), unit.type, source, tag, comm, request);
    });
  }

 private:
  // MPI's all-to-all of the contiguous `in`, send[m] bytes to member m, into `output`, recv[m] bytes
  // from member m; `finish` runs when it completes.
  c10::intrusive_ptr<c10d::Work> mpi_all_to_all(const at::Tensor& output, const at::Tensor& in,
                                                const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                                                std::function<void()> finish) {
    std::vector<int64_t> all(send);
    all.insert(all.end(), recv.begin(), recv.end());
    all.push_back(static_cast<int64_t>(in.nbytes()));
    all.push_back(static_cast<int64_t>(output.nbytes()));
    // Counts and displacements MPI reads until the call completes: kept by the work's last step.
    auto arrays = std::make_shared<std::vector<std::vector<int>>>();
    auto done = [arrays, finish = std::move(finish)] {
      if (finish) finish();
    };
    return start("all-to-all", {in, output}, {output}, done, [&](MPI_Comm comm, MPI_Request* request) {
      const auto unit = mpi::unit_for(all, "all-to-all");
      auto& a = *arrays;
      a = {to_units(send, unit), displacements(send, unit), to_units(recv, unit), displacements(recv, unit)};
      return MPI_Ialltoallv(in.data_ptr(), a[0].data(), a[1].data(), unit.type, output.data_ptr(), a[2].data(),
                            a[3].data(), unit.type, comm, request);
    });
  }

  // Whether reducing `input` with `op` goes round the ring (mpi_ring.h) rather than through MPI.
  bool rings(const at::Tensor& input, const c10d::ReduceOp& op) const {
    return size_ > 1 && mpi::ring_reduces(input.scalar_type(), op.op_) && static_cast<int64_t>(input.nbytes()) >= kRingBytes;
  }

  // The group's communicator, usable: not shut down, no collective left hanging on it.
  std::shared_ptr<Communicator> communicator(const char* operation) {
    std::shared_ptr<Communicator> comm;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      comm = comm_;
    }
    if (!comm) throw std::runtime_error(std::string("MPI ") + operation + ": the process group was shut down");
    if (comm->stuck)
      throw std::runtime_error(std::string("MPI ") + operation +
                               ": an earlier collective on this group never completed, so its communicator is unusable");
    return comm;
  }

  // Starts a schedule of stages and returns the work that completes it.
  static c10::intrusive_ptr<c10d::Work> begin(const std::shared_ptr<Communicator>& comm, const char* operation,
                                              std::vector<at::Tensor> keep_alive, std::vector<at::Tensor> outputs,
                                              std::vector<Stage> stages) {
    auto work = c10::make_intrusive<mpi::Work>(comm, operation, std::move(keep_alive), std::move(outputs), std::move(stages));
    work->begin();
    return work;
  }

  // Runs `collective` through the members' shared segment (mpi_shared_memory.h); it is complete when
  // this returns, and so is the work returned, which holds `outputs`.
  template <typename Collective>
  static c10::intrusive_ptr<c10d::Work> through_shared_memory(const std::shared_ptr<Communicator>& comm,
                                                              const char* operation, std::vector<at::Tensor> outputs,
                                                              Collective&& collective) {
    try {
      collective(*comm->shared_memory);
    } catch (...) {
      comm->stuck = true;  // members may be chunks apart now
      throw;
    }
    return begin(comm, operation, {}, std::move(outputs), {});
  }

  // The all-gather of `in` into `flat`, then `finish`.
  static c10::intrusive_ptr<c10d::Work> shared_all_gather(const std::shared_ptr<Communicator>& comm, const at::Tensor& in,
                                                          at::Tensor flat, std::vector<at::Tensor> outputs,
                                                          const std::function<void()>& finish) {
    return through_shared_memory(comm, "all-gather", std::move(outputs), [&](mpi::SharedMemory& shared) {
      shared.all_gather(in.data_ptr(), flat.data_ptr(), static_cast<int64_t>(in.nbytes()), comm->timeout);
      if (finish) finish();
    });
  }

  // The all-reduce of `in` into `output` (which may be `in`), by ATen's arithmetic on the slots.
  static c10::intrusive_ptr<c10d::Work> shared_all_reduce(const std::shared_ptr<Communicator>& comm, const at::Tensor& in,
                                                          const at::Tensor& output, c10d::ReduceOp::RedOpType op) {
    const auto reduce = [&in, op](const std::vector<const void*>& blocks, void* out, int64_t length) {
      const int64_t elements = length / static_cast<int64_t>(in.element_size());
      const auto view = [&](const void* p) { return at::from_blob(const_cast<void*>(p), {elements}, in.options()); };
      const at::Tensor dest = view(out);
      mpi::combine(op, view(blocks[0]), view(blocks[1]), dest);
      for (size_t m = 2; m < blocks.size(); ++m) mpi::combine(op, dest, view(blocks[m]), dest);
    };
    return through_shared_memory(comm, "all-reduce", {output}, [&](mpi::SharedMemory& shared) {
      shared.all_reduce(in.data_ptr(), output.data_ptr(), static_cast<int64_t>(in.nbytes()), reduce, comm->timeout);
    });
  }

  // The all-to-all of `inputs` (any strides) into `outputs` (contiguous) through the shared segment;
  // null, on every member, when some block's slices are too large for it (MPI's all-to-all then runs).
  static c10::intrusive_ptr<c10d::Work> shared_all_to_all(const std::shared_ptr<Communicator>& comm,
                                                          const std::vector<at::Tensor>& outputs,
                                                          const std::vector<at::Tensor>& inputs) {
    const auto blocks = [](const std::vector<at::Tensor>& tensors) {
      std::vector<mpi::SharedMemory::Block> out;
      for (const at::Tensor& t : tensors) {
        const auto bytes = static_cast<int64_t>(t.nbytes());
        out.push_back({bytes, t.size(0) == 0 ? 0 : bytes / t.size(0)});
      }
      return out;
    };
    const auto sends = blocks(inputs), receives = blocks(outputs);
    const auto pack = [&](int m, int64_t offset, int64_t length, void* slot) {
      const int64_t unit = sends[static_cast<size_t>(m)].unit;
      copy_to_bytes(inputs[static_cast<size_t>(m)].narrow(0, offset / unit, length / unit), slot);
    };
    const auto unpack = [&](int m, int64_t offset, int64_t length, const void* slot) {
      std::memcpy(static_cast<char*>(outputs[static_cast<size_t>(m)].data_ptr()) + offset, slot, static_cast<size_t>(length));
    };
    bool done = false;
    auto work = through_shared_memory(comm, "all-to-all", outputs, [&](mpi::SharedMemory& shared) {
      done = shared.all_to_all(sends, receives, pack, unpack, comm->timeout);
      const auto self = static_cast<size_t>(comm->rank);
      if (done) copy_to_bytes(inputs[self], outputs[self].data_ptr());
    });
    return done ? work : nullptr;
  }

  // Starts one non-blocking MPI call (`call(comm, request)` returns its MPI code; it runs at once, so it
  // may refer to the caller's locals); `finish` runs when it completes.
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> start(const char* operation, std::vector<at::Tensor> keep_alive,
                                       std::vector<at::Tensor> outputs, std::function<void()> finish, Call&& call) {
    Stage stage{[&call](MPI_Comm comm, std::vector<MPI_Request>& requests) {
                  requests.emplace_back(MPI_REQUEST_NULL);
                  return call(comm, &requests.back());
                },
                std::move(finish)};
    return begin(communicator(operation), operation, std::move(keep_alive), std::move(outputs), {std::move(stage)});
  }

  // Starts start_one(i) for i < n, in order (every member starts them alike), as one work.
  template <typename StartOne>
  static c10::intrusive_ptr<c10d::Work> each(size_t n, StartOne&& start_one) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < n; ++i) works.push_back(start_one(i));
    return c10::make_intrusive<mpi::AllOf>(std::move(works));
  }

  static at::Tensor& single(std::vector<at::Tensor>& tensors, const char* operation) {
    expect(tensors.size() == 1, operation, "the MPI backend takes one tensor per call");
    return tensors[0];
  }

  static void expect(bool ok, const char* operation, const char* what) {
    if (!ok) throw DTensorError(std::string("MPI ") + operation + ": " + what);
  }

  static void on_cpu(const at::Tensor& t, const char* operation) {
    expect(t.defined() && t.device().is_cpu(), operation, "the MPI backend moves CPU tensors only (use NCCL for CUDA meshes)");
  }

  // Results land in place, so they must be dense.
  static void writable(const at::Tensor& t, const char* operation) {
    on_cpu(t, operation);
    expect(t.is_contiguous(), operation, "the output tensor must be contiguous");
  }

  static at::Tensor readable(const at::Tensor& t, const char* operation) {
    on_cpu(t, operation);
    return t.contiguous();
  }

  static int element_count(const at::Tensor& t, const char* operation) {
    expect(t.numel() <= INT_MAX, operation, "more than 2^31 elements in one reduction; split the tensor");
    return static_cast<int>(t.numel());
  }

  // `t` cut along dim 0 into a block per member, `rows` rows each (equal blocks when empty).
  std::vector<at::Tensor> row_blocks(const at::Tensor& t, std::vector<int64_t> rows) const {
    if (rows.empty()) {
      expect(t.size(0) % size_ == 0, "all-to-all", "without split sizes, dim 0 must divide by the group size");
      rows.assign(static_cast<size_t>(size_), t.size(0) / size_);
    }
    expect(rows.size() == static_cast<size_t>(size_), "all-to-all", "give one split size per member");
    std::vector<at::Tensor> blocks;
    int64_t row = 0;
    for (const int64_t r : rows) {
      expect(r >= 0 && row + r <= t.size(0), "all-to-all", "the split sizes must add up to dim 0");
      blocks.push_back(t.narrow(0, row, r));
      row += r;
    }
    expect(row == t.size(0), "all-to-all", "the split sizes must add up to dim 0");
    return blocks;
  }

  static std::vector<int> to_units(const std::vector<int64_t>& bytes, const mpi::ByteUnit& unit) {
    std::vector<int> out;
    for (auto b : bytes) out.push_back(unit.count(b));
    return out;
  }

  static std::vector<int> displacements(const std::vector<int64_t>& bytes, const mpi::ByteUnit& unit) {
    std::vector<int> out;
    int64_t at = 0;
    for (auto b : bytes) {
      out.push_back(unit.count(at));
      at += b;
    }
    return out;
  }

  std::mutex mutex_;
  std::shared_ptr<Communicator> comm_;
};

// Every member posts its arrival, then waits for the others': a member that never comes fails the
// rest after `timeout`, where MPI_Comm_create_group would block for ever.
void meet(c10d::Store& store, const std::vector<int64_t>& ranks, int world_rank, milliseconds timeout) {
  store.set("mpi/arrived/" + std::to_string(world_rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (auto r : ranks) keys.push_back("mpi/arrived/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    std::string missing;
    for (auto r : ranks)
      if (!store.check({"mpi/arrived/" + std::to_string(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw DTensorError("rank " + std::to_string(world_rank) + ": creating an MPI communicator: rank(s) " + missing +
                       " did not come within " + mpi::seconds_text(timeout) + "; every member must create the same groups in the same order");
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> mpi_all_reduce_into(c10d::Backend& backend, at::Tensor& output, const at::Tensor& input,
                                                   const c10d::ReduceOp& op) {
  auto* mpi_backend = dynamic_cast<MpiBackend*>(&backend);
  if (!mpi_backend) throw DTensorError("mpi_all_reduce_into: the process group is " + backend.getBackendName() + ", not MPI");
  return mpi_backend->all_reduce_into(output, input, op);
}

c10::intrusive_ptr<c10d::Backend> make_mpi_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   const std::vector<int64_t>& ranks, int world_rank,
                                                   milliseconds timeout) {
  if (!mpi::initialized())
    throw DTensorError("rank " + std::to_string(world_rank) +
                       ": the MPI backend needs the world of a job started by mpirun (World::from_environment under "
                       "mpirun, or dtensor's launcher); this world was built otherwise, so use Gloo");
  meet(*store, ranks, world_rank, timeout);
  auto comm = std::make_shared<Communicator>();
  comm->timeout = timeout;
  comm->size = static_cast<int>(ranks.size());
  std::vector<int> members(ranks.begin(), ranks.end());
  // Creations of different groups never interleave on one process; the tag keeps them apart anyway.
  const int tag = static_cast<int>(std::hash<std::string>{}(std::string(reinterpret_cast<const char*>(members.data()),
                                                                        members.size() * sizeof(int))) % 32768);
  auto lock = mpi::call_lock();
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, static_cast<int>(members.size()), members.data(), &group);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm->comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS)
    throw DTensorError("rank " + std::to_string(world_rank) + ": creating an MPI communicator failed: " + mpi::error_text(rc));
  MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm->comm, &comm->rank);
  MPI_Comm_dup(comm->comm, &comm->schedules);
  // DTENSOR_MPI_SHARED_MEMORY=0 leaves every collective of the groups made meanwhile to MPI (to compare;
  // the same on every rank). All-to-alls use the segment only when ranks do not outnumber cores: every
  // round then waits for each member's turn on a core, and Open MPI's single-copy all-to-all was faster
  // (bench/results/redistribute.md, 4 ranks on 2 cores: 1.5 GB/s against 2.5-4);
  // DTENSOR_MPI_SHARED_MEMORY=1 uses it for them anyway (the tests, which run 4 ranks on 2 cores).
  const char* asked = std::getenv("DTENSOR_MPI_SHARED_MEMORY");
  const std::string shared = asked ? asked : "";
  if (shared != "0") comm->shared_memory = mpi::SharedMemory::create(comm->schedules, comm->rank, comm->size);
  comm->all_to_all_shared = comm->shared_memory && (shared == "1" || !mpi::oversubscribed());
  lock.unlock();
  return c10::make_intrusive<MpiBackend>(std::move(comm));
}

}  // namespace dtensor::detail
