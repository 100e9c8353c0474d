// Point-to-point transfers along a mesh dim (dtensor/p2p.h) between real processes, on MPI and Gloo:
// rings along every dim of the 1-d mesh of 4 and the 2x2 one, of tensors whose shape and dtype depend on
// the sender (uneven, complex and non-contiguous ones included), each checked against the value the
// sender's rank computes (made here again from its rank); blocking pairs; bad input refused before
// anything is sent; a peer that never sends named, with the transfer's label, after the time limit.

#include <c10/util/complex.h>

#include "dtensor/p2p.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

const at::ScalarType kP2pDtypes[] = {at::kFloat, at::kDouble, at::kLong, at::kComplexFloat};

// What the rank `sender` sends on a ring step: rows depend on the sender, so shapes are uneven.
at::Tensor p2p_payload(int64_t sender, at::ScalarType dtype) {
  at::Tensor t = at::arange((sender + 1) * 3, at::kDouble).mul(sender + 2).sub(5).reshape({sender + 1, 3});
  if (dtype == at::kComplexFloat) return at::complex(t.to(at::kFloat), t.neg().to(at::kFloat));
  return t.to(dtype);
}

class P2pTest : public DistTest {};

TEST_F(P2pTest, RingsAlongEveryMeshDimCarryEachSendersTensor) {
  for (const MeshPtr& m : meshes()) {
    for (int64_t dim = 0; dim < m->ndim(); ++dim) {
      const int64_t n = m->size(dim), self = (*m->coordinate())[static_cast<size_t>(dim)];
      Shape c = *m->coordinate();
      c[static_cast<size_t>(dim)] = (self + n - 1) % n;
      const int64_t from_rank = m->global_rank_at(c);
      for (at::ScalarType dtype : kP2pDtypes) {
        SCOPED_TRACE(m->str() + " dim " + std::to_string(dim) + " " + c10::toString(dtype));
        at::Tensor sent = p2p_payload(world()->rank(), dtype);
        if (dtype == at::kDouble) sent = sent.t().contiguous().t();  // non-contiguous: sent as a copy
        at::Tensor received = at::empty_like(p2p_payload(from_rank, dtype));
        // Each rank sends first and receives second: the batch posts both before waiting.
        batch_isend_irecv(m, dim, {{P2POp::Kind::Send, sent, (self + 1) % n, "ring"}, {P2POp::Kind::Recv, received, (self + n - 1) % n, "ring"}})
            .wait();
        EXPECT_TRUE(tensors_equal(received, p2p_payload(from_rank, dtype)));
      }
    }
  }
}

TEST_F(P2pTest, BlockingPairsAndSeveralTransfersToOnePeerArriveInOrder) {
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "dp"});
  const int64_t stage = (*m->coordinate())[0];
  const at::Tensor first = at::full({4}, 10.0 + world()->rank()), second = at::full({2, 2}, 20.0 + world()->rank());
  if (stage == 0) {
    send(first, 1, m, 0, "stage 0 -> 1: activations");
    send(second, 1, m, 0, "stage 0 -> 1: activations");
  } else {
    const int64_t from = m->global_rank_at({0, (*m->coordinate())[1]});
    at::Tensor a = at::empty({4}), b = at::empty({2, 2});
    P2PWork got_a = irecv(a, 0, m, 0, "stage 0 -> 1");
    recv(b, 0, m, 0, "stage 0 -> 1");
    got_a.wait();
    got_a.wait();  // a second wait does nothing
    EXPECT_TRUE(tensors_equal(a, at::full({4}, 10.0 + from)));
    EXPECT_TRUE(tensors_equal(b, at::full({2, 2}, 20.0 + from)));
  }
}

// Order holds per tag: a receive on one tag passes over a transfer sent earlier on another.
TEST_F(P2pTest, TransfersOnAnotherTagKeepTheirOwnOrder) {
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "dp"});
  const int64_t stage = (*m->coordinate())[0];
  constexpr int kHeaders = 32100;
  if (stage == 0) {
    batch_isend_irecv(m, 0, {P2POp{P2POp::Kind::Send, at::full({3}, 1.0), 1, "header", kHeaders}, P2POp{P2POp::Kind::Send, at::full({5}, 2.0), 1, "data"},
                             P2POp{P2POp::Kind::Send, at::full({3}, 3.0), 1, "header", kHeaders}})
        .wait();
  } else {
    at::Tensor data = at::empty({5}), first = at::empty({3}), second = at::empty({3});
    recv(data, 0, m, 0, "data");  // posted first, yet it takes the second send: the only one on tag 0
    batch_isend_irecv(m, 0, {P2POp{P2POp::Kind::Recv, first, 0, "header", kHeaders}, P2POp{P2POp::Kind::Recv, second, 0, "header", kHeaders}}).wait();
    EXPECT_TRUE(tensors_equal(data, at::full({5}, 2.0)));
    EXPECT_TRUE(tensors_equal(first, at::full({3}, 1.0)));
    EXPECT_TRUE(tensors_equal(second, at::full({3}, 3.0)));
  }
}

TEST_F(P2pTest, RefusesBadInputBeforeSendingAnything) {
  const MeshPtr m = mesh({4}, {}, {"pp"});
  const int64_t r = world()->rank();
  const std::string me = "rank " + std::to_string(r) + ": ";
  EXPECT_THAT(error_of([&] { send(at::ones({2}), 4, m, 0, "stage 3 -> 4"); }),
              HasSubstr(me + "send [stage 3 -> 4]: peer coordinate 4 is outside mesh dim 0 (pp) (size 4)"));
  EXPECT_THAT(error_of([&] { send(at::ones({2}), r, m, 0); }), HasSubstr(me + "send: the peer is this rank itself"));
  EXPECT_THAT(error_of([&] { recv(at::ones({2, 3}).t(), (r + 1) % 4, m, 0, "grads"); }),
              HasSubstr(me + "recv [grads]: the receiving tensor is not contiguous"));
  EXPECT_THAT(error_of([&] { recv(at::Tensor(), (r + 1) % 4, m, 0); }), HasSubstr("the tensor is undefined"));
  EXPECT_THAT(error_of([&] { batch_isend_irecv(m, 0, {P2POp{P2POp::Kind::Send, at::ones({2}), (r + 1) % 4, "x", 5}}); }),
              HasSubstr(me + "send [x]: tag 5 is negative or among the MPI backend's collectives' (1..32000)"));
  EXPECT_THAT(error_of([&] { send(at::ones({2}), 1, m, 1); }), HasSubstr("dim 1 is not a dim of"));
  // A batch is checked whole: its good first op is not started either. Were it sent, the ring below would
  // receive its ones instead of the neighbour's rank.
  EXPECT_THAT(error_of([&] {
                batch_isend_irecv(m, 0, {{P2POp::Kind::Send, at::ones({1}), (r + 1) % 4, ""}, {P2POp::Kind::Recv, at::Tensor(), (r + 3) % 4, ""}});
              }),
              HasSubstr("the tensor is undefined"));
  at::Tensor from_previous = at::empty({1});
  batch_isend_irecv(m, 0, {{P2POp::Kind::Send, at::full({1}, 10.0 + r), (r + 1) % 4, ""}, {P2POp::Kind::Recv, from_previous, (r + 3) % 4, ""}})
      .wait();
  EXPECT_EQ(from_previous.item<double>(), 10.0 + (r + 3) % 4);
  // A conjugate view's values are sent, resolved (the receiver sees the conjugate).
  const at::Tensor z = at::complex(at::full({2}, 1.0), at::full({2}, 2.0 + r));
  at::Tensor got = at::empty({2}, z.options());
  batch_isend_irecv(m, 0, {{P2POp::Kind::Send, z.conj(), (r + 1) % 4, ""}, {P2POp::Kind::Recv, got, (r + 3) % 4, ""}}).wait();
  EXPECT_TRUE(tensors_equal(got, at::complex(at::full({2}, 1.0), at::full({2}, -2.0 - (r + 3) % 4))));
}

// Rank 1 waits for a transfer rank 0 never posts: after the mesh's time limit it names the peer and the
// label. Rank 0 then sends (MPI still holds the receive), so nothing is left behind.
TEST_F(P2pTest, APeerThatNeverSendsIsNamedWithTheTransfer) {
  MeshOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.dim_names = {"pp"};
  auto m = DeviceMesh::create(world(), {4}, options);  // its own groups: this test may leave them broken
  const std::string gave_up = "p2p_test/gave-up";
  if (world()->rank() == 0) {
    world()->store()->wait({gave_up}, std::chrono::seconds(60));
    try {
      send(at::ones({3}), 1, m, 0, "late");
    } catch (const DTensorError&) {  // Gloo's side may have given up on the pair
    }
    return;
  }
  if (world()->rank() != 1) return;
  const std::string error = error_of([&] { recv(at::empty({3}), 0, m, 0, "stage 0 -> 1: activations of microbatch 3"); });
  world()->store()->set(gave_up, std::vector<uint8_t>{1});
  EXPECT_THAT(error, HasSubstr("rank 1: recv from coordinate 0 (rank 0) [stage 0 -> 1: activations of microbatch 3] on mesh dim 0 (pp)"));
  EXPECT_THAT(error, HasSubstr("the peer must post the matching transfer"));
}

}  // namespace
}  // namespace dtensor::testing
