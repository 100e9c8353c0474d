// The main job: trains a GPT-style decoder on the shipped corpus on 4 local ranks it starts itself,
// first tensor parallel over all 4 (TP=4), then data parallel x tensor parallel (DP=2 x TP=2), then
// fully sharded data parallel over all 4 (FSDP=4: each rank keeps a quarter of the parameters and
// optimizer state and trains on a quarter of each batch), then FSDP=2 x TP=2, then hybrid sharded data
// parallel (HSDP: 2 replicas x FSDP=2, each rank on a quarter of each batch), then context parallel on
// a model with twice the positions (CP=4, each rank a quarter of every sequence, load balanced, ring or
// all-to-all attention; and CP=2 x TP=2), fully sharded over cp, then pipeline parallel
// (PP=4 with 1F1B, PP=4 with Interleaved 1F1B, PP=2 x DP=2 with the ZBV zero-bubble schedule and with
// DualPipeV, PP=2 x TP=2 with Interleaved 1F1B, PP=2 x FSDP=2 with 1F1B, PP=2 x CP=2 with ZBV on the
// long-context model, fully sharded over cp; --modes pp-fsdp-tp and pp-hsdp add PP=2 x FSDP=2 x TP=1 and PP=2 x HSDP), then expert parallel on a model whose MLPs are mixtures of 4 experts
// (top 2): EP=4, EP=2 x FSDP=2, PP=2 x EP=2 and CP=4 with EP=4 over the same ranks, the dense parameters
// fully sharded over the data ranks. Rank 0
// then trains the same model (each of the four) on the same batches from the same seed in one process and compares the
// loss trajectories: PASS when every step's loss is within a relative 1e-4.
//
//   gpt_train [--steps K] [--modes tp,dp-tp,fsdp,fsdp-tp,hsdp,cp,cp-tp,pp,pp-interleaved,pp-dp,pp-dualpipev,pp-tp,pp-fsdp,pp-cp,ep,ep-fsdp,pp-ep,cp-ep] [--corpus PATH] [--save DIR] [--resume DIR]
//             [--checkpoint-every N DIR] [--blocking-checkpoints 1]
//
// --save DIR writes the first mode's model and optimizer state after its last step (a dtensor
// checkpoint: safetensors files, one per rank that owns shards). --resume DIR starts every mode from such
// a checkpoint, saved on any mesh: it continues at the saved step for K more steps, and the
// single-process oracle then trains uninterrupted from the start and is compared on those K steps.
// --checkpoint-every N DIR saves the first mode every N steps into DIR/step-S, asynchronously (a
// staging copy, then the files written while training goes on; --blocking-checkpoints 1 waits instead),
// keeping the latest complete one, and prints each save's stall. Started again with the same flags (by
// an elastic launcher after a lost node, on however many ranks remain), it resumes from the latest
// complete checkpoint in DIR.

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "build_paths.h"
#include "dtensor/pipeline.h"
#include "dtensor/training_state.h"
#include "gpt/pipeline.h"
#include "gpt/training.h"

namespace {

struct Args {
  int steps = 50;
  std::vector<std::string> modes = {"tp", "dp-tp", "fsdp", "fsdp-tp", "hsdp", "cp", "cp-tp", "pp", "pp-interleaved", "pp-dp", "pp-dualpipev", "pp-tp", "pp-fsdp", "pp-cp", "ep", "ep-fsdp", "pp-ep", "cp-ep"};
  std::string corpus = dtensor::build_paths::gpt_corpus;
  std::string save, resume;
  int checkpoint_every = 0;
  std::string checkpoint_dir;
  bool blocking_checkpoints = false;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--steps") {
      args.steps = std::stoi(value);
    } else if (flag == "--corpus") {
      args.corpus = value;
    } else if (flag == "--save") {
      args.save = value;
    } else if (flag == "--resume") {
      args.resume = value;
    } else if (flag == "--checkpoint-every" && i + 2 < argc) {
      args.checkpoint_every = std::stoi(value);
      args.checkpoint_dir = argv[++i + 1];
    } else if (flag == "--blocking-checkpoints") {
      args.blocking_checkpoints = value == "1";
    } else if (flag == "--modes") {
      args.modes.clear();
      for (size_t start = 0; start <= value.size();) {
        const size_t comma = std::min(value.find(',', start), value.size());
        args.modes.push_back(value.substr(start, comma - start));
        start = comma + 1;
      }
    } else {
      throw std::invalid_argument("unknown flag " + flag +
                                  " (use --steps, --modes, --corpus, --save, --resume, --checkpoint-every N DIR, "
                                  "--blocking-checkpoints 1)");
    }
  }
  return args;
}

constexpr uint64_t kSeed = 1234;
constexpr int64_t kBatch = 8;

// Where a run starts and what it keeps: `resume` and `save` are checkpoint directories (or empty);
// `every` > 0 saves every that many steps under `periodic_dir`.
struct Checkpointing {
  std::string resume, save;
  int every = 0;
  std::string periodic_dir;
  bool blocking = false;
};

// The latest complete checkpoint DIR/step-S, or empty.
std::string latest_checkpoint(const std::string& dir) {
  std::string latest;
  int latest_step = 0;
  if (!std::filesystem::is_directory(dir)) return latest;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("step-") || !dtensor::checkpoint::is_committed(entry.path().string())) continue;
    const int step = std::stoi(name.substr(5));
    if (step > latest_step) latest_step = step, latest = entry.path().string();
  }
  return latest;
}

// Rank 0, once the checkpoint of step `kept` is complete: the older ones are not needed any more, but
// for `resumed_from`, where the job's later modes start.
void remove_checkpoints_before(const std::string& dir, int kept, const std::string& resumed_from) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("step-") && std::stoi(name.substr(5)) < kept &&
        !(std::filesystem::exists(resumed_from) && std::filesystem::equivalent(entry.path(), resumed_from)))
      std::filesystem::remove_all(entry.path());
  }
}

struct Run {
  int first_step = 1;  // after a resume: the saved step + 1
  std::vector<double> losses;
  bool long_context = false;  // trained gpt::long_context_config's model
  bool mixture_of_experts = false;  // trained gpt::moe_config's model
};

// Saves the training state every `checkpointing.every` steps into its periodic_dir/step-S,
// asynchronously (training goes on while the files are written; blocking: waits), each save first
// waiting for the one before; once one is complete, rank 0 removes the older ones. Pipeline modes save
// partitioned (each rank its stages' tensors).
class PeriodicCheckpoints {
 public:
  PeriodicCheckpoints(const Checkpointing& checkpointing, std::shared_ptr<dtensor::World> world, bool partitioned, bool print)
      : checkpointing_(checkpointing), world_(std::move(world)), partitioned_(partitioned), print_(print) {}

  // After `step`: saves when one is due. True when it did (the time it took is not training's).
  bool after_step(int step, dtensor::checkpoint::TrainingState& state) {
    if (checkpointing_.every <= 0 || step % checkpointing_.every != 0) return false;
    // The stall: how long training waits for this save (the previous one, if still writing, included).
    const auto stall_start = std::chrono::steady_clock::now();
    finish();
    state.tensors()["train.step"].fill_(step);
    const std::string dir = checkpointing_.periodic_dir + "/step-" + std::to_string(step);
    saving_ = state.save_async(dir, {.overwrite = true, .world = world_, .partitioned = partitioned_});
    saving_step_ = step;
    if (checkpointing_.blocking) finish();
    const double stall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - stall_start).count();
    if (print_)
      std::cout << "  checkpoint of step " << step << " to " << dir << (checkpointing_.blocking ? " (blocking)" : " (asynchronous)")
                << ": training stalled " << std::setprecision(1) << std::fixed << stall_ms << " ms" << std::endl;  // seen as it happens
    return true;
  }

  // Waits for the save in flight.
  void finish() {
    if (!saving_.valid()) return;
    saving_.get();
    if (world_ == nullptr || world_->rank() == 0) remove_checkpoints_before(checkpointing_.periodic_dir, saving_step_, checkpointing_.resume);
  }

 private:
  const Checkpointing& checkpointing_;
  std::shared_ptr<dtensor::World> world_;
  bool partitioned_, print_;
  std::future<dtensor::checkpoint::SaveResult> saving_;  // the save in flight
  int saving_step_ = 0;
};

// How a mode splits the model: tensor parallel (a 1-d "tp" mesh, or a 2-d ("dp", "tp") one with data
// parallel over dp), fully sharded over "dp" (a 1-d mesh, ("dp", "tp"), or ("replicate", "dp")), or
// context parallel over "cp" (a 1-d mesh, or ("cp", "tp") with TP inside), fully sharded over cp too
// (whose ranks train on the same rows, each on its positions: their gradients are averaged as data
// parallel ranks'). A null mesh is one process. long_context: gpt::long_context_config's model (which
// context parallelism needs), else the demo model.
struct Parallelism {
  dtensor::MeshPtr mesh;
  bool fully_sharded = false;
  bool long_context = false;
  bool mixture_of_experts = false;  // gpt::moe_config's model, expert parallel over the mesh's "ep" dim
};

bool has_dim(const dtensor::MeshPtr& mesh, const std::string& name) {
  const auto& names = mesh->dim_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Where a mode's model lies: its data-parallel ranks (of a fully-sharded mode), its context-parallel
// ones, and this rank's share of each batch's rows.
struct ModeLayout {
  dtensor::MeshPtr data, cp;
  int64_t dp_rank = 0, dp_size = 1;
};

// Parallelizes `model` as `parallelism` says.
ModeLayout place(gpt::Gpt& model, const Parallelism& parallelism) {
  const dtensor::MeshPtr& mesh = parallelism.mesh;
  ModeLayout p{.data = mesh};
  if (mesh && has_dim(mesh, "cp")) {
    p.cp = (*mesh)["cp"];
    if (has_dim(mesh, "tp")) gpt::parallelize(model, (*mesh)["tp"]);
    gpt::context_parallelize(model, p.cp);
    gpt::fully_shard(model, mesh, {.dp_dim = "cp"});
    p.data = p.cp;
  } else if (mesh && has_dim(mesh, "ep") && parallelism.long_context) {
    // Context parallel over the ep ranks: each rank its positions of the same rows, routed to the experts.
    p.cp = (*mesh)["ep"];
    gpt::context_parallelize(model, p.cp);
    p.data = gpt::expert_parallelize(model, mesh);
  } else if (mesh && has_dim(mesh, "ep")) {
    p.data = gpt::expert_parallelize(model, mesh);
    p.dp_size = p.data->size();
    p.dp_rank = p.data->local_rank(0);
  } else if (mesh && parallelism.fully_sharded) {
    // On a ("dp", "tp") mesh: Megatron-style TP over tp first, then FSDP over dp. On ("replicate", "dp")
    // every rank is a data-parallel rank of its own.
    if (has_dim(mesh, "tp")) {
      gpt::parallelize(model, (*mesh)["tp"]);
      p.data = (*mesh)["dp"];
    }
    gpt::fully_shard(model, mesh);
    p.dp_size = p.data->size();
    for (int64_t d = 0; d < p.data->ndim(); ++d) p.dp_rank = p.dp_rank * p.data->size(d) + (*p.data->coordinate())[d];
  } else if (mesh) {
    gpt::parallelize(model, mesh);
    if (mesh->ndim() == 2) {
      p.dp_rank = (*mesh->coordinate())[0];
      p.dp_size = mesh->size(0);
    }
  }
  return p;
}

// This rank's share of `batch`: its rows (the dp_rank-th of dp_size equal parts) and, with a cp mesh, its
// positions of them, load balanced: the scope returned holds the rows' tokens and targets and the
// model's position ids sharded over cp until it goes.
std::optional<dtensor::ContextParallel> take_share(gpt::Batch& batch, int64_t dp_rank, int64_t dp_size, const dtensor::MeshPtr& cp, gpt::Gpt& model) {
  const int64_t rows = kBatch / dp_size;
  batch.tokens = batch.tokens.slice(0, dp_rank * rows, (dp_rank + 1) * rows);
  batch.targets = batch.targets.slice(0, dp_rank * rows, (dp_rank + 1) * rows);
  if (!cp) return std::nullopt;
  // The rows are views of the batch: the scope shards tensors of their own.
  batch = {batch.tokens.clone(), batch.targets.clone()};
  return std::make_optional<dtensor::ContextParallel>(cp, std::vector<at::Tensor>{batch.tokens, batch.targets, model->position_ids},
                                                      std::vector<int64_t>{1, 1, 0});
}

// Trains `steps` steps (after the resumed ones). Data-parallel ranks train on their own rows of each
// batch.
Run train(const gpt::Corpus& corpus, const Parallelism& parallelism, int steps, const std::string& label, bool print,
          const Checkpointing& checkpointing = {}) {
  torch::manual_seed(kSeed);
  const gpt::Config config = parallelism.long_context ? gpt::long_context_config(corpus) : gpt::demo_config(corpus);
  gpt::Gpt model(parallelism.mixture_of_experts ? gpt::with_experts(config) : config);
  const dtensor::MeshPtr& mesh = parallelism.mesh;
  const ModeLayout placed = place(model, parallelism);
  const dtensor::MeshPtr &data = placed.data, &cp = placed.cp;
  const int64_t dp_rank = placed.dp_rank, dp_size = placed.dp_size;
  const gpt::TrainOptions options;
  auto optimizer = gpt::make_optimizer(model, options);
  dtensor::checkpoint::TrainingState state(*model, &optimizer);
  state.tensors()["train.step"] = at::zeros({}, at::kLong);
  const auto world = mesh ? mesh->world() : nullptr;
  gpt::Batches batches(corpus, kBatch, model->pos_emb.size(0), kSeed);
  Run run;
  run.long_context = parallelism.long_context;
  run.mixture_of_experts = parallelism.mixture_of_experts;
  const std::string& resume = checkpointing.resume;
  if (!resume.empty()) {
    state.load(resume, {.world = world});
    run.first_step = static_cast<int>(state.tensors()["train.step"].item<int64_t>()) + 1;
    for (int step = 1; step < run.first_step; ++step) batches.next();  // the batches those steps used
  }
  if (print) std::cout << "\n== " << label << " ==\n";
  if (print && run.first_step > 1) std::cout << "  resumed from " << resume << " at step " << run.first_step << "\n";
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  const int last_step = run.first_step + steps - 1;
  PeriodicCheckpoints periodic(checkpointing, world, /*partitioned=*/false, print);
  for (int step = run.first_step; step <= last_step; ++step) {
    gpt::Batch batch = batches.next();
    std::optional<dtensor::ContextParallel> sequence = take_share(batch, dp_rank, dp_size, cp, model);
    const double loss = gpt::train_step(model, optimizer, batch, options);
    sequence.reset();  // the whole sequences back
    // A fully-sharded rank's loss is its own rows' (a tensor-parallel loss is the whole batch's already).
    run.losses.push_back(parallelism.fully_sharded ? gpt::mean_over(data, loss) : loss);
    if (print && (step == run.first_step || step % 5 == 0 || step == last_step)) {
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - last).count();
      const int done = step == run.first_step ? 1 : std::min(step - run.first_step, step % 5 == 0 ? 5 : step % 5);
      const double tokens_per_s = done * kBatch * batch.tokens.size(1) / seconds;
      std::cout << "  step " << std::setw(3) << step << "  loss " << std::fixed << std::setprecision(5) << run.losses.back()
                << "  " << std::setprecision(0) << tokens_per_s << " tokens/s\n";
      last = now;
    }
    if (periodic.after_step(step, state)) last = std::chrono::steady_clock::now();  // tokens/s counts training only
  }
  periodic.finish();
  if (print)
    std::cout << "  " << steps << " steps in " << std::setprecision(2)
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
  if (!checkpointing.save.empty()) {
    state.tensors()["train.step"].fill_(last_step);
    const auto saved = state.save(checkpointing.save, {.overwrite = true, .world = world});
    if (print) std::cout << "  saved step " << last_step << " to " << checkpointing.save << " (rank 0 wrote " << saved.bytes_written << " bytes)\n";
  }
  return run;
}

// How a pipeline mode lays the model out: a mesh with a "pp" dim and any of "dp" (each pipeline trains
// on its own rows of each batch; "replicate" before it too, for HSDP) and "tp" (each stage tensor
// parallel over it, with the TP plan of the tp mode); the schedule; where the model is cut (between
// blocks, or, with finest_pieces, also inside them: gpt::finest_pipeline_pieces). Over the
// data dims the gradients are averaged after the step's backwards, or, fully sharded, reduced by FSDP
// inside each stage (over ("dp", "tp") with a tp dim, as the fsdp-tp mode does). A "cp" dim makes it
// context parallel: the long-context model, each rank of a pipeline's cp ranks training on its
// positions of the same rows (the ContextParallel scope over cp around each step, the stages' attention
// over it), their gradients averaged as data-parallel ranks' are (by FSDP over cp, fully sharded).
struct PipelineLayout {
  dtensor::MeshPtr mesh;
  dtensor::pipeline::Schedule schedule;
  std::vector<std::string> split_points;
  bool fully_sharded = false;
  bool finest_pieces = false;
  // gpt::moe_config's model, its experts over the mesh's "ep" dim inside FSDP over ("dp", "ep")
  // (gpt::expert_parallelize).
  bool mixture_of_experts = false;
};

// This rank's part of the training state: its stages' parameters (with their optimizer state), the
// buffers every stage holds, and whatever the job adds. Saved and loaded partitioned, under the whole
// model's names, so that another cut (another PP degree, or no pipeline at all) loads it.
void keep_only_own_stages(dtensor::checkpoint::TrainingState& state, gpt::Gpt& model, const std::vector<at::Tensor>& parameters) {
  std::set<const c10::TensorImpl*> own;
  for (const at::Tensor& p : parameters) own.insert(p.unsafeGetTensorImpl());
  for (const auto& named : model->named_parameters())
    if (!own.count(named.value().unsafeGetTensorImpl())) state.tensors().erase("model." + named.key());
}

// Pipeline parallel: the model cut into stages, placed along the mesh's "pp" dim by the layout's
// schedule. The whole model's gradient norm is clipped across the stages, then AdamW steps each rank's
// stages. Resumes from and saves partitioned checkpoints (checkpointing.resume, .save, and
// periodically).
Run train_pipeline(const gpt::Corpus& corpus, const PipelineLayout& layout, int steps, const std::string& label, bool print,
                   const Checkpointing& checkpointing) {
  torch::manual_seed(kSeed);
  const dtensor::MeshPtr& mesh = layout.mesh;
  const int64_t pp = mesh->dim_index("pp");
  const auto& names = mesh->dim_names();
  auto has = [&](const std::string& name) { return std::count(names.begin(), names.end(), name) > 0; };
  const gpt::Config config = has("cp") ? gpt::long_context_config(corpus) : gpt::demo_config(corpus);
  gpt::Gpt model(layout.mixture_of_experts ? gpt::with_experts(config) : config);
  // The data-parallel dims: "dp", and "replicate" before it for HSDP, "ep" after it (every expert-parallel
  // rank trains on its own rows), "cp" (its ranks train on the same rows, each on its positions).
  std::vector<std::string> data_dims;
  for (const char* name : {"replicate", "dp", "ep", "cp"})
    if (has(name)) data_dims.push_back(name);
  dtensor::MeshPtr dp = data_dims.empty() ? nullptr : mesh->slice(data_dims);
  const dtensor::MeshPtr cp = has("cp") ? (*mesh)["cp"] : nullptr;
  if (has("tp")) gpt::parallelize(model, (*mesh)["tp"]);
  if (cp) gpt::context_parallelize(model, cp);
  if (has("ep")) dp = gpt::expert_parallelize(model, dp);
  else if (layout.fully_sharded) gpt::fully_shard(model, has("tp") ? mesh->slice({"dp", "tp"}) : dp);
  // This pipeline's rank among those training on their own rows (not cp's ranks, which share them;
  // pipeline modes put no ep dim beside cp, which expert_parallelize would merge into one dim).
  int64_t dp_rank = 0, dp_size = 1;
  for (int64_t d = 0; dp && d < dp->ndim(); ++d)
    if (dp->dim_names()[static_cast<size_t>(d)] != "cp") dp_rank = dp_rank * dp->size(d) + dp->local_rank(d), dp_size *= dp->size(d);
  std::vector<dtensor::pipeline::PipelineStage> mine;
  std::vector<at::Tensor> parameters;
  const auto pieces = layout.finest_pieces ? gpt::finest_pipeline_pieces(model) : gpt::pipeline_pieces(model);
  for (auto& stage : dtensor::pipeline::split_at(pieces, layout.split_points)) {
    if (layout.schedule.rank_of(stage.index) != mesh->local_rank(pp)) continue;
    parameters.insert(parameters.end(), stage.parameters.begin(), stage.parameters.end());
    mine.push_back(std::move(stage));
  }
  dtensor::pipeline::PipelineRunner runner(layout.schedule, std::move(mine), mesh, pp, gpt::pipeline_loss);
  const gpt::TrainOptions options;
  torch::optim::AdamW optimizer(parameters, torch::optim::AdamWOptions(options.lr).weight_decay(options.weight_decay));
  dtensor::checkpoint::TrainingState state(*model, &optimizer);
  keep_only_own_stages(state, model, parameters);
  state.tensors()["train.step"] = at::zeros({}, at::kLong);
  gpt::Batches batches(corpus, kBatch, model->pos_emb.size(0), kSeed);
  Run run;
  run.mixture_of_experts = layout.mixture_of_experts;
  run.long_context = cp != nullptr;
  if (!checkpointing.resume.empty()) {
    state.load(checkpointing.resume, {.world = mesh->world(), .partitioned = true});
    run.first_step = static_cast<int>(state.tensors()["train.step"].item<int64_t>()) + 1;
    for (int step = 1; step < run.first_step; ++step) batches.next();  // the batches those steps used
  }
  const dtensor::Placements summed{dtensor::Partial()};
  const dtensor::Placements averaged(static_cast<size_t>(dp ? dp->ndim() : 0), dtensor::Partial(dtensor::ReduceOp::Avg));
  if (print) std::cout << "\n== " << label << " ==\n";
  if (print && run.first_step > 1) std::cout << "  resumed from " << checkpointing.resume << " at step " << run.first_step << "\n";
  const auto start = std::chrono::steady_clock::now();
  const int last_step = run.first_step + steps - 1;
  PeriodicCheckpoints periodic(checkpointing, mesh->world(), /*partitioned=*/true, print);
  for (int step = run.first_step; step <= last_step; ++step) {
    gpt::Batch batch = batches.next();
    optimizer.zero_grad();
    std::optional<dtensor::ContextParallel> sequence = take_share(batch, dp_rank, dp_size, cp, model);
    const at::Tensor loss = runner.step(batch.tokens, batch.targets);
    sequence.reset();
    for (const at::Tensor& p : parameters)
      if (dp && !layout.fully_sharded && p.grad().defined()) p.grad().copy_(dtensor::full_tensor(dtensor::from_local(p.grad(), dp, averaged)));
    dtensor::clip_grad_norm_(parameters, options.max_grad_norm, 2.0, mesh, pp);
    dtensor::step_on_local_shards(optimizer, {.fused = true});
    // The loss lives on the last stage's ranks (a DTensor under TP): summed along pp, every rank has it.
    const at::Tensor held = at::full({1}, loss.defined() ? gpt::value_of(loss) : 0.0, at::kDouble);
    const double whole = dtensor::full_tensor(dtensor::from_local(held, (*mesh)["pp"], summed)).item<double>();
    run.losses.push_back(dp ? gpt::mean_over(dp, whole) : whole);
    if (print && (step == run.first_step || step % 5 == 0 || step == last_step))
      std::cout << "  step " << std::setw(3) << step << "  loss " << std::fixed << std::setprecision(5) << run.losses.back() << "\n";
    periodic.after_step(step, state);
  }
  periodic.finish();
  if (print)
    std::cout << "  " << steps << " steps in " << std::setprecision(2)
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
  if (!checkpointing.save.empty()) {
    state.tensors()["train.step"].fill_(last_step);
    state.save(checkpointing.save, {.overwrite = true, .world = mesh->world(), .partitioned = true});
    if (print) std::cout << "  saved step " << last_step << " to " << checkpointing.save << " (partitioned: each stage its own tensors)\n";
  }
  return run;
}

// The pipeline modes, on 4 ranks, 4 microbatches each: PP=4 with 1F1B, a stage per rank; PP=4 with
// Interleaved 1F1B, two stages per rank, each a piece of gpt::finest_pipeline_pieces; PP=2 x DP=2
// zero bubble (ZBV: two stages per rank in V, backward split into input and weight gradients), and
// with DualPipeV (the same stages, forwards paired with backwards of the other stage); PP=2 x
// TP=2 with Interleaved 1F1B (two stages per rank); PP=2 x FSDP=2 with 1F1B, a block per stage; PP=2 x
// CP=2 with ZBV on the long-context model, FSDP over cp; and,
// not among the defaults (on 4 ranks one of their dims is of one rank), PP=2 x FSDP=2 x TP=1 and
// PP=2 x HSDP (2 replicas x FSDP=1) with 1F1B.
PipelineLayout pipeline_layout(const std::string& mode, const std::shared_ptr<dtensor::World>& world, std::string& label) {
  namespace pp = dtensor::pipeline;
  auto mesh = [&](std::vector<int64_t> shape, std::vector<std::string> names) {
    return dtensor::DeviceMesh::create(world, shape, {.dim_names = std::move(names)});
  };
  const std::vector<std::string> four_stages = {"blocks.0", "blocks.1", "lm_head"}, two_stages = {"blocks.1"};
  if (mode == "pp") {
    label = "pipeline parallel, PP=4 (1F1B)";
    return {mesh({4}, {"pp"}), pp::one_f_one_b(4, 4), four_stages};
  }
  if (mode == "pp-interleaved") {
    label = "pipeline parallel, PP=4 (Interleaved 1F1B, 2 stages per rank, blocks cut in halves)";
    return {mesh({4}, {"pp"}), pp::interleaved_1f1b(4, 2, 4),
            {"pos_emb", "blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", "ln_f", "lm_head"}, false, true};
  }
  if (mode == "pp-dp") {
    label = "pipeline parallel x data parallel, PP=2 (ZBV zero bubble) x DP=2";
    return {mesh({2, 2}, {"pp", "dp"}), pp::zbv_zero_bubble(2, 4), four_stages};
  }
  if (mode == "pp-dualpipev") {
    label = "pipeline parallel x data parallel, PP=2 (DualPipeV) x DP=2";
    return {mesh({2, 2}, {"pp", "dp"}), pp::dual_pipe_v(2, 4), four_stages};
  }
  if (mode == "pp-tp") {
    label = "pipeline parallel x tensor parallel, PP=2 (Interleaved 1F1B, 2 stages per rank) x TP=2";
    return {mesh({2, 2}, {"pp", "tp"}), pp::interleaved_1f1b(2, 2, 4), four_stages};
  }
  if (mode == "pp-fsdp") {
    label = "pipeline parallel x fully sharded, PP=2 (1F1B) x FSDP=2";
    return {mesh({2, 2}, {"pp", "dp"}), pp::one_f_one_b(2, 4), two_stages, true};
  }
  if (mode == "pp-cp") {
    label = "pipeline parallel x context parallel, PP=2 (ZBV zero bubble) x CP=2 on 64 positions (load balanced; FSDP over cp)";
    return {mesh({2, 2}, {"pp", "cp"}), pp::zbv_zero_bubble(2, 4), four_stages, true};
  }
  if (mode == "pp-ep") {
    label = "pipeline parallel x expert parallel, PP=2 (1F1B) x EP=2 (4 experts, top 2; dense parameters FSDP over ep)";
    return {mesh({2, 1, 2}, {"pp", "dp", "ep"}), pp::one_f_one_b(2, 4), two_stages, true, false, true};
  }
  if (mode == "pp-hsdp") {
    label = "pipeline parallel x hybrid sharded, PP=2 (1F1B) x 2 replicas x FSDP=1";
    return {mesh({2, 2, 1}, {"pp", "replicate", "dp"}), pp::one_f_one_b(2, 4), two_stages, true};
  }
  label = "pipeline parallel x fully sharded x tensor parallel, PP=2 (1F1B) x FSDP=2 x TP=1";
  return {mesh({2, 2, 1}, {"pp", "dp", "tp"}), pp::one_f_one_b(2, 4), two_stages, true};
}

bool is_pipeline_mode(const std::string& mode) {
  return mode == "pp" || mode == "pp-interleaved" || mode == "pp-dp" || mode == "pp-dualpipev" || mode == "pp-tp" || mode == "pp-fsdp" || mode == "pp-fsdp-tp" || mode == "pp-hsdp" ||
         mode == "pp-ep" || mode == "pp-cp";
}

// The mesh and layout of a mode that trains the whole model on every rank (not a pipeline mode), and
// its label.
Parallelism parallelism_for(const std::string& mode, const std::shared_ptr<dtensor::World>& world, std::string& label) {
  Parallelism parallelism;
  dtensor::MeshPtr& mesh = parallelism.mesh;
  if (mode == "tp") {
    mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
    label = "tensor parallel, TP=" + std::to_string(world->size());
  } else if (mode == "dp-tp") {
    if (world->size() % 2 != 0) throw std::invalid_argument("dp-tp needs an even number of ranks");
    mesh = dtensor::DeviceMesh::create(world, {2, world->size() / 2}, {.dim_names = {"dp", "tp"}});
    label = "data parallel x tensor parallel, DP=2 x TP=" + std::to_string(world->size() / 2);
  } else if (mode == "fsdp") {
    mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"dp"}});
    parallelism.fully_sharded = true;
    label = "fully sharded data parallel, FSDP=" + std::to_string(world->size());
  } else if (mode == "fsdp-tp") {
    if (world->size() % 2 != 0) throw std::invalid_argument("fsdp-tp needs an even number of ranks");
    mesh = dtensor::DeviceMesh::create(world, {2, world->size() / 2}, {.dim_names = {"dp", "tp"}});
    parallelism.fully_sharded = true;
    label = "fully sharded x tensor parallel, FSDP=2 x TP=" + std::to_string(world->size() / 2);
  } else if (mode == "hsdp") {
    if (world->size() % 2 != 0) throw std::invalid_argument("hsdp needs an even number of ranks");
    mesh = dtensor::DeviceMesh::create(world, {2, world->size() / 2}, {.dim_names = {"replicate", "dp"}});
    parallelism.fully_sharded = true;
    label = "hybrid sharded data parallel, 2 replicas x FSDP=" + std::to_string(world->size() / 2);
  } else if (mode == "cp") {
    mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"cp"}});
    parallelism.fully_sharded = parallelism.long_context = true;
    label = "context parallel, CP=" + std::to_string(world->size()) + " on 64 positions (load balanced; FSDP over cp)";
  } else if (mode == "cp-tp") {
    if (world->size() % 2 != 0) throw std::invalid_argument("cp-tp needs an even number of ranks");
    mesh = dtensor::DeviceMesh::create(world, {2, world->size() / 2}, {.dim_names = {"cp", "tp"}});
    parallelism.fully_sharded = parallelism.long_context = true;
    label = "context parallel x tensor parallel, CP=2 x TP=" + std::to_string(world->size() / 2) + " on 64 positions (FSDP over cp)";
  } else if (mode == "ep" || mode == "ep-fsdp") {
    // Every rank a data-parallel rank; the experts over ep (all ranks, or 2 x FSDP=2 over dp).
    const int64_t ep = mode == "ep" ? world->size() : 2;
    if (world->size() % ep != 0) throw std::invalid_argument(mode + " needs an even number of ranks");
    mesh = dtensor::DeviceMesh::create(world, {world->size() / ep, ep}, {.dim_names = {"dp", "ep"}});
    parallelism.fully_sharded = parallelism.mixture_of_experts = true;
    label = mode == "ep" ? "expert parallel, EP=" + std::to_string(ep) + " (4 experts, top 2; dense parameters FSDP over all ranks)"
                         : "expert parallel x fully sharded, EP=2 x FSDP=" + std::to_string(world->size() / ep) +
                               " (the experts sharded over dp too; dense parameters FSDP over all ranks)";
  } else if (mode == "cp-ep") {
    mesh = dtensor::DeviceMesh::create(world, {1, world->size()}, {.dim_names = {"dp", "ep"}});
    parallelism.fully_sharded = parallelism.long_context = parallelism.mixture_of_experts = true;
    label = "context parallel x expert parallel, CP=" + std::to_string(world->size()) + " on 64 positions with EP=" +
            std::to_string(world->size()) + " over the same ranks (4 experts, top 2; FSDP over them)";
  } else {
    throw std::invalid_argument("unknown mode '" + mode +
                                "' (tp, dp-tp, fsdp, fsdp-tp, hsdp, cp, cp-tp, pp, pp-interleaved, pp-dp, pp-dualpipev, pp-tp, pp-fsdp, pp-fsdp-tp, pp-hsdp, pp-cp, ep, ep-fsdp, pp-ep, cp-ep)");
  }
  return parallelism;
}

using ModelKind = std::pair<bool, bool>;  // (long_context, mixture_of_experts)

// The oracles: each model the runs trained, in one process from step 1 to the runs' last step,
// compared on the runs' steps (from `first`).
std::map<ModelKind, std::vector<double>> train_oracles(const gpt::Corpus& corpus, const std::vector<std::pair<std::string, Run>>& runs,
                                                       int first, int steps) {
  std::map<ModelKind, std::vector<double>> oracle;
  for (const auto& [label, run] : runs) {
    const ModelKind kind{run.long_context, run.mixture_of_experts};
    if (oracle.count(kind)) continue;
    const std::string kind_name = std::string(run.long_context ? "long-context " : "") + (run.mixture_of_experts ? "mixture-of-experts " : "");
    const std::string model = kind_name.empty() ? "single process (the oracle)" : "single process, the " + kind_name + "model (the oracle)";
    const Parallelism one{.long_context = run.long_context, .mixture_of_experts = run.mixture_of_experts};
    const std::vector<double> all = train(corpus, one, first - 1 + steps, model, true).losses;
    oracle[kind] = std::vector<double>(all.begin() + (first - 1), all.end());
  }
  return oracle;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, dtensor::LaunchOptions{}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);  // one core per rank
    const bool print = world->rank() == 0;
    const gpt::Corpus corpus = gpt::load_corpus(args.corpus);
    if (print)
      std::cout << "GPT training: " << world->size() << " ranks (" << world->launcher() << "), vocabulary "
                << corpus.vocabulary.size() << ", corpus " << corpus.tokens.size(0) << " characters, " << args.steps
                << " steps, batch " << kBatch << "\n";
    const std::string resume = args.resume.empty() && args.checkpoint_every > 0 ? latest_checkpoint(args.checkpoint_dir) : args.resume;
    std::vector<std::pair<std::string, Run>> runs;
    for (const std::string& mode : args.modes) {
      // The first mode saves; every mode resumes (from the latest periodic checkpoint when restarted).
      Checkpointing checkpointing{resume, runs.empty() ? args.save : std::string()};
      if (runs.empty()) {
        checkpointing.every = args.checkpoint_every;
        checkpointing.periodic_dir = args.checkpoint_dir;
        checkpointing.blocking = args.blocking_checkpoints;
      }
      std::string label;
      if (is_pipeline_mode(mode)) {
        if (world->size() != 4) throw std::invalid_argument(mode + " runs on 4 ranks");
        const PipelineLayout layout = pipeline_layout(mode, world, label);
        label += " (" + dtensor::to_string(layout.mesh->backend()) + ")";
        runs.emplace_back(label, train_pipeline(corpus, layout, args.steps, label, print, checkpointing));
        continue;
      }
      const Parallelism parallelism = parallelism_for(mode, world, label);
      const dtensor::MeshPtr& mesh = parallelism.mesh;
      label += " (" + dtensor::to_string(mesh->backend()) + ")";
      runs.emplace_back(label, train(corpus, parallelism, args.steps, label, print, checkpointing));
    }
    // Rank 0 runs the oracle; every rank then exits with its verdict, waiting for it as long as rank 0
    // lives (the oracle can outlast the world's timeout on a loaded machine).
    const std::chrono::milliseconds verdict_patience = std::chrono::hours(1);
    if (!print) return world->sum_across_ranks(0, "", verdict_patience) == 0 ? 0 : 1;
    // The oracle trains uninterrupted from step 1 to the runs' last step (once per model the runs
    // trained); they are compared on their steps.
    const int first = runs.empty() ? 1 : runs.front().second.first_step;
    const auto oracle = train_oracles(corpus, runs, first, args.steps);
    bool pass = true;
    std::cout << "\n";
    for (const auto& [label, run] : runs) {
      const std::vector<double>& losses = run.losses;
      const std::vector<double>& reference = oracle.at({run.long_context, run.mixture_of_experts});
      const double diff = max_relative_difference(losses, reference);
      const bool ok = diff <= 1e-4;
      pass = pass && ok;
      std::cout << (ok ? "ok   " : "FAIL ") << label << ": largest relative loss difference " << std::scientific
                << std::setprecision(2) << diff << " over steps " << run.first_step << ".." << run.first_step + static_cast<int>(losses.size()) - 1 << " (loss " << std::fixed
                << std::setprecision(4) << losses.front() << " -> " << losses.back() << ")\n";
    }
    std::cout << (pass ? "\nPASS: every loss trajectory matches the single-process run\n"
                       : "\nFAIL: a loss trajectory differs from the single-process run\n");
    world->sum_across_ranks(pass ? 0 : 1, "", verdict_patience);
    return pass ? 0 : 1;
  });
}
