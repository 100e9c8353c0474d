// Pipeline schedules as data (dtensor/pipeline_schedule.h): the action text, the builders against
// PyTorch 2.15's own pipeline orders, the bubble count of 1F1B against theory, the lowering that adds
// SENDs and RECVs, validation refusing each kind of bad schedule, and schedules read from a CSV table.
//
// The PyTorch orders (compute-only, and lowered by _add_send_recv) are files
// scripts/write_pipeline_orders.py writes with the venv's torch at build time (build_paths::
// pipeline_orders); that script documents where PyTorch's text is
// normalised (GPipe and 1F1B without FSDP's REDUCE_GRAD actions and bubbles; 1F1B's last rank's
// forwards renumbered from 0, a PyTorch bug).

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "../support/build_paths.h"
#include "../support/error_of.h"
#include "dtensor/errors.h"
#include "dtensor/pipeline_schedule.h"

namespace dtensor::pipeline {
namespace {

using dtensor::testing::error_of;

Action act(std::string_view text) { return parse_action(text); }

// A schedule from rows of action text, "" a bubble, with the placement the actions show.
Schedule pipeline_schedule_of(const std::vector<std::vector<std::string>>& rows, int num_microbatches) {
  Schedule schedule;
  schedule.num_ranks = static_cast<int>(rows.size());
  schedule.num_microbatches = num_microbatches;
  for (const auto& row : rows) {
    std::vector<Slot>& slots = schedule.ranks.emplace_back();
    for (const std::string& cell : row) slots.push_back(cell.empty() ? Slot{} : Slot{act(cell)});
  }
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank)
    for (const Slot& slot : schedule.ranks[rank])
      if (slot) {
        if (schedule.stage_to_rank.size() <= size_t(slot->stage)) schedule.stage_to_rank.resize(slot->stage + 1, -1);
        schedule.stage_to_rank[size_t(slot->stage)] = static_cast<int>(rank);
      }
  schedule.num_stages = static_cast<int>(schedule.stage_to_rank.size());
  return schedule;
}

// ---- Action text ---------------------------------------------------------------------------------

TEST(PipelineScheduleAction, PrintsPyTorchsFormat) {
  EXPECT_EQ(to_string(Action{0, ActionKind::Forward, 1}), "0F1");
  EXPECT_EQ(to_string(Action{1, ActionKind::FullBackward, 0}), "1B0");
  EXPECT_EQ(to_string(Action{0, ActionKind::BackwardInput, 2}), "0I2");
  EXPECT_EQ(to_string(Action{0, ActionKind::BackwardWeight, 2}), "0W2");
  EXPECT_EQ(to_string(Action{2, ActionKind::SendForward, 3}), "2SEND_F3");
  EXPECT_EQ(to_string(Action{12, ActionKind::RecvBackward, 10}), "12RECV_B10");
}

TEST(PipelineScheduleAction, RoundTripsEveryKind) {
  const std::vector<ActionKind> kinds = {ActionKind::Forward,      ActionKind::FullBackward, ActionKind::BackwardInput,
                                         ActionKind::BackwardWeight, ActionKind::SendForward,  ActionKind::RecvForward,
                                         ActionKind::SendBackward, ActionKind::RecvBackward};
  for (ActionKind kind : kinds)
    for (int stage : {0, 1, 7, 13})
      for (int microbatch : {0, 5, 11, 120}) {
        const Action action{stage, kind, microbatch};
        EXPECT_EQ(parse_action(to_string(action)), action) << to_string(action);
      }
  EXPECT_EQ(parse_action("  3W4 "), (Action{3, ActionKind::BackwardWeight, 4}));
}

TEST(PipelineScheduleAction, RefusesBadText) {
  for (const char* bad : {"", "F1", "0X1", "0F", "0F1x", "-1F0", "0F-1", "0SEND1", "0SEND_X1", "99999999999F0",
                          "0UNSHARD", "0 F1"}) {
    const std::string message = error_of([&] { parse_action(bad); });
    EXPECT_NE(message.find("bad action '" + std::string(bad) + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("<stage><kind><microbatch>"), std::string::npos) << message;
  }
}

// ---- Goldens from PyTorch ------------------------------------------------------------------------

struct PipelineOrderGolden {
  std::string file;                  // under build_paths::pipeline_orders
  std::function<Schedule()> build;
  // Compared without bubbles: PyTorch 2.15 keeps none in GPipe's and 1F1B's order, and times
  // Interleaved Zero Bubble's wrongly with fewer microbatches than ranks (see the script).
  bool dense;
};

std::vector<PipelineOrderGolden> pipeline_order_goldens() {
  std::vector<PipelineOrderGolden> goldens = {
      {"gpipe_4_4_8", [] { return gpipe(4, 8); }, true},
      {"1f1b_4_4_8", [] { return one_f_one_b(4, 8); }, true},
      {"zbv_zero_bubble_8_4_8", [] { return zbv_zero_bubble(4, 8); }, false},
      {"dual_pipe_v_8_4_8", [] { return dual_pipe_v(4, 8); }, false},
      {"interleaved_zero_bubble_4_4_2", [] { return interleaved_zero_bubble(4, 1, 2); }, true},
  };
  for (int per_rank : {1, 2}) {
    const std::string sizes = std::to_string(4 * per_rank) + "_4_8";
    goldens.push_back({"interleaved_1f1b_" + sizes, [=] { return interleaved_1f1b(4, per_rank, 8); }, false});
    goldens.push_back({"looped_bfs_" + sizes, [=] { return looped_bfs(4, per_rank, 8); }, false});
    goldens.push_back(
        {"interleaved_zero_bubble_" + sizes, [=] { return interleaved_zero_bubble(4, per_rank, 8); }, false});
  }
  return goldens;
}

TEST(PipelineScheduleGoldens, MatchPyTorchsPipelineOrder) {
  auto read = [&](const std::string& file) {
    const std::string path = std::string(build_paths::pipeline_orders) + "/" + file;
    std::ifstream in(path);
    EXPECT_TRUE(in) << "missing " << path << " (scripts/write_pipeline_orders.py writes it)";
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  for (const PipelineOrderGolden& golden : pipeline_order_goldens()) {
    const Schedule built = golden.build();
    const Schedule compared = golden.dense ? without_bubbles(built) : built;
    EXPECT_EQ(format_pipeline_order(compared), read(golden.file + ".txt")) << golden.file;
    // The lowering places SENDs and RECVs as PyTorch's _add_send_recv does, step for step.
    EXPECT_EQ(format_pipeline_order(with_communication(compared)), read(golden.file + ".lowered.txt"))
        << golden.file;
  }
}

// ---- Builders ------------------------------------------------------------------------------------

TEST(PipelineScheduleBuilders, EveryBuilderValidatesAtManySizes) {
  for (int ranks : {1, 2, 3, 4})
    for (int microbatches : {1, 2, 3, 8}) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", microbatches " + std::to_string(microbatches));
      validate(gpipe(ranks, microbatches));
      validate(one_f_one_b(ranks, microbatches));
      validate(zbv_zero_bubble(ranks, microbatches));
      if (microbatches >= 2 * ranks) validate(dual_pipe_v(ranks, microbatches));
      for (int per_rank : {1, 2, 3}) {
        validate(looped_bfs(ranks, per_rank, microbatches));
        if (microbatches % std::max(1, microbatches / ranks) != 0) continue;
        validate(interleaved_1f1b(ranks, per_rank, microbatches));
        validate(interleaved_zero_bubble(ranks, per_rank, microbatches));
      }
    }
}

TEST(PipelineScheduleBuilders, ZeroBubbleSplitsEveryBackwardIntoInputThenWeight) {
  for (const Schedule& schedule : {interleaved_zero_bubble(4, 2, 8), zbv_zero_bubble(4, 8)}) {
    int inputs = 0, weights = 0;
    for (const auto& slots : schedule.ranks)
      for (const Slot& slot : slots) {
        ASSERT_TRUE(!slot || slot->kind != ActionKind::FullBackward) << to_string(*slot);
        inputs += slot && slot->kind == ActionKind::BackwardInput;
        weights += slot && slot->kind == ActionKind::BackwardWeight;
      }
    EXPECT_EQ(inputs, 8 * 8);
    EXPECT_EQ(weights, 8 * 8);
  }
}

TEST(PipelineScheduleBuilders, ZbvPlacesStagesInAV) {
  EXPECT_EQ(v_placement(4, 8), (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
  EXPECT_EQ(loop_placement(4, 8), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(zbv_zero_bubble(4, 8).stage_to_rank, v_placement(4, 8));
  EXPECT_NE(error_of([] { loop_placement(4, 6); }).find("6 stages cannot be placed evenly on 4 ranks"),
            std::string::npos);
}

TEST(PipelineScheduleBuilders, DualPipeVPairsForwardsWithBackwardsOfTheOtherStage) {
  const Schedule schedule = dual_pipe_v(4, 8);
  EXPECT_EQ(schedule.stage_to_rank, v_placement(4, 8));
  for (size_t rank = 0; rank < 4; ++rank) {
    EXPECT_FALSE(schedule.overlapped[rank].empty()) << "rank " << rank;
    for (const size_t step : schedule.overlapped[rank]) {
      const Action& forward = *schedule.ranks[rank][step];
      const Action& backward = *schedule.ranks[rank][step + 1];
      EXPECT_EQ(forward.kind, ActionKind::Forward);
      EXPECT_EQ(backward.kind, ActionKind::FullBackward);
      EXPECT_NE(forward.stage, backward.stage);
    }
  }
  EXPECT_NE(error_of([] { dual_pipe_v(4, 7); }).find("needs at least as many microbatches as stages (8 on 4 ranks), got 7"),
            std::string::npos);
}

TEST(PipelineScheduleBuilders, InterleavedRefusesMicrobatchesOffTheRounds) {
  // 10 microbatches on 4 ranks run in 2 rounds of 5; 9 cannot be split into 2 rounds.
  validate(interleaved_1f1b(4, 2, 10));
  EXPECT_NE(error_of([] { interleaved_1f1b(4, 2, 9); }).find("not a multiple of the number of rounds, 2"),
            std::string::npos);
}

// Every rank of 1F1B idles (p - 1) of every (m + p - 1) steps, with forward and backward one step each.
TEST(PipelineScheduleBuilders, OneFOneBBubbleFractionIsTheTheorys) {
  for (int ranks : {2, 4, 8})
    for (int microbatches : {4, 8, 16, 32}) {
      const Schedule schedule = one_f_one_b(ranks, microbatches);
      size_t steps = 0;
      for (const auto& slots : schedule.ranks) steps = std::max(steps, slots.size());
      EXPECT_EQ(steps, size_t(2 * (microbatches + ranks - 1)));
      for (const auto& slots : schedule.ranks) {
        const size_t busy = size_t(std::count_if(slots.begin(), slots.end(), [](const Slot& s) { return s.has_value(); }));
        const size_t idle = steps - busy;
        // idle / steps == (p - 1) / (m + p - 1), in integers.
        EXPECT_EQ(idle * size_t(microbatches + ranks - 1), steps * size_t(ranks - 1))
            << "ranks " << ranks << ", microbatches " << microbatches;
      }
    }
}

// ---- Lowering ------------------------------------------------------------------------------------

TEST(PipelineScheduleLowering, AddsEachSendAndItsRecvOnThePeer) {
  const Schedule lowered = with_communication(gpipe(2, 1));
  EXPECT_EQ(schedule_csv(lowered),
            "0F0,0SEND_F0,0RECV_B0,0B0\n"
            "1RECV_F0,1F0,1B0,1SEND_B0\n");
  validate(lowered);
  validate(lowered, SendCompletion::Rendezvous);
}

TEST(PipelineScheduleLowering, NeedsNoTransferBetweenStagesOnOneRank) {
  // ZBV's turn: stages 3 and 4 both live on rank 3.
  const Schedule lowered = with_communication(zbv_zero_bubble(4, 8));
  for (const Slot& slot : lowered.ranks[3]) {
    ASSERT_TRUE(slot.has_value());
    EXPECT_FALSE(slot->kind == ActionKind::SendForward && slot->stage == 3) << to_string(*slot);
    EXPECT_FALSE(slot->kind == ActionKind::SendBackward && slot->stage == 4) << to_string(*slot);
  }
  validate(lowered);
}

// ---- Validation ----------------------------------------------------------------------------------

TEST(PipelineScheduleValidation, RefusesAMissingForward) {
  Schedule schedule = one_f_one_b(4, 8);
  std::erase(schedule.ranks[1], Slot{act("1F3")});
  EXPECT_NE(error_of([&] { validate(schedule); }).find("stage 1, microbatch 3 (rank 1) runs its forward 0 times"),
            std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesAnOverlappedPairThatIsNotAForwardAndABackward) {
  Schedule schedule = pipeline_schedule_of({{"0F0", "0F1", "0B0", "0B1"}}, 2);
  schedule.overlapped = {{0}};
  EXPECT_NE(error_of([&] { validate(schedule); }).find("rank 0, step 0: an overlapped action (OVERLAP_F_B) must be a forward (F) and then a full backward (B)"),
            std::string::npos);
  schedule.overlapped = {{1}};
  validate(schedule);
  EXPECT_EQ(format_pipeline_order(schedule).find("(0F1;0B0)OVERLAP_F_B") != std::string::npos, true);
}

TEST(PipelineScheduleValidation, RefusesAMissingOrHalfBackward) {
  const Schedule no_backward = pipeline_schedule_of({{"0F0", "0F1", "0B0"}}, 2);
  EXPECT_NE(error_of([&] { validate(no_backward); }).find("stage 0, microbatch 1 (rank 0) runs B 0, I 0 and W 0 times"),
            std::string::npos);
  const Schedule input_only = pipeline_schedule_of({{"0F0", "0I0"}}, 1);
  EXPECT_NE(error_of([&] { validate(input_only); }).find("runs B 0, I 1 and W 0 times"), std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesBackwardBeforeForward) {
  const Schedule schedule = pipeline_schedule_of({{"0F0", "", "", "0B0"}, {"", "1B0", "1F0"}}, 1);
  EXPECT_NE(error_of([&] { validate(schedule); })
                .find("rank 1, step 1 (1B0: stage 1, microbatch 0) runs its backward before its forward"),
            std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesWeightBeforeInput) {
  const Schedule schedule = pipeline_schedule_of({{"0F0", "0W0", "0I0"}}, 1);
  EXPECT_NE(error_of([&] { validate(schedule); }).find("rank 0, step 1 (0W0: stage 0, microbatch 0) runs W before its I"),
            std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesAStageOnTheWrongRankOrOutOfRange) {
  Schedule schedule = gpipe(2, 1);
  schedule.ranks[0].push_back(act("1F0"));
  EXPECT_NE(error_of([&] { validate(schedule); }).find("rank 0, step 4 (1F0: stage 1, microbatch 0): stage 1 is on rank 1"),
            std::string::npos);
  schedule = gpipe(2, 1);
  schedule.ranks[0].push_back(act("0F5"));
  EXPECT_NE(error_of([&] { validate(schedule); }).find("there are 1 microbatches"), std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesASendWithoutItsRecv) {
  Schedule lowered = with_communication(one_f_one_b(2, 2));
  std::erase(lowered.ranks[1], Slot{act("1RECV_F1")});
  EXPECT_NE(error_of([&] { validate(lowered); }).find("(0SEND_F1: stage 0, microbatch 1) has no 1RECV_F1 on rank 1"),
            std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesARecvWithoutItsSend) {
  Schedule lowered = with_communication(one_f_one_b(2, 2));
  std::erase(lowered.ranks[1], Slot{act("1SEND_B0")});
  EXPECT_NE(error_of([&] { validate(lowered); }).find("(0RECV_B0: stage 0, microbatch 0) has no 1SEND_B0 on rank 1"),
            std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesAComputeBeforeItsRecv) {
  const Schedule lowered = pipeline_schedule_of(
      {{"0F0", "0SEND_F0", "0RECV_B0", "0B0"}, {"1F0", "1RECV_F0", "1B0", "1SEND_B0"}}, 1);
  EXPECT_NE(error_of([&] { validate(lowered); })
                .find("rank 1, step 0 (1F0: stage 1, microbatch 0) runs before 1RECV_F0 brings the output of stage 0"),
            std::string::npos);
}

TEST(PipelineScheduleValidation, RefusesTwoRanksBothReceivingFirst) {
  const Schedule lowered = pipeline_schedule_of(
      {{"0RECV_B0", "0F0", "0SEND_F0", "0B0"}, {"1RECV_F0", "1F0", "1B0", "1SEND_B0"}}, 1);
  const std::string message = error_of([&] { validate(lowered); });
  EXPECT_NE(message.find("cannot finish"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0, step 0 (0RECV_B0: stage 0, microbatch 0) waits for 1SEND_B0 on rank 1"),
            std::string::npos) << message;
  EXPECT_NE(message.find("rank 1, step 0 (1RECV_F0: stage 1, microbatch 0) waits for 0SEND_F0 on rank 0"),
            std::string::npos) << message;
}

TEST(PipelineScheduleValidation, BlockingSendsDeadlockWhereBufferedOnesDoNot) {
  // Rank 0 sends its second forward while rank 1 sends its first gradient back: fine with isends, a
  // hang if each send waits for its receive.
  const Schedule lowered = pipeline_schedule_of(
      {{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"},
       {"1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"}},
      2);
  validate(lowered, SendCompletion::Buffered);
  const std::string message = error_of([&] { validate(lowered, SendCompletion::Rendezvous); });
  EXPECT_NE(message.find("rank 0, step 3 (0SEND_F1: stage 0, microbatch 1) waits for 1RECV_F1 on rank 1"),
            std::string::npos) << message;
  EXPECT_NE(message.find("rank 1, step 3 (1SEND_B0: stage 1, microbatch 0) waits for 0RECV_B0 on rank 0"),
            std::string::npos) << message;
}

TEST(PipelineScheduleValidation, RefusesAComputeOnlyOrderThatWaitsInACycle) {
  // Two stages per rank: rank 0 starts with stage 2, which needs stage 1 (rank 1), which needs stage 0,
  // which rank 0 runs only after stage 2.
  const Schedule schedule = pipeline_schedule_of(
      {{"2F0", "0F0", "2B0", "0B0"}, {"1F0", "3F0", "3B0", "1B0"}}, 1);
  const std::string message = error_of([&] { validate(schedule); });
  EXPECT_NE(message.find("cannot finish"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0, step 0 (2F0: stage 2, microbatch 0) waits for stage 1 on rank 1"),
            std::string::npos) << message;
  EXPECT_NE(message.find("rank 1, step 0 (1F0: stage 1, microbatch 0) waits for stage 0 on rank 0"),
            std::string::npos) << message;
}

// ---- CSV -----------------------------------------------------------------------------------------

TEST(PipelineScheduleCsv, ReadsWhatPyTorchWritesAndBack) {
  for (const Schedule& built : {one_f_one_b(4, 8), interleaved_zero_bubble(4, 2, 8), zbv_zero_bubble(4, 8), dual_pipe_v(4, 8)}) {
    const Schedule read = read_schedule_csv(schedule_csv(built), 8);
    EXPECT_EQ(read.ranks, built.ranks);
    EXPECT_EQ(format_pipeline_order(read), format_pipeline_order(built));  // overlapped pairs too
    EXPECT_EQ(read.stage_to_rank, built.stage_to_rank);
    EXPECT_EQ(read.num_stages, built.num_stages);
    const Schedule lowered = with_communication(built);
    EXPECT_EQ(read_schedule_csv(schedule_csv(lowered), 8).ranks, lowered.ranks);
  }
  // Quoted cells and Windows line ends, as a spreadsheet may write them.
  const Schedule quoted = read_schedule_csv("\"0F0\",,\"0B0\"\r\n,1F0,1B0\r\n", 1);
  EXPECT_EQ(quoted.ranks[0][2], Slot{act("0B0")});
  EXPECT_EQ(quoted.ranks[1][0], Slot{});
}

TEST(PipelineScheduleCsv, RefusesBadCellsNamingRowAndColumn) {
  const std::string bad_cell = error_of([] { read_schedule_csv("0F0,0B0\n1F0,1Q0,1B0\n", 1); });
  EXPECT_NE(bad_cell.find("row 1 (rank 1), column 1: dtensor: pipeline schedule: bad action '1Q0'"), std::string::npos)
      << bad_cell;
  EXPECT_NE(error_of([] { read_schedule_csv("0F0,1F0,0B0\n1B0\n", 1); })
                .find("stage 1 runs on rank 0 and on rank 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_schedule_csv("0F0,0B0\n2F0,2B0\n", 1); }).find("stage 1 runs on no rank"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_schedule_csv("0F0,0B0\n1B0,1F0\n", 1); }).find("runs its backward before its forward"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_schedule_csv("", 1); }).find("no rows"), std::string::npos);
  EXPECT_NE(error_of([] { read_schedule_csv("0F0,(0B0;0F1)OVERLAP_F_B,0B1\n", 2); }).find("column 1: dtensor: overlapped action '(0B0;0F1)OVERLAP_F_B' must pair a forward (F) with a full backward (B)"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_schedule_csv("0F0,(0F1)OVERLAP_F_B,0B0,0B1\n", 2); }).find("bad overlapped action"), std::string::npos);
}

}  // namespace
}  // namespace dtensor::pipeline
