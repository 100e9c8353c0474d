// The target of the node-local checkpoint test (node_local_checkpoint.sh):
//   checkpoint_job save DIR   every rank on a 1-d mesh (TP over the world) saves the state node-locally
//   checkpoint_job load DIR   every rank on a DP x TP mesh of 2 x (world / 2) loads it node-locally
// The state's whole tensors come from a fixed seed (uneven sizes, float, bf16 and a plain int tensor),
// so a load checks its shards bit for bit against them. It also checks the bytes it received against
// the minimum: its shard's bytes less those in the files its node's directory holds (the saved layout's
// pieces, written by the ranks the file names give), and rank 0 prints the least that must cross the
// network (each distinct box of the loaded layout once per node needing it, less what that node holds).
// Prints one line per rank; exits 1 on a mismatch.
// DTENSOR_TEST_SCALE=S makes the leading dims S times longer (the bench's run).

#include <ATen/ATen.h>
#include <dtensor/checkpoint.h>
#include <dtensor/dtensor.h>
#include <dtensor/pieces.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace {

using namespace dtensor;

struct Entry {
  const char* name;
  at::Tensor whole;
  Placements saved;   // on the save's 1-d mesh
  Placements loaded;  // on the load's 2-d mesh
};

// DTENSOR_TEST_SCALE (default 1) multiplies the leading dims, for the bench's larger state.
std::vector<Entry> entries() {
  const int64_t s = std::getenv("DTENSOR_TEST_SCALE") ? std::atoll(std::getenv("DTENSOR_TEST_SCALE")) : 1;
  at::manual_seed(7);
  return {
      {"w1", at::randn({37 * s, 23}), {Shard(0)}, {Replicate(), Shard(1)}},
      {"w2", at::randn({29 * s, 41}), {Shard(1)}, {Shard(0), Shard(0)}},
      {"b", at::randn({50 * s}), {Replicate()}, {Replicate(), Shard(0)}},
      {"emb", at::randn({33 * s, 16}).to(at::kBFloat16), {Shard(0)}, {Shard(1), Replicate()}},
      {"step", at::arange(5, at::kLong), {}, {}},  // plain: every rank holds it whole
  };
}

Box whole_box(const at::Tensor& t) { return Box{Shape(t.dim(), 0), t.sizes().vec()}; }

// The saved ranks whose files this node's directory holds.
std::set<int64_t> writers_here(const std::string& dir) {
  std::set<int64_t> out;
  const std::regex file("model-(\\d+)-of-\\d+\\.safetensors");
  std::smatch m;
  if (std::filesystem::is_directory(dir))
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (std::regex_match(name, m, file)) out.insert(std::stoll(m[1]) - 1);
    }
  return out;
}

int save(const std::shared_ptr<World>& world, const std::string& dir) {
  auto mesh = DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
  checkpoint::State state;
  for (const Entry& e : entries())
    state[e.name] = e.saved.empty() ? e.whole : distribute_tensor(e.whole, mesh, e.saved);
  const auto result = checkpoint::save(state, dir, {.node_local = true});
  std::printf("rank %d on %s: saved %s\n", world->rank(), host_name().c_str(),
              std::filesystem::path(result.file).filename().c_str());
  return 0;
}

// The elements of `box` that lie in the saved pieces written by `writers`.
int64_t held_in(const Box& box, const std::vector<Piece>& saved, const std::set<int64_t>& writers) {
  int64_t held = 0;
  for (const Piece& p : saved)
    if (const auto part = intersect(p.box, box); part && writers.count(p.holders.front())) held += numel(part->shape);
  return held;
}

int load(const std::shared_ptr<World>& world, const std::string& dir) {
  auto mesh = DeviceMesh::create(world, {2, world->size() / 2}, {.dim_names = {"dp", "tp"}});
  const int64_t saved_world = 4;  // the save ran TP=4
  std::vector<int64_t> saved_ranks(saved_world), all_ranks(static_cast<size_t>(world->size()));
  for (int64_t r = 0; r < saved_world; ++r) saved_ranks[static_cast<size_t>(r)] = r;
  for (int r = 0; r < world->size(); ++r) all_ranks[static_cast<size_t>(r)] = r;
  // Every rank's host and the writers whose files its node holds.
  const std::vector<std::string> hosts = world->gather_across_ranks(host_name());
  std::map<std::string, std::set<int64_t>> writers_on;
  writers_on[host_name()] = writers_here(dir);
  for (const std::string& listed : world->gather_across_ranks([&] {
         std::string out = host_name();
         for (int64_t w : writers_here(dir)) out += " " + std::to_string(w);
         return out;
       }())) {
    std::istringstream in(listed);
    std::string host;
    in >> host;
    for (int64_t w; in >> w;) writers_on[host].insert(w);
  }
  checkpoint::State state;
  int64_t minimum = 0, node_minimum = 0;  // this rank's; every node's (each distinct box once per node)
  for (const Entry& e : entries()) {
    const at::Tensor zeros = at::zeros_like(e.whole);
    state[e.name] = e.loaded.empty() ? zeros : distribute_tensor(zeros, mesh, e.loaded);
    const Shape global = e.whole.sizes().vec();
    const std::vector<Piece> saved = e.saved.empty() ? std::vector<Piece>{Piece{whole_box(e.whole), {0}}}
                                                     : pieces_of(global, {saved_world}, saved_ranks, e.saved);
    const std::vector<Piece> loaded = e.loaded.empty() ? std::vector<Piece>{Piece{whole_box(e.whole), all_ranks}}
                                                       : pieces_of(global, mesh->shape(), mesh->ranks(), e.loaded);
    const int64_t element = static_cast<int64_t>(e.whole.element_size());
    for (const Piece& p : loaded) {
      std::set<std::string> needing;
      for (int64_t holder : p.holders) {
        needing.insert(hosts[static_cast<size_t>(holder)]);
        if (holder == world->rank()) minimum += (numel(p.box.shape) - held_in(p.box, saved, writers_on[host_name()])) * element;
      }
      for (const std::string& host : needing) node_minimum += (numel(p.box.shape) - held_in(p.box, saved, writers_on[host])) * element;
    }
  }
  const auto result = checkpoint::load(state, dir, {.node_local = true});
  bool equal = true;
  for (const Entry& e : entries()) {
    const at::Tensor& got = state.at(e.name);
    const at::Tensor expected = e.loaded.empty() ? e.whole : local_tensor_of(distribute_tensor(e.whole, mesh, e.loaded));
    if (!at::equal(is_dtensor(got) ? local_tensor_of(got) : got, expected)) {
      std::printf("rank %d: tensor %s differs from the saved one\n", world->rank(), e.name);
      equal = false;
    }
  }
  std::printf("rank %d on %s: node holds the files of %zu saved ranks; read %lld bytes, received %lld (minimum %lld), "
              "%lld of them across nodes, sent %lld\n",
              world->rank(), host_name().c_str(), writers_on[host_name()].size(), static_cast<long long>(result.bytes_read),
              static_cast<long long>(result.bytes_received), static_cast<long long>(minimum),
              static_cast<long long>(result.bytes_received_from_other_nodes), static_cast<long long>(result.bytes_sent));
  if (world->rank() == 0) std::printf("across nodes at least %lld bytes\n", static_cast<long long>(node_minimum));
  if (equal && result.bytes_received == minimum) {
    std::printf("rank %d: bit for bit\n", world->rank());
    return 0;
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "load")) {
    std::fprintf(stderr, "usage: %s save|load DIR\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  return dtensor::run_local_ranks(argc, argv, {}, [&](const std::shared_ptr<dtensor::World>& world) {
    return mode == "save" ? save(world, dir) : load(world, dir);
  });
}
