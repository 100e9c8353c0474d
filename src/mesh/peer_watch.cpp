#include "peer_watch.h"

#include "dtensor/world.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace dtensor::detail {
namespace {

using Clock = PeerWatch::Clock;

std::string beat_key(int64_t rank) { return "dtensor/beat/" + std::to_string(rank); }

// Added to a rank's counter when its world shuts down: a peer that left is not a hung one.
constexpr int64_t kLeft = -(int64_t{1} << 40);

// What process `pid` on this host is doing, as far as a rank's error cares.
enum class Process { Running, Stopped, Exited };

Process process_state(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH ? Process::Exited : Process::Running;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  stat >> pid_field >> comm >> state;  // comm has no spaces for our ranks' executables
  if (state == "Z" || state == "X") return Process::Exited;  // a zombie not yet reaped
  if (state == "T" || state == "t") return Process::Stopped;
  return Process::Running;
}

std::string seconds(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

}  // namespace

struct PeerWatch::State {
  c10::intrusive_ptr<c10d::Store> store;
  int rank;
  std::chrono::milliseconds interval;
  std::string host = host_name();

  mutable std::mutex mutex;
  std::condition_variable wake;  // stop requested
  std::condition_variable ended;  // the thread finished
  bool stop = false;
  bool done = false;
  std::vector<Peer> peers;
  Clock::time_point store_answered;
  std::chrono::milliseconds give_up_after;
  std::function<void()> abandon_store;

  Clock::duration silent_after() const { return interval * kSilentBeats; }

  // One beat: this rank's counter up, every peer's read (add 0 reads without waiting for the key).
  void beat() {
    store->add(beat_key(rank), 1);
    for (int64_t r = 0; r < static_cast<int64_t>(peers.size()); ++r) {
      if (r == rank) continue;
      const int64_t beats = store->add(beat_key(r), 0);
      bool read_entry = false;
      {
        std::lock_guard<std::mutex> lock(mutex);
        Peer& p = peers[static_cast<size_t>(r)];
        if (beats != p.beats) p.last_beat = Clock::now();
        p.beats = beats;
        read_entry = p.host.empty() && beats != 0;  // a beating peer wrote its entry before its first beat
      }
      if (read_entry) read_process(*store, r);
    }
    std::lock_guard<std::mutex> lock(mutex);
    store_answered = Clock::now();
  }

  void read_process(c10d::Store& from, int64_t r) {
    const auto bytes = from.get(process_key(r));
    std::istringstream entry(std::string(bytes.begin(), bytes.end()));
    std::lock_guard<std::mutex> lock(mutex);
    entry >> peers[static_cast<size_t>(r)].host >> peers[static_cast<size_t>(r)].pid;
  }

  void monitor() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_for(lock, interval, [&] { return stop; })) {
      if (Clock::now() - store_answered <= give_up_after || !abandon_store) continue;
      auto abandon = std::move(abandon_store);
      abandon_store = nullptr;
      lock.unlock();
      abandon();
      lock.lock();
    }
  }

  void run() {
    for (;;) {
      try {
        beat();
      } catch (const std::exception&) {
        // the store is unreachable or gone: store_answered stops moving, which is what errors report
      }
      std::unique_lock<std::mutex> lock(mutex);
      if (wake.wait_for(lock, interval, [&] { return stop; })) break;
    }
    try {
      store->add(beat_key(rank), kLeft);
    } catch (const std::exception&) {
    }
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    ended.notify_all();
  }
};

PeerWatch::PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds interval,
                     std::chrono::milliseconds give_up_after, std::function<void()> abandon_store)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->rank = rank;
  state_->interval = interval;
  state_->give_up_after = give_up_after;
  state_->abandon_store = std::move(abandon_store);
  const auto now = Clock::now();
  state_->peers.assign(static_cast<size_t>(size), Peer{"", 0, 0, now});
  state_->store_answered = now;
  thread_ = std::thread([state = state_] { state->run(); });
  monitor_ = std::thread([state = state_] { state->monitor(); });
}

PeerWatch::~PeerWatch() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stop = true;
  state_->wake.notify_all();
  // A thread blocked on an unreachable store would hold up this process's exit: leave it (it owns
  // what it uses through the shared state) and let it end with the process. A store already quiet is
  // not waited for at all.
  const bool store_quiet = Clock::now() - state_->store_answered > state_->silent_after();
  const bool finished =
      !store_quiet && state_->ended.wait_for(lock, 2 * state_->interval, [&] { return state_->done; });
  lock.unlock();
  monitor_.join();
  if (finished) thread_.join();
  else thread_.detach();
}

void PeerWatch::learn_processes(c10d::Store& store, const std::vector<int64_t>& ranks) {
  for (int64_t r : ranks) {
    if (r == state_->rank || r < 0 || r >= static_cast<int64_t>(state_->peers.size())) continue;
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      known = !state_->peers[static_cast<size_t>(r)].host.empty();
    }
    if (!known) state_->read_process(store, r);
  }
}

std::string PeerWatch::process_entry() { return host_name() + " " + std::to_string(getpid()); }

std::string PeerWatch::process_key(int64_t rank) { return "dtensor/process/" + std::to_string(rank); }

std::string PeerWatch::describe(const std::vector<int64_t>& ranks) const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto now = Clock::now();
  const bool store_quiet = now - s.store_answered > s.silent_after();
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "; ") + part; };
  for (int64_t r : ranks) {
    if (r == s.rank || r < 0 || r >= static_cast<int64_t>(s.peers.size())) continue;
    const Peer& p = s.peers[static_cast<size_t>(r)];
    const std::string who = "rank " + std::to_string(r) + " on " + (p.host.empty() ? "an unknown host" : p.host) +
                            (p.pid > 0 ? " (pid " + std::to_string(p.pid) + ")" : "");
    const bool here = p.host == s.host;
    const Process process = here && p.pid > 0 ? process_state(p.pid) : Process::Running;
    if (process == Process::Exited) add(who + " has exited");
    else if (process == Process::Stopped) add(who + " is stopped (by a signal such as SIGSTOP)");
    else if (p.beats < 0) add(who + " has left the job (its world was shut down)");
    else if (store_quiet && !here) add(who + " is unreachable from here");
    else if (!store_quiet && now - p.last_beat > s.silent_after())
      add(who + (p.host.empty() ? " never reached the store" : " has been silent for " + seconds(now - p.last_beat)) +
          " (stopped, hung, or its host is down or cut off)");
  }
  if (store_quiet)
    out = "the job's store has not answered this rank (on " + s.host + ") for " + seconds(now - s.store_answered) +
          ": this host is cut off from it, or the store's host is down or stopped" + (out.empty() ? "" : "; " + out);
  return out;
}

std::string PeerWatch::describe_after_settling(const std::vector<int64_t>& ranks) const {
  const auto deadline = Clock::now() + state_->silent_after() + state_->interval;
  while (describe(ranks).empty() && Clock::now() < deadline) std::this_thread::sleep_for(state_->interval / 4);
  // Peers that went down together (a whole host) beat at different moments: the last of them turns
  // silent up to one interval after the first.
  std::this_thread::sleep_for(state_->interval * 5 / 4);
  return describe(ranks);
}

}  // namespace dtensor::detail
