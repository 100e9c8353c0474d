#include "error_text.h"

#include <c10/util/Exception.h>

#include <regex>

namespace dtensor::detail {

std::string without_source_locations(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  // c10 may still carry "Exception raised from f at file:line (most recent call first):" and frames.
  if (const auto raised = text.find("Exception raised from"); raised != std::string::npos) text.erase(raised);
  static const std::regex location(R"(\[[^\[\]\s]+:\d+\] ?)");
  text = std::regex_replace(text, location, "");
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace dtensor::detail
