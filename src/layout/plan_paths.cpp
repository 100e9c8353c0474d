#include <fnmatch.h>

#include "dtensor/parallel_style.h"

namespace dtensor {

std::vector<std::string> split_plan_path(const std::string& path) {
  std::vector<std::string> atoms;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    atoms.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) return atoms;
    start = dot + 1;
  }
}

bool path_matches(const std::string& pattern, const std::string& path) {
  const auto want = split_plan_path(pattern), have = split_plan_path(path);
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (fnmatch(want[i].c_str(), have[i].c_str(), 0) != 0) return false;
  return true;
}

}  // namespace dtensor
