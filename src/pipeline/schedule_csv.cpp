// A user's schedule as a table, as PyTorch's _PipelineScheduleRuntime._load_csv reads it (and
// _dump_csv writes it): row r is rank r's actions, one per cell, an empty cell a bubble.

#include <algorithm>

#include "dtensor/errors.h"
#include "dtensor/pipeline_schedule.h"
#include "schedule_rules.h"

namespace dtensor::pipeline {
namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// A cell as Python's csv module writes one: action text never needs quoting, but a quoted cell
// ("0F1") is read as its contents.
std::string_view unquoted(std::string_view cell) {
  const auto first = cell.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  cell = cell.substr(first, cell.find_last_not_of(" \t\r") - first + 1);
  if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') return cell.substr(1, cell.size() - 2);
  return cell;
}

// A cell's slots: none for an empty cell (a bubble: one empty slot), one action, or the two of an
// overlapped pair "(0F1;3B0)OVERLAP_F_B".
std::vector<Slot> read_cell(std::string_view cell, size_t row, size_t column) {
  const std::string_view text = unquoted(cell);
  if (text.empty()) return {std::nullopt};
  try {
    if (text.front() != '(' || !text.ends_with(detail::kOverlappedSuffix)) return {parse_action(text)};
    const std::vector<std::string_view> parts = split(text.substr(1, text.size() - 1 - detail::kOverlappedSuffix.size()), ';');
    if (parts.size() != 2)
      throw DTensorError("bad overlapped action '" + std::string(text) + "': expected (<forward>;<backward>)OVERLAP_F_B");
    const Action forward = parse_action(parts[0]), backward = parse_action(parts[1]);
    if (forward.kind != ActionKind::Forward || backward.kind != ActionKind::FullBackward)
      throw DTensorError("overlapped action '" + std::string(text) + "' must pair a forward (F) with a full backward (B)");
    return {forward, backward};
  } catch (const DTensorError& e) {
    throw DTensorError("pipeline schedule CSV: row " + std::to_string(row) + " (rank " + std::to_string(row) +
                       "), column " + std::to_string(column) + ": " + e.what());
  }
}

// Each stage lives on the one row that runs it.
std::vector<int> placement_of(const std::vector<std::vector<Slot>>& ranks) {
  std::vector<int> stage_to_rank;
  for (size_t rank = 0; rank < ranks.size(); ++rank)
    for (const Slot& slot : ranks[rank]) {
      if (!slot) continue;
      const size_t stage = static_cast<size_t>(slot->stage);
      if (stage_to_rank.size() <= stage) stage_to_rank.resize(stage + 1, -1);
      if (stage_to_rank[stage] >= 0 && stage_to_rank[stage] != static_cast<int>(rank))
        throw DTensorError("pipeline schedule CSV: stage " + std::to_string(stage) + " runs on rank " +
                           std::to_string(stage_to_rank[stage]) + " and on rank " + std::to_string(rank) +
                           "; a stage lives on one rank");
      stage_to_rank[stage] = static_cast<int>(rank);
    }
  for (size_t stage = 0; stage < stage_to_rank.size(); ++stage)
    if (stage_to_rank[stage] < 0)
      throw DTensorError("pipeline schedule CSV: stage " + std::to_string(stage) + " runs on no rank");
  return stage_to_rank;
}

}  // namespace

Schedule read_schedule_csv(std::string_view text, int num_microbatches) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  if (text.empty()) throw DTensorError("pipeline schedule CSV: no rows");
  Schedule schedule;
  for (std::string_view line : split(text, '\n')) {
    std::vector<Slot>& slots = schedule.ranks.emplace_back();
    std::set<size_t>& overlapped = schedule.overlapped.emplace_back();
    const std::vector<std::string_view> cells = split(line, ',');
    for (size_t column = 0; column < cells.size(); ++column) {
      const std::vector<Slot> read = read_cell(cells[column], schedule.ranks.size() - 1, column);
      if (read.size() == 2) overlapped.insert(slots.size());
      slots.insert(slots.end(), read.begin(), read.end());
    }
  }
  schedule.num_ranks = static_cast<int>(schedule.ranks.size());
  schedule.stage_to_rank = placement_of(schedule.ranks);
  schedule.num_stages = static_cast<int>(schedule.stage_to_rank.size());
  schedule.num_microbatches = num_microbatches;
  validate(schedule);
  return schedule;
}

std::string schedule_csv(const Schedule& schedule) {
  std::string csv;
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    const std::vector<std::string> cells = detail::cells_of(schedule, rank);
    for (size_t i = 0; i < cells.size(); ++i) csv += (i == 0 ? "" : ",") + cells[i];
    csv += "\n";
  }
  return csv;
}

}  // namespace dtensor::pipeline
