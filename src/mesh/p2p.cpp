// Point-to-point transfers along one mesh dim (dtensor/p2p.h): c10d send and recv on the dim's process
// group, waited for under the collectives' time limit, failures named by comm_failure.

#include "dtensor/p2p.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <optional>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "comm_failure.h"
#include "communication_span.h"
#include "dtensor/comm_debug.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"
#include "mesh_group.h"

namespace dtensor {
namespace detail {

// One started transfer (or, coalesced, a whole batch): what it is, for errors, and its work.
struct P2PTransfer {
  std::string operation;        // "send to coordinate 1 (rank 3) [label]"
  std::optional<int64_t> peer;  // none for a coalesced batch (any member may be its cause)
  c10::intrusive_ptr<c10d::Work> work;
};

struct P2PInFlight {
  MeshPtr mesh;
  int64_t dim = 0;
  std::vector<P2PTransfer> transfers;
  std::vector<at::Tensor> buffers;  // what the transfers read or write, alive until they complete
  bool complete = false;
  std::optional<DTensorError> error;  // the first failure, raised again by every later wait

  // Waits for every transfer; keeps the first failure (the rest are waited for all the same). Each wait is
  // timed from its own start, not from the post: a receive posted long before is not "past the time
  // limit" at once, nor a quick failure after a slow transfer.
  void wait_all() {
    const CommunicationSpan blocked("wait for transfers");
    for (P2PTransfer& t : transfers) {
      if (!t.work) continue;
      const auto start = std::chrono::steady_clock::now();
      try {
        t.work->wait();
      } catch (const std::exception& e) {
        if (!error) error = failure(*mesh, dim, t.operation, start, e, t.peer);
      }
      t.work.reset();
    }
    buffers.clear();
    complete = true;
  }

  ~P2PInFlight() {
    if (!complete) wait_all();  // a handle dropped unwaited: its buffers may still be in use
  }
};

}  // namespace detail

namespace {

std::string describe(const P2POp& op, const DeviceMesh& mesh, int64_t dim) {
  Shape peer = *mesh.coordinate();
  peer[dim] = op.peer;
  return std::string(op.kind == P2POp::Kind::Send ? "send to" : "recv from") + " coordinate " + std::to_string(op.peer) +
         " (rank " + std::to_string(mesh.global_rank_at(peer)) + ")" + (op.label.empty() ? "" : " [" + op.label + "]");
}

void check(const MeshPtr& mesh, int64_t dim, const std::vector<P2POp>& ops) {
  if (!mesh) throw DTensorError("batch_isend_irecv: no mesh given");
  if (dim < 0 || dim >= mesh->ndim())
    throw DTensorError("batch_isend_irecv: dim " + std::to_string(dim) + " is not a dim of " + mesh->str());
  if (!mesh->coordinate())
    throw DTensorError("batch_isend_irecv: rank " + std::to_string(mesh->world()->rank()) + " is not in " + mesh->str() +
                       "; only its members transfer along its dims");
  const int64_t self = (*mesh->coordinate())[static_cast<size_t>(dim)];
  for (const P2POp& op : ops) {
    const std::string what = std::string(op.kind == P2POp::Kind::Send ? "send" : "recv") + (op.label.empty() ? "" : " [" + op.label + "]");
    if (op.peer < 0 || op.peer >= mesh->size(dim))
      throw DTensorError("rank " + std::to_string(mesh->world()->rank()) + ": " + what + ": peer coordinate " + std::to_string(op.peer) +
                         " is outside " + mesh->dim_label(dim) + " (size " + std::to_string(mesh->size(dim)) + ")");
    if (op.peer == self)
      throw DTensorError("rank " + std::to_string(mesh->world()->rank()) + ": " + what + ": the peer is this rank itself (coordinate " +
                         std::to_string(self) + " along " + mesh->dim_label(dim) + ")");
    if (!op.tensor.defined())
      throw DTensorError("rank " + std::to_string(mesh->world()->rank()) + ": " + what + ": the tensor is undefined");
    if (op.tag < 0 || (op.tag >= 1 && op.tag <= 32000) || (op.tag != 0 && mesh->backend() == CommBackend::Nccl))
      throw DTensorError("rank " + std::to_string(mesh->world()->rank()) + ": " + what + ": tag " + std::to_string(op.tag) +
                         (op.tag != 0 && mesh->backend() == CommBackend::Nccl ? " on NCCL, which keeps one order for every tag: use 0"
                                                                               : " is negative or among the MPI backend's collectives' (1..32000): use 0 or above 32000"));
    if (op.kind == P2POp::Kind::Recv && (!op.tensor.is_contiguous() || op.tensor.is_conj() || op.tensor.is_neg()))
      throw DTensorError("rank " + std::to_string(mesh->world()->rank()) + ": " + what +
                         ": the receiving tensor is not contiguous (or is a conjugate or negative view); receive into a "
                         "contiguous one and copy");
  }
}

// What travels for `op`: a send's values in a contiguous tensor of their own (conjugate and negative
// views resolved), a receive's buffer itself; complex ones as real pairs.
at::Tensor buffer_of(const P2POp& op) {
  if (op.kind == P2POp::Kind::Recv) return detail::as_real(op.tensor);
  return detail::as_real(op.tensor.resolve_conj().resolve_neg().contiguous());
}

}  // namespace

void P2PWork::wait() {
  if (!in_flight_) return;
  if (!in_flight_->complete) in_flight_->wait_all();
  if (in_flight_->error) throw *in_flight_->error;
}

P2PWork batch_isend_irecv(const MeshPtr& mesh, int64_t dim, std::vector<P2POp> ops) {
  check(mesh, dim, ops);
  auto f = std::make_shared<detail::P2PInFlight>();
  f->mesh = mesh;
  f->dim = dim;
  if (ops.empty()) {
    f->complete = true;
    return P2PWork(f);
  }
  auto group = mesh->group(dim);
  const detail::MeshGroup::Exclusive exclusive(mesh->group_holder(dim), [&] { return detail::where(*mesh, dim, "batch_isend_irecv"); });
  // NCCL must launch a batch's sends and receives as one group call, or two ranks sending to each
  // other first would wait forever; MPI and Gloo post each at once.
  const bool coalesce = group->getBackendName() == "nccl";
  // Every buffer made before anything is posted: what fails below is the transfer, not a copy.
  std::vector<at::Tensor>& buffers = f->buffers;
  for (const P2POp& op : ops) buffers.push_back(buffer_of(op));
  const detail::CommunicationSpan blocked("post transfers");
  const auto start = std::chrono::steady_clock::now();
  size_t launching = 0;
  try {
    if (coalesce) group->startCoalescing();
    for (; launching < ops.size(); ++launching) {
      const P2POp& op = ops[launching];
      const bool sending = op.kind == P2POp::Kind::Send;
      if (auto* debug = CommDebugMode::active()) debug->record_collective(sending ? "send" : "recv", dim, buffers[launching].nbytes());
      std::vector<at::Tensor> one{buffers[launching]};
      const int peer = static_cast<int>(op.peer);
      auto work = sending ? group->send(one, peer, op.tag) : group->recv(one, peer, op.tag);
      f->transfers.push_back({describe(op, *mesh, dim), op.peer, std::move(work)});
    }
    if (coalesce)  // one work for the whole batch, named as such: a failure cannot tell which transfer
      f->transfers = {{"batch_isend_irecv of " + std::to_string(ops.size()) + " transfers (the first: " + describe(ops.front(), *mesh, dim) + ")",
                       std::nullopt, group->endCoalescing()}};
  } catch (const std::exception& e) {
    if (coalesce) {  // leave the group's coalescing mode, or its next collectives would only be queued
      try {
        if (auto batch = group->endCoalescing()) f->transfers.push_back({"", std::nullopt, batch});
      } catch (const std::exception&) {
      }
    }
    const P2POp& failed = ops[std::min(launching, ops.size() - 1)];
    f->wait_all();  // what started must finish before its buffers go
    throw detail::failure(*mesh, dim, describe(failed, *mesh, dim), start, e, failed.peer);
  }
  return P2PWork(f);
}

P2PWork isend(const at::Tensor& tensor, int64_t to, const MeshPtr& mesh, int64_t dim, const std::string& label) {
  return batch_isend_irecv(mesh, dim, {P2POp{P2POp::Kind::Send, tensor, to, label}});
}

P2PWork irecv(const at::Tensor& into, int64_t from, const MeshPtr& mesh, int64_t dim, const std::string& label) {
  return batch_isend_irecv(mesh, dim, {P2POp{P2POp::Kind::Recv, into, from, label}});
}

void send(const at::Tensor& tensor, int64_t to, const MeshPtr& mesh, int64_t dim, const std::string& label) {
  isend(tensor, to, mesh, dim, label).wait();
}

void recv(const at::Tensor& into, int64_t from, const MeshPtr& mesh, int64_t dim, const std::string& label) {
  irecv(into, from, mesh, dim, label).wait();
}

}  // namespace dtensor
