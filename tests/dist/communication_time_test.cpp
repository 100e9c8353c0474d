// CommunicationTime (dtensor/comm_debug.h) between real processes, on MPI and Gloo: it counts what a
// rank spends blocked in communication (a collective waiting for a late rank, a wait for a transfer
// that has not come), not what a transfer spends in flight while the rank computes; nested counts see
// the same; a profiler's callbacks see the spans as "dtensor::<operation>". The late ranks are made
// late by sleeping 300 ms, and the bounds leave 100 ms of slack either way.

#include <ATen/record_function.h>

#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "dtensor/comm_debug.h"
#include "dtensor/p2p.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

constexpr auto kLate = std::chrono::milliseconds(300);
constexpr double kLateSeconds = 0.3, kSlackSeconds = 0.1;

class CommunicationTimeTest : public DistTest {};

TEST_F(CommunicationTimeTest, ACollectiveWaitingForALateRankIsCounted) {
  const MeshPtr m = mesh({4});
  const bool first = m->local_rank(0) == 0;
  const CommunicationTime outer;
  double blocked = 0;
  {
    const CommunicationTime inner;
    if (!first) std::this_thread::sleep_for(kLate);
    const at::Tensor summed = to_local(redistribute(from_local(at::ones({3}), m, {Partial()}), m, {Replicate()}));
    EXPECT_TRUE(tensors_equal(summed, at::full({3}, 4.0)));
    blocked = inner.seconds();
  }
  if (first) EXPECT_GE(blocked, kLateSeconds - kSlackSeconds);
  EXPECT_EQ(outer.seconds(), blocked);  // the sleep outside communication is not counted, on any rank
}

TEST_F(CommunicationTimeTest, ATransferThatArrivedWhileTheRankComputedIsNotCounted) {
  const MeshPtr m = mesh({4});
  const int64_t rank = m->local_rank(0);
  at::Tensor buffer = at::full({8}, static_cast<double>(rank));
  for (const bool receiver_computes_first : {true, false}) {
    SCOPED_TRACE(receiver_computes_first ? "the receiver computes while the transfer travels" : "the sender is late");
    m->group(0)->barrier()->wait();  // both start the case together
    const CommunicationTime counted;
    if (rank > 1) continue;
    if (rank == 1) {
      if (!receiver_computes_first) std::this_thread::sleep_for(kLate);
      send(buffer, 0, m, 0, "to rank 0");
      continue;
    }
    P2PWork arriving = irecv(buffer, 1, m, 0, "from rank 1");
    if (receiver_computes_first) std::this_thread::sleep_for(kLate);
    arriving.wait();
    EXPECT_TRUE(tensors_equal(buffer, at::full({8}, 1.0)));
    if (receiver_computes_first) EXPECT_LT(counted.seconds(), kSlackSeconds);
    else EXPECT_GE(counted.seconds(), kLateSeconds - kSlackSeconds);
  }
}

TEST_F(CommunicationTimeTest, ProfilersSeeTheSpansByOperation) {
  const MeshPtr m = mesh({4});
  // The callbacks also run on threads a backend's work takes this thread's state to (Gloo's), and see
  // spans of PyTorch's own without a name.
  static std::mutex guard;
  static std::set<std::string> seen;
  seen.clear();
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& f) -> std::unique_ptr<at::ObserverContext> {
        const std::lock_guard<std::mutex> lock(guard);
        if (const char* name = f.name()) seen.insert(name);
        return nullptr;
      }).scopes({at::RecordScope::USER_SCOPE}));
  full_tensor(from_local(at::ones({4}), m, {Shard(0)}));
  at::removeCallback(handle);
  EXPECT_EQ(seen.count("dtensor::all-gather"), 1u) << "spans seen: " << seen.size();
}

}  // namespace
}  // namespace dtensor::testing
