#include "goldens.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "../support/build_paths.h"

namespace dtensor::testing {
namespace {

bool update_goldens = false;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

void set_update_goldens(bool on) { update_goldens = on; }

std::string line_diff(const std::string& expected, const std::string& actual) {
  const auto a = lines_of(expected), b = lines_of(actual);
  // Longest common subsequence of lines, then a walk that prints it with what differs around it.
  std::vector<std::vector<size_t>> common(a.size() + 1, std::vector<size_t>(b.size() + 1, 0));
  for (size_t i = a.size(); i-- > 0;)
    for (size_t j = b.size(); j-- > 0;)
      common[i][j] = a[i] == b[j] ? common[i + 1][j + 1] + 1 : std::max(common[i + 1][j], common[i][j + 1]);
  std::string out;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (i < a.size() && j < b.size() && a[i] == b[j]) {
      out += "  " + a[i++] + "\n";
      ++j;
    } else if (j < b.size() && (i == a.size() || common[i][j + 1] >= common[i + 1][j])) {
      out += "+ " + b[j++] + "\n";
    } else {
      out += "- " + a[i++] + "\n";
    }
  }
  return out;
}

::testing::AssertionResult matches_golden(const std::string& relative, const std::string& text) {
  const std::filesystem::path path = std::filesystem::path(build_paths::goldens) / relative;
  if (update_goldens) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return ::testing::AssertionSuccess();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return ::testing::AssertionFailure() << "no golden file " << path.string()
                                         << " (dtensor_unit_tests --update-goldens writes it; review it before committing)";
  std::ostringstream golden;
  golden << in.rdbuf();
  if (golden.str() == text) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << path.string() << " differs (- golden, + now; --update-goldens to accept):\n"
                                       << line_diff(golden.str(), text);
}

}  // namespace dtensor::testing
