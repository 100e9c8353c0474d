#include "mpi_ring.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "mpi_types.h"

namespace dtensor::detail::mpi {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

// Where each member's block starts in the flat tensor.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  return offsets;
}

// The tag of the next schedule on `comm` (the same on every member: they start collectives alike).
int next_tag(Communicator& comm) { return 1 + static_cast<int>(comm.started++ % 32000); }

int modulo(int a, int n) { return ((a % n) + n) % n; }

// Posts "send `out` to the next member, receive `in` from the previous one".
int exchange(MPI_Comm comm, int rank, int size, int tag, const at::Tensor& out, const at::Tensor& in,
             std::vector<MPI_Request>& requests) {
  const int64_t out_bytes = static_cast<int64_t>(out.nbytes()), in_bytes = static_cast<int64_t>(in.nbytes());
  const ByteUnit unit = unit_for({out_bytes, in_bytes}, "ring reduction");
  requests.resize(requests.size() + 2);
  MPI_Request* r = &requests[requests.size() - 2];
  const int rc = MPI_Isend(out.data_ptr(), unit.count(out_bytes), unit.type, (rank + 1) % size, tag, comm, &r[0]);
  if (rc != MPI_SUCCESS) return rc;
  return MPI_Irecv(in.data_ptr(), unit.count(in_bytes), unit.type, modulo(rank - 1, size), tag, comm, &r[1]);
}

// Shared by the stages of one schedule: what the previous step reduced (the next step sends it).
struct RingState {
  at::Tensor last;
};

// n-1 steps; step s sends block (r-1-s) and receives the partial reduction of block (r-2-s) into
// `arrival(k)`, then reduces it with this member's block k into `destination(k, last_step)`, so that
// member r's last reduction is its own block r. The arrival may be the destination (reduced in place).
template <typename Arrival, typename Destination>
std::vector<Stage> reduce_scatter_stages(const std::shared_ptr<Communicator>& comm, const at::Tensor& input,
                                         const std::vector<int64_t>& sizes, RedOp op, int tag, Arrival arrival,
                                         Destination destination) {
  const int n = comm->size, r = comm->rank;
  const auto offsets = offsets_of(sizes);
  const auto block = [input, sizes, offsets](int k) { return input.narrow(0, offsets[k], sizes[k]); };
  auto state = std::make_shared<RingState>();
  std::vector<Stage> stages;
  for (int s = 0; s + 1 < n; ++s) {
    const int send_k = modulo(r - 1 - s, n), recv_k = modulo(r - 2 - s, n);
    const at::Tensor got = arrival(recv_k);
    stages.push_back(
        {[=](MPI_Comm, std::vector<MPI_Request>& requests) {
           const at::Tensor out = s == 0 ? block(send_k) : state->last;
           return exchange(comm->schedules, r, n, tag, out, got, requests);
         },
         [=] {
           at::Tensor dest = destination(recv_k, s + 2 == n);
           combine(op, block(recv_k), got, dest);
           state->last = dest;
         }});
  }
  return stages;
}

// A buffer for the largest block: where partial reductions arrive when they cannot land in place.
at::Tensor block_buffer(const at::Tensor& like, const std::vector<int64_t>& sizes) {
  return at::empty({*std::max_element(sizes.begin(), sizes.end())}, like.options());
}

}  // namespace

void combine(RedOp op, const at::Tensor& a, const at::Tensor& b, at::Tensor dest) {
  switch (op) {
    case c10d::ReduceOp::SUM: at::add_out(dest, a, b); break;
    case c10d::ReduceOp::PRODUCT: at::mul_out(dest, a, b); break;
    case c10d::ReduceOp::MAX: at::maximum_out(dest, a, b); break;
    default: at::minimum_out(dest, a, b); break;
  }
}

bool ring_reduces(at::ScalarType dtype, RedOp op) {
  const bool number = at::isFloatingType(dtype) || (at::isIntegralType(dtype, /*includeBool=*/false));
  return number && (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::PRODUCT || op == c10d::ReduceOp::MAX ||
                    op == c10d::ReduceOp::MIN);
}

std::vector<Stage> ring_reduce_scatter(const std::shared_ptr<Communicator>& comm, const at::Tensor& input,
                                       const at::Tensor& output, std::vector<int64_t> block_sizes, RedOp op) {
  // Blocks on their way around arrive in one buffer and are reduced into another (a step sends the
  // previous step's reduction while the next partial arrives); the last one into the output.
  const at::Tensor received = block_buffer(input, block_sizes), scratch = block_buffer(input, block_sizes);
  const auto part = [block_sizes](const at::Tensor& buffer, int64_t k) {
    return buffer.narrow(0, 0, block_sizes[static_cast<size_t>(k)]);
  };
  return reduce_scatter_stages(
      comm, input, block_sizes, op, next_tag(*comm), [=](int64_t k) { return part(received, k); },
      [=](int64_t k, bool last) { return last ? output : part(scratch, k); });
}

std::vector<Stage> ring_all_reduce(const std::shared_ptr<Communicator>& comm, const at::Tensor& input,
                                   const at::Tensor& output, RedOp op) {
  const int n = comm->size, r = comm->rank;
  std::vector<int64_t> sizes;
  for (int k = 0; k < n; ++k) sizes.push_back(input.numel() / n + (k < input.numel() % n ? 1 : 0));
  const auto offsets = offsets_of(sizes);
  const auto block = [output, sizes, offsets](int k) { return output.narrow(0, offsets[k], sizes[k]); };
  const int tag = next_tag(*comm);
  // Every block is reduced into its place in the output, member r ending with block r complete. Out of
  // place, a partial reduction arrives in its place in the output, which is reduced in place: no
  // buffer, and no more memory traffic than in place (where the arrival cannot overwrite the input).
  const bool in_place = input.data_ptr() == output.data_ptr();
  const at::Tensor received = in_place ? block_buffer(input, sizes) : at::Tensor();
  const auto arrival = [=](int64_t k) {
    return in_place ? received.narrow(0, 0, sizes[static_cast<size_t>(k)]) : block(static_cast<int>(k));
  };
  auto stages = reduce_scatter_stages(comm, input, sizes, op, tag, arrival,
                                      [=](int64_t k, bool) { return block(static_cast<int>(k)); });
  // Then the complete blocks go around: step s sends block (r-s) and receives block (r-s-1).
  for (int s = 0; s + 1 < n; ++s) {
    const int send_k = modulo(r - s, n), recv_k = modulo(r - s - 1, n);
    stages.push_back({[=](MPI_Comm, std::vector<MPI_Request>& requests) {
                        return exchange(comm->schedules, r, n, tag, block(send_k), block(recv_k), requests);
                      },
                      nullptr});
  }
  return stages;
}

}  // namespace dtensor::detail::mpi
