// Checkpoint throughput per rank against plain file I/O of the same bytes, in the same run; and a whole
// safetensors file loaded into TP=4, each rank reading about a quarter of it.
//   dtensor_checkpoint_bench [--mb M] [--rounds R] [--dir DIR]      (4 local ranks)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dtensor/checkpoint.h>
#include <dtensor/dtensor.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t mb = 256;  // the whole state, over all ranks
  int rounds = 6;
  std::string dir = (fs::temp_directory_path() / "dtensor-checkpoint-bench").string();
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mb") a.mb = std::stoll(argv[i + 1]);
    else if (flag == "--rounds") a.rounds = std::stoi(argv[i + 1]);
    else if (flag == "--dir") a.dir = argv[i + 1];
    else throw std::invalid_argument("unknown flag " + flag + " (--mb, --rounds, --dir)");
  }
  return a;
}

constexpr int64_t kTensors = 8, kCols = 1024;

// 8 float tensors of [rows, 1024] making `mb` MiB in all, sharded `placement` over a 1-d mesh (or whole).
ckpt::State make_state(const dtensor::MeshPtr& mesh, std::optional<dtensor::Placement> placement, int64_t mb, bool zeros) {
  const int64_t rows = mb * (1 << 20) / 4 / kCols / kTensors;
  ckpt::State state;
  for (int64_t i = 0; i < kTensors; ++i) {
    at::Tensor whole = zeros ? at::zeros({rows, kCols}) : at::full({rows, kCols}, static_cast<double>(i));
    state["layer" + std::to_string(i) + ".weight"] =
        placement ? dtensor::distribute_tensor(whole, mesh, dtensor::Placements{*placement}) : whole;
  }
  return state;
}

std::vector<at::Tensor> local_data(const ckpt::State& state) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : state) out.push_back(dtensor::is_dtensor(t) ? dtensor::local_tensor_of(t) : t);
  return out;
}

int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

// The baseline: the same bytes through write(2) + fsync into one file, as a hand-rolled dump would.
void plain_write(const std::string& path, const std::vector<at::Tensor>& ts) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (const auto& t : ts) {
    const char* p = static_cast<const char*>(t.data_ptr());
    for (int64_t left = t.numel() * static_cast<int64_t>(t.element_size()); left > 0;) {
      const ssize_t n = ::write(fd, p, static_cast<size_t>(left));
      if (n <= 0) throw std::runtime_error("write failed");
      p += n;
      left -= n;
    }
  }
  ::fsync(fd);
  ::close(fd);
}

void plain_read(const std::string& path, const std::vector<at::Tensor>& ts) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  int64_t offset = 0;
  for (const auto& t : ts) {
    char* p = static_cast<char*>(t.data_ptr());
    for (int64_t left = t.numel() * static_cast<int64_t>(t.element_size()); left > 0;) {
      const ssize_t n = ::pread(fd, p, static_cast<size_t>(left), offset);
      if (n <= 0) throw std::runtime_error("read failed");
      p += n;
      left -= n;
      offset += n;
    }
  }
  ::close(fd);
}

// Seconds from a start every rank shares until every rank has finished `f` (a job goes on only then;
// dtensor's save and load end with the ranks agreeing, plain I/O gets the same closing barrier); the
// mean over ranks.
template <typename F>
double timed(dtensor::World& world, F&& f) {
  world.sum_across_ranks(0);
  const auto start = Clock::now();
  f();
  world.sum_across_ranks(0);
  const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  return static_cast<double>(world.sum_across_ranks(us)) / world.size() / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    const int rank = world->rank();
    auto mesh = dtensor::DeviceMesh::create(world, {world->size()});
    if (rank == 0) fs::remove_all(args.dir), fs::create_directories(args.dir);
    world->sum_across_ranks(0);
    const fs::path dir(args.dir);
    const ckpt::State state = make_state(mesh, dtensor::Shard(0), args.mb, false);
    const ckpt::State target = make_state(mesh, dtensor::Shard(0), args.mb, true);
    const ckpt::State other_target = make_state(mesh, dtensor::Shard(1), args.mb, true);
    const auto data = local_data(state), into = local_data(target);
    const double mib = bytes_of(data) / double(1 << 20);
    std::vector<double> w_plain, w_ckpt, w_whole, r_plain, r_ckpt, r_other, w_stall, w_async_total;
    int64_t other_bytes = 0;
    // Each round writes new files (as a job saves step after step); the last round's go untimed.
    for (int round = 0; round < args.rounds; ++round) {
      const std::string plain = (dir / ("plain-" + std::to_string(rank) + "-" + std::to_string(round) + ".bin")).string();
      const std::string saved = (dir / ("ckpt-" + std::to_string(round))).string();
      // Which writes first alternates: the disk's cache favours whichever goes first.
      if (round % 2 == 0) w_plain.push_back(timed(*world, [&] { plain_write(plain, data); }));
      w_ckpt.push_back(timed(*world, [&] { ckpt::save(state, saved); }));
      if (round % 2 == 1) w_plain.push_back(timed(*world, [&] { plain_write(plain, data); }));
      r_plain.push_back(timed(*world, [&] { plain_read(plain, into); }));
      r_ckpt.push_back(timed(*world, [&] { ckpt::load(target, saved); }));
      r_other.push_back(timed(*world, [&] { other_bytes = ckpt::load(other_target, saved).bytes_read; }));
      w_whole.push_back(timed(*world, [&] { ckpt::save(state, saved + "-whole", {.whole_tensors = true}); }));
      // Asynchronous: the stall is until save_async returns (collectives done, staging copy made); the
      // files are then written while the job would go on. Its total, to the commit, for comparison.
      std::future<ckpt::SaveResult> pending;
      const auto async_start = Clock::now();
      w_stall.push_back(timed(*world, [&] { pending = ckpt::save_async(state, saved + "-async"); }));
      pending.get();
      world->sum_across_ranks(0);
      const int64_t async_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - async_start).count();
      w_async_total.push_back(static_cast<double>(world->sum_across_ranks(async_us)) / world->size() / 1e6);
      fs::remove(plain);
      world->sum_across_ranks(0);
      if (rank == 0) fs::remove_all(saved), fs::remove_all(saved + "-whole"), fs::remove_all(saved + "-async");
    }
    // One whole safetensors file (plain tensors: rank 0 writes them all), loaded into TP=4 Shard(0).
    const ckpt::State whole = make_state(mesh, std::nullopt, args.mb, false);
    ckpt::save(whole, (dir / "whole").string(), {.world = world});
    const fs::path whole_file = dir / "whole" / "model-00001-of-00004.safetensors";
    const double file_mib = static_cast<double>(fs::file_size(whole_file)) / (1 << 20);
    std::vector<double> r_whole_plain, r_whole_tp;
    int64_t tp_bytes = 0;
    std::vector<at::Tensor> whole_buffers;
    for (const auto& [name, t] : whole) whole_buffers.push_back(at::empty_like(t));
    for (int round = 0; round < args.rounds; ++round) {
      r_whole_plain.push_back(timed(*world, [&] { plain_read(whole_file.string(), whole_buffers); }));
      r_whole_tp.push_back(timed(*world, [&] { tp_bytes = ckpt::load(target, (dir / "whole").string()).bytes_read; }));
    }
    const int64_t tp_bytes_sum = world->sum_across_ranks(tp_bytes);
    const int64_t other_sum = world->sum_across_ranks(other_bytes);
    if (rank == 0) {
      const auto row = [&](const char* what, double mb, double ours, double base) {
        std::printf("| %s | %.1f MiB | %.3f s (%.0f MiB/s) | %.3f s (%.0f MiB/s) | %.2fx |\n", what, mb, ours, mb / ours,
                    base, mb / base, base / ours);
      };
      std::printf("Per rank: %.1f MiB of shards (%lld MiB over %d ranks, 8 float tensors sharded Shard(0)), %d rounds, medians.\n\n",
                  mib, static_cast<long long>(args.mb), world->size(), args.rounds);
      std::printf("| operation | bytes per rank | dtensor | plain file I/O | ratio (plain / dtensor) |\n| --- | --- | --- | --- | --- |\n");
      row("save (safetensors, fsync, rename, commit)", mib, median(w_ckpt), median(w_plain));
      row("save as whole tensors (each gathered on one rank, 2 of 8 per rank)", mib, median(w_whole), median(w_plain));
      row("load into the same layout", mib, median(r_ckpt), median(r_plain));
      row("load into Shard(1) (row pieces of every saved shard)", other_sum / 4.0 / (1 << 20), median(r_other), median(r_plain));
      std::printf("\nWhole safetensors file (%.1f MiB, written by rank 0 from plain tensors) loaded into TP=4 Shard(0):\n\n", file_mib);
      std::printf("| | per rank | time |\n| --- | --- | --- |\n");
      std::printf("| dtensor load: bytes read | %.1f MiB (%.1f%% of the file) | %.3f s |\n", tp_bytes_sum / 4.0 / (1 << 20),
                  100.0 * tp_bytes_sum / 4.0 / (1 << 20) / file_mib, median(r_whole_tp));
      std::printf("| every rank reading the whole file (plain I/O) | %.1f MiB | %.3f s |\n", file_mib, median(r_whole_plain));
      std::printf("\nThe stall of a save: how long the job waits before it can train on (%.1f MiB per rank).\n\n", mib);
      std::printf("| save | training stalls | until committed | stall / blocking save |\n| --- | --- | --- | --- |\n");
      std::printf("| blocking (`checkpoint::save`) | %.3f s | %.3f s | 1.00x |\n", median(w_ckpt), median(w_ckpt));
      std::printf("| asynchronous (`checkpoint::save_async`: staging copy, then written in the background) | %.3f s | %.3f s | %.2fx |\n",
                  median(w_stall), median(w_async_total), median(w_stall) / median(w_ckpt));
    }
    world->sum_across_ranks(0);
    if (rank == 0) fs::remove_all(args.dir);
    return 0;
  });
}
