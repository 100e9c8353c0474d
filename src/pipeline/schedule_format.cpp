// PyTorch 2.15's _format_pipeline_order, character for character, so that a schedule can be compared
// with PyTorch's as text: a header of rank labels, then one row per step ("Step 07: "), each cell
// left-aligned to its column's width. A column is as wide as its longest action, and at least as wide
// as a step label (PyTorch measures column i against step label i, and every step label has the same
// width); the rank label is not measured, so "Rank 10" may overflow a narrow column, as in PyTorch.

#include <algorithm>

#include "dtensor/pipeline_schedule.h"
#include "schedule_rules.h"

namespace dtensor::pipeline {
namespace {

std::string padded(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

std::string step_label(size_t step, size_t num_steps) {
  const size_t digits = std::to_string(num_steps == 0 ? 0 : num_steps - 1).size();
  const std::string number = std::to_string(step);
  return "Step " + std::string(digits - std::min(digits, number.size()), '0') + number;
}

}  // namespace

std::vector<std::string> detail::cells_of(const Schedule& schedule, size_t rank) {
  const std::vector<Slot>& slots = schedule.ranks[rank];
  std::vector<std::string> cells;
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::string text = slots[i] ? to_string(*slots[i]) : "";
    if (schedule.overlaps_next(rank, i) && i + 1 < slots.size() && slots[i + 1]) {
      cells.push_back("(" + text + ";" + to_string(*slots[++i]) + std::string(detail::kOverlappedSuffix));
    } else {
      cells.push_back(text);
    }
  }
  return cells;
}

std::string format_pipeline_order(const Schedule& schedule) {
  std::vector<std::vector<std::string>> cells;
  size_t num_steps = 0;
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    cells.push_back(detail::cells_of(schedule, rank));
    num_steps = std::max(num_steps, cells.back().size());
  }
  const size_t label_width = step_label(0, num_steps).size();
  const auto cell_text = [&](size_t rank, size_t step) { return step < cells[rank].size() ? cells[rank][step] : std::string(); };

  std::vector<size_t> widths(schedule.ranks.size(), label_width);
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank)
    for (size_t step = 0; step < num_steps; ++step) widths[rank] = std::max(widths[rank], cell_text(rank, step).size());

  auto row = [&](std::string line, auto cell) {
    for (size_t rank = 0; rank < widths.size(); ++rank)
      line += (rank == 0 ? "" : " ") + padded(cell(rank), widths[rank]);
    return line + "\n";
  };
  std::string table = row(std::string(label_width + 2, ' '),
                          [](size_t rank) { return "Rank " + std::to_string(rank); });
  for (size_t step = 0; step < num_steps; ++step)
    table += row(step_label(step, num_steps) + ": ",
                 [&](size_t rank) { return cell_text(rank, step); });
  return table;
}

}  // namespace dtensor::pipeline
