#pragma once
// What a rank knows about its peers without waiting on the network, for the errors it raises when a
// collective, a group's creation or an agreement through the store fails.
//
// A thread beats a counter per rank in the world's store (over its own connection, so a store that
// stops answering blocks only this thread) and notes, on this rank's clock, when each peer's counter
// last moved and when the store last answered. A peer that is stopped, hung, dead on another host or
// cut off from the store stops beating; a rank whose own node is cut off sees the store go quiet. At
// the moment of an error the answer is read from memory: it never waits on a peer or the store. A
// store silent for the whole timeout is given up on, so that no call of this rank waits on it forever.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace c10d {
class Store;
}

namespace dtensor::detail {

class PeerWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // `store` is this watch's own connection (a clone of the world's store). `interval`: time between
  // beats; a peer is silent after kSilentBeats intervals without a beat. When the store has not
  // answered for `give_up_after` (the world's timeout), `abandon_store` runs once, on a thread of the
  // watch: it makes the calls still blocked on the store fail (see StoreConnections).
  PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds interval,
            std::chrono::milliseconds give_up_after, std::function<void()> abandon_store);
  // Stops the thread; one blocked in the store (its host unreachable) is left to end with the process.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  static constexpr int kSilentBeats = 3;

  // One line on the peers among `ranks` that are not answering (exited, silent, or beyond a store this
  // rank cannot reach), each with its host; empty when every one of them is beating.
  std::string describe(const std::vector<int64_t>& ranks) const;
  // Waits (at most until a peer could have been declared silent) for the watch to see one of `ranks`
  // exited or silent, and one beat more for others that went down with it, then describes them: a peer
  // that just died is not silent yet at the moment its connections fail.
  std::string describe_after_settling(const std::vector<int64_t>& ranks) const;

  // Reads, through `store`, where each of `ranks` runs (unless known already), so that errors can name
  // hosts even when a fault comes before the first heartbeat: called once the ranks have formed a group.
  void learn_processes(c10d::Store& store, const std::vector<int64_t>& ranks);

  // "host pid" of this process, written under process_key(rank) when the world starts.
  static std::string process_entry();
  static std::string process_key(int64_t rank);

 private:
  struct Peer {
    std::string host;  // empty until its process entry has been read
    int64_t pid = 0;
    int64_t beats = 0;
    Clock::time_point last_beat;  // when this rank saw its counter move (or the watch began)
  };
  struct State;  // shared with the thread, which may outlive this object when blocked in the store

  std::shared_ptr<State> state_;
  std::thread thread_;   // beats, blocking on the store
  std::thread monitor_;  // never blocks: gives up on a store that stopped answering
};

}  // namespace dtensor::detail
