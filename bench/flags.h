#pragma once
// The benchmarks' command lines: "--name value" pairs, each name one the benchmark knows.

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

class Flags {
 public:
  // Refuses a name outside `known` (listing them) and a name without a value.
  Flags(int argc, char** argv, const std::vector<std::string>& known) {
    for (int i = 1; i < argc; i += 2) {
      const std::string flag = argv[i];
      if (std::find(known.begin(), known.end(), flag) == known.end()) {
        std::string names;
        for (const std::string& k : known) names += (names.empty() ? "" : ", ") + k;
        throw std::invalid_argument("unknown flag " + flag + " (use " + names + ")");
      }
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + flag);
      values_[flag] = argv[i + 1];
    }
  }
  std::string text(const std::string& flag, const std::string& fallback) const {
    const auto it = values_.find(flag);
    return it == values_.end() ? fallback : it->second;
  }
  int number(const std::string& flag, int fallback) const {
    const auto it = values_.find(flag);
    return it == values_.end() ? fallback : std::stoi(it->second);
  }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace bench
