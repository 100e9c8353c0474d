// Agreements through the store (World::sum_across_ranks) with patience, under a 1 s world timeout
// (DTENSOR_TIMEOUT_S=1): a rank that arrives 2.5 s late but lives is waited for; without patience the
// others give up on it; with patience, a rank that exits is still named within the world's timeout.
// Each rank prints "OK rank R" when every part went as it should.

#include <dtensor/errors.h>
#include <dtensor/launch.h>
#include <dtensor/world.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

namespace {

constexpr std::chrono::milliseconds kLate{2500};
constexpr std::chrono::milliseconds kPatience{60'000};

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const dtensor::DTensorError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

int main(int argc, char** argv) {
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 3}, [](const std::shared_ptr<dtensor::World>& world) {
    const int rank = world->rank();
    using Clock = std::chrono::steady_clock;
    // 1. Rank 0 late and alive, everyone patient: the sum arrives.
    if (rank == 0) std::this_thread::sleep_for(kLate);
    const int64_t sum = world->sum_across_ranks(rank + 1, "patient", kPatience);
    bool ok = sum == 6;
    std::printf("rank %d: a late, live rank 0 with patience: sum %lld\n", rank, static_cast<long long>(sum));
    // 2. The same without patience: ranks 1 and 2 give up within the world's timeout.
    if (rank == 0) std::this_thread::sleep_for(kLate);
    const std::string impatient = error_of([&] { world->sum_across_ranks(0, "impatient"); });
    if (rank != 0) ok = ok && impatient.find("rank 0 did not report within the world's timeout") != std::string::npos;
    std::printf("rank %d: without patience: %s\n", rank, impatient.c_str());
    // 3. With patience, rank 2 exits: the others name it, long before the patience runs out.
    if (rank == 2) _exit(3);
    const Clock::time_point start = Clock::now();
    const std::string exited = error_of([&] { world->sum_across_ranks(0, "dead peer", kPatience); });
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    ok = ok && exited.find("rank 2 did not report: rank 2 on ") != std::string::npos && exited.find("has exited") != std::string::npos && took < 10;
    std::printf("rank %d: patient, rank 2 exited: after %.1f s: %s\n", rank, took, exited.c_str());
    if (ok) std::printf("OK rank %d\n", rank);
    return 0;
  });
}
