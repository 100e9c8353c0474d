// Actions in PyTorch's text: <stage><kind><microbatch>, e.g. "0F1", "1B0", "2SEND_F3".

#include <array>
#include <charconv>
#include <utility>

#include "dtensor/errors.h"
#include "dtensor/pipeline_schedule.h"

namespace dtensor::pipeline {
namespace {

// Longest names first: "SEND_F" must not be read as a stage followed by "S".
constexpr std::array<std::pair<std::string_view, ActionKind>, 8> kKindNames = {{
    {"SEND_F", ActionKind::SendForward},
    {"RECV_F", ActionKind::RecvForward},
    {"SEND_B", ActionKind::SendBackward},
    {"RECV_B", ActionKind::RecvBackward},
    {"F", ActionKind::Forward},
    {"B", ActionKind::FullBackward},
    {"I", ActionKind::BackwardInput},
    {"W", ActionKind::BackwardWeight},
}};

[[noreturn]] void refuse_action_text(std::string_view text, std::string_view why) {
  throw DTensorError("pipeline schedule: bad action '" + std::string(text) + "': " + std::string(why) +
                     "; an action is <stage><kind><microbatch>, kind one of F B I W SEND_F RECV_F "
                     "SEND_B RECV_B, e.g. 0F1, 1B0, 2SEND_F3");
}

// Reads the decimal number at the front of `rest` and moves past it.
int read_number(std::string_view& rest, std::string_view text, std::string_view what) {
  // Digits only: from_chars would take a sign, and PyTorch's pattern has none.
  if (rest.empty() || rest.front() < '0' || rest.front() > '9')
    refuse_action_text(text, "no " + std::string(what) + " number");
  int value = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (error != std::errc()) refuse_action_text(text, std::string(what) + " number too large");
  rest.remove_prefix(static_cast<size_t>(end - rest.data()));
  return value;
}

std::string_view trimmed(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

}  // namespace

std::string to_string(ActionKind kind) {
  for (const auto& [name, named_kind] : kKindNames)
    if (named_kind == kind) return std::string(name);
  throw DTensorError("pipeline schedule: unknown action kind " + std::to_string(static_cast<int>(kind)));
}

std::string to_string(const Action& action) {
  return std::to_string(action.stage) + to_string(action.kind) + std::to_string(action.microbatch);
}

Action parse_action(std::string_view text) {
  std::string_view rest = trimmed(text);
  Action action;
  action.stage = read_number(rest, text, "stage");
  bool named = false;
  for (const auto& [name, kind] : kKindNames) {
    if (!rest.starts_with(name)) continue;
    action.kind = kind;
    rest.remove_prefix(name.size());
    named = true;
    break;
  }
  if (!named) refuse_action_text(text, "unknown kind '" + std::string(rest) + "'");
  // PyTorch also has actions without a microbatch (UNSHARD, REDUCE_GRAD): FSDP's, which dtensor adds
  // in its own pass, so every action here names one.
  action.microbatch = read_number(rest, text, "microbatch");
  if (!rest.empty()) refuse_action_text(text, "unexpected '" + std::string(rest) + "' after the microbatch");
  return action;
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::Forward || kind == ActionKind::FullBackward ||
         kind == ActionKind::BackwardInput || kind == ActionKind::BackwardWeight;
}

bool is_communication(ActionKind kind) { return !is_compute(kind); }

bool computes_weight_gradients(ActionKind kind) { return kind == ActionKind::FullBackward || kind == ActionKind::BackwardWeight; }

}  // namespace dtensor::pipeline
