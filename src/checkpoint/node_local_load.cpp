// Loading a checkpoint whose files lie in node-local directories (LoadOptions::node_local):
//  1. each rank reads the catalog of its node's share (the files present there, headers validated);
//  2. the ranks tell each other their host and which files they hold, then the first holder of each
//     file describes that file's pieces to all;
//  3. every rank assembles the same global catalog (a file that no node of this job holds is an error
//     naming it and the host that wrote it) and the same plan: for each rank's box of each tensor, each
//     saved piece it overlaps is read by that rank itself when its node holds the file, else read by one
//     rank whose node does (the least loaded so far) and sent to it;
//     A part that several ranks of one node need is sent to the first of them, which forwards it;
//  4. the sends run as all-to-alls of bytes over a mesh of the whole world, in rounds of bounded size
//     (each round's forwards in a second all-to-all).
// So every element crosses the network at most once per node that needs it, and only when that node
// lacks it.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <tuple>

#include "../io/json.h"
#include "../mesh/collectives.h"
#include "dtensor/api.h"
#include "dtensor/device_mesh.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"
#include "dtypes.h"
#include "job.h"
#include "loading.h"

namespace dtensor::checkpoint::detail {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Bytes moved per all-to-all round, all ranks together: bounds the send and receive buffers.
constexpr int64_t kRoundBytes = int64_t{256} << 20;

std::string file_name(const std::string& path) { return fs::path(path).filename().string(); }

// Where the files are, as every rank told the others.
struct Holdings {
  std::vector<std::string> hosts;                   // by rank
  std::map<std::string, std::vector<int>> holders;  // file name -> the ranks whose node holds it, ascending
  std::map<std::string, std::string> listed;        // every file an index names -> the host that wrote it, if recorded
};

Holdings exchange_holdings(const Catalog& local, const Job& job) {
  std::set<std::string> files;
  for (const DescribedPiece& d : local.described()) files.insert(file_name(d.piece.file));
  const json mine = {{"host", host_name()}, {"files", files}, {"listed", local.listed_files()}, {"nodes", local.file_hosts()}};
  Holdings out;
  const std::vector<std::string> all = job.gather(mine.dump());
  for (size_t r = 0; r < all.size(); ++r) {
    const json j = json::parse(all[r]);
    out.hosts.push_back(j.at("host").get<std::string>());
    for (const json& f : j.at("files")) out.holders[f.get<std::string>()].push_back(static_cast<int>(r));
    for (const json& f : j.at("listed")) out.listed.emplace(f.get<std::string>(), "");
    for (const auto& [f, host] : j.at("nodes").items()) out.listed[f] = host.get<std::string>();
  }
  return out;
}

// The pieces of the files this rank is the first holder of, for the ranks that lack them.
std::string describe(const Catalog& local, const Holdings& holdings, int rank) {
  json out = json::array();
  for (const DescribedPiece& d : local.described()) {
    if (holdings.holders.at(file_name(d.piece.file)).front() != rank) continue;
    json e = {{"tensor", d.tensor}, {"dtype", d.dtype}, {"file", file_name(d.piece.file)},
              {"offset", d.piece.box.offset}, {"shape", d.piece.box.shape}, {"begin", d.piece.begin}};
    if (d.global_shape) e["global_shape"] = *d.global_shape;
    out.push_back(std::move(e));
  }
  return out.dump();
}

// Every file of the checkpoint must be on some node of this job.
void check_all_held(const Holdings& holdings, const std::string& dir) {
  if (holdings.holders.empty())
    throw DTensorError("checkpoint::load (node-local): no node of this job holds a checkpoint in " + dir +
                       "; load on the nodes that saved it, or copy its files there");
  for (const auto& [file, host] : holdings.listed)
    if (!holdings.holders.count(file))
      throw DTensorError("checkpoint::load (node-local): " + file + (host.empty() ? "" : ", written on " + host) +
                         ", is in no node's " + dir + " in this job; copy it into " + dir + " on one of this job's nodes");
}

// The same global catalog on every rank, from every first holder's description.
Catalog assemble(const std::vector<std::string>& descriptions, const Catalog& local, const Holdings& holdings,
                 const std::string& dir, int rank) {
  std::vector<DescribedPiece> pieces;
  for (const std::string& text : descriptions)
    for (const json& e : json::parse(text)) {
      const std::string file = e.at("file").get<std::string>();
      const std::vector<int>& holders = holdings.holders.at(file);
      const bool here = std::binary_search(holders.begin(), holders.end(), rank);
      DescribedPiece d{e.at("tensor").get<std::string>(), e.at("dtype").get<std::string>(),
                       SavedPiece{(fs::path(dir) / file).string(), here ? local.file_named(file) : nullptr,
                                  Box{e.at("offset").get<Shape>(), e.at("shape").get<Shape>()}, e.at("begin").get<int64_t>()},
                       std::nullopt};
      if (e.contains("global_shape")) d.global_shape = e.at("global_shape").get<Shape>();
      pieces.push_back(std::move(d));
    }
  return Catalog(dir, pieces);
}

// Every rank's box of `tensor` (a plain tensor: every rank of the world holds it whole).
std::vector<std::pair<int, Box>> targets_of(const at::Tensor& tensor, int world_size) {
  const Shape global = tensor.sizes().vec();
  std::vector<std::pair<int, Box>> out;
  if (!is_dtensor(tensor)) {
    for (int r = 0; r < world_size; ++r) out.emplace_back(r, Box{Shape(global.size(), 0), global});
    return out;
  }
  const DTensorSpec& spec = spec_of(tensor);
  for (const Piece& p : pieces_of(global, spec.mesh->shape(), spec.mesh->ranks(), spec.placements))
    for (int64_t holder : p.holders) out.emplace_back(static_cast<int>(holder), p.box);
  return out;
}

// Part of a saved piece that one rank sends another: read from its node's file, or (forwarded) from
// its own target, once it received that part from another node for itself.
struct Transfer {
  const std::string* name;
  const SavedPiece* piece;
  Box part;
  int source;
  int destination;
  int64_t bytes;
  bool forwarded;
};

struct Plan {
  std::vector<std::vector<Transfer>> rounds;
  std::map<std::string, std::pair<Box, at::Tensor>> mine;  // this rank's targets by tensor name
};

// Reads what this rank needs from its own node's files (at once) and plans the rest. A part that
// several ranks of one node need (a replicated target) crosses the network once, to the first of them,
// which forwards it to the others.
Plan plan_and_read_local(const State& state, const Catalog& global, const Holdings& holdings, const Job& job,
                         LoadResult& result) {
  Plan plan;
  plan.rounds.emplace_back();
  int64_t round_bytes = 0;
  std::vector<int64_t> assigned(static_cast<size_t>(job.size), 0);  // bytes each rank reads for others
  for (const auto& [name, tensor] : state) {
    const auto found = global.tensors().find(name);
    if (found == global.tensors().end()) continue;
    const SavedTensor& saved = found->second;
    const at::Tensor into = as_saved(tensor, saved);
    check_matches(name, into, saved);
    if (auto target = target_of(name, into)) plan.mine.emplace(name, std::move(*target));
    const int64_t element = safetensors_element_size(saved.dtype);
    // (piece, part offset, part shape, host) -> the rank of that host the part was sent to
    std::map<std::tuple<const SavedPiece*, Shape, Shape, std::string>, int> arrived;
    for (const auto& [destination, box] : targets_of(into, job.size))
      for (const SavedPiece& piece : saved.pieces) {
        const auto part = intersect(piece.box, box);
        if (!part) continue;
        const std::vector<int>& holders = holdings.holders.at(file_name(piece.file));
        if (std::binary_search(holders.begin(), holders.end(), destination)) {
          if (destination == job.rank) {
            auto& [my_box, into] = plan.mine.at(name);
            result.bytes_read += read_part(name, piece, *part, my_box, into);
          }
          continue;
        }
        const int64_t bytes = numel(part->shape) * element;
        const auto key = std::make_tuple(&piece, part->offset, part->shape, holdings.hosts[static_cast<size_t>(destination)]);
        if (const auto first = arrived.find(key); first != arrived.end()) {
          plan.rounds.back().push_back(Transfer{&name, &piece, *part, first->second, destination, bytes, true});
          continue;
        }
        arrived.emplace(key, destination);
        int source = holders.front();
        for (int h : holders)
          if (assigned[static_cast<size_t>(h)] < assigned[static_cast<size_t>(source)]) source = h;
        assigned[static_cast<size_t>(source)] += bytes;
        plan.rounds.back().push_back(Transfer{&name, &piece, *part, source, destination, bytes, false});
        round_bytes += bytes;
      }
    if (round_bytes >= kRoundBytes) plan.rounds.emplace_back(), round_bytes = 0;
  }
  return plan;
}

// The values of `part` from this rank's own target, into `out`.
void read_back(const Box& part, const std::pair<Box, at::Tensor>& target, char* out) {
  const at::Tensor values = region_of(target.second, part, target.first).to(at::kCPU).contiguous();
  std::memcpy(out, values.const_data_ptr(), values.nbytes());
}

// The transfers of one round that are (`forwarded`) or are not forwards: this rank reads what it
// sends, every rank agrees that the reads went well, one all-to-all of bytes over the world, and each
// rank places what it received.
void exchange(const std::vector<Transfer>& round, bool forwarded, Plan& plan, const Job& job, const Holdings& holdings,
              MeshPtr& world_mesh, const std::string& dir, LoadResult& result) {
  const size_t n = static_cast<size_t>(job.size);
  std::vector<int64_t> send_counts(n, 0), recv_counts(n, 0);
  int64_t total = 0;
  for (const Transfer& t : round) {
    if (t.forwarded != forwarded) continue;
    if (t.source == job.rank) send_counts[static_cast<size_t>(t.destination)] += t.bytes;
    if (t.destination == job.rank) recv_counts[static_cast<size_t>(t.source)] += t.bytes;
    total += t.bytes;
  }
  if (total == 0) return;
  // The send buffer holds, per destination in rank order, its transfers in plan order; the receiver
  // walks its sources the same way.
  std::vector<int64_t> send_at(n, 0);
  for (size_t d = 1; d < n; ++d) send_at[d] = send_at[d - 1] + send_counts[d - 1];
  at::Tensor send = at::empty({send_at[n - 1] + send_counts[n - 1]}, at::kByte);
  std::exception_ptr error;
  try {
    for (const Transfer& t : round)
      if (t.forwarded == forwarded && t.source == job.rank) {
        int64_t& at = send_at[static_cast<size_t>(t.destination)];
        char* out = static_cast<char*>(send.data_ptr()) + at;
        if (forwarded) read_back(t.part, plan.mine.at(*t.name), out);
        else read_into(*t.name, *t.piece, t.part, t.bytes / numel(t.part.shape), out), result.bytes_read += t.bytes;
        at += t.bytes;
        result.bytes_sent += t.bytes;
      }
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "reading " + dir + " for other ranks");
  if (!world_mesh) {
    std::vector<int64_t> ranks(n);
    for (size_t r = 0; r < n; ++r) ranks[r] = static_cast<int64_t>(r);
    world_mesh = DeviceMesh::create(job.world, {job.size}, ranks, MeshOptions{{}, c10::DeviceType::CPU, job.world->timeout()});
  }
  const at::Tensor received = dtensor::detail::all_to_all(*world_mesh, 0, send, send_counts, recv_counts);
  std::vector<int64_t> recv_at(n, 0);
  for (size_t s = 1; s < n; ++s) recv_at[s] = recv_at[s - 1] + recv_counts[s - 1];
  for (const Transfer& t : round)
    if (t.forwarded == forwarded && t.destination == job.rank) {
      int64_t& at = recv_at[static_cast<size_t>(t.source)];
      const char* bytes = static_cast<const char*>(received.data_ptr()) + at;
      auto& [box, into] = plan.mine.at(*t.name);
      fill_part(t.part, box, into, into.scalar_type(), [&](char* out) { std::memcpy(out, bytes, static_cast<size_t>(t.bytes)); });
      at += t.bytes;
      result.bytes_received += t.bytes;
      if (holdings.hosts[static_cast<size_t>(t.source)] != holdings.hosts[static_cast<size_t>(job.rank)])
        result.bytes_received_from_other_nodes += t.bytes;
    }
}

}  // namespace

LoadResult load_node_local(const State& state, const std::string& dir, bool strict, const Job& job) {
  LoadResult result;
  std::unique_ptr<Catalog> local;
  std::exception_ptr error;
  try {
    local = std::make_unique<Catalog>(dir, Catalog::Files::PresentOnly);
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "reading this node's share of " + dir);
  const Holdings holdings = exchange_holdings(*local, job);
  const std::vector<std::string> descriptions = job.gather(describe(*local, holdings, job.rank));

  at::NoGradGuard no_grad;
  std::unique_ptr<Catalog> global;
  Plan plan;
  error = nullptr;
  try {
    check_all_held(holdings, dir);
    global = std::make_unique<Catalog>(assemble(descriptions, *local, holdings, dir, job.rank));
    match_names(state, *global, dir, strict, result);
    plan = plan_and_read_local(state, *global, holdings, job, result);
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "loading " + dir + " (node-local)");
  MeshPtr world_mesh;
  for (const auto& round : plan.rounds)
    for (const bool forwarded : {false, true}) exchange(round, forwarded, plan, job, holdings, world_mesh, dir, result);
  return result;
}

}  // namespace dtensor::checkpoint::detail
