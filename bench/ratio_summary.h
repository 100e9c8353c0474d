#pragma once
// What the benchmarks print of a sample of per-round ratios (one implementation's step over another's,
// timed back to back in each round): the median with its 95% confidence interval and the middle half.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace bench {

inline double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// "median 1.016 (95% confidence 0.998-1.036), middle half 0.966-1.055, over 60 rounds". The median's
// interval is free of any assumed distribution: the order statistics j = floor(n/2 - 0.98 sqrt(n)) and
// n + 1 - j, counted from 1 (the binomial's normal approximation). A goal inside it is not resolved.
inline std::string ratio_summary(std::vector<double> ratios) {
  std::sort(ratios.begin(), ratios.end());
  const double n = static_cast<double>(ratios.size());
  const auto low = static_cast<size_t>(std::max(0.0, std::floor(n / 2 - 0.98 * std::sqrt(n)) - 1));
  const size_t high = ratios.size() - 1 - low;
  char text[200];
  std::snprintf(text, sizeof text, "median %.3f (95%% confidence %.3f-%.3f), middle half %.3f-%.3f, over %zu rounds", quantile(ratios, 0.5),
                ratios[low], ratios[high], quantile(ratios, 0.25), quantile(ratios, 0.75), ratios.size());
  return text;
}

}  // namespace bench
