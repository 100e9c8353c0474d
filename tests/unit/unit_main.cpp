// The unit tests' main: gtest's, plus --update-goldens (goldens.h), taken out before gtest reads the
// arguments.
#include <gtest/gtest.h>

#include <cstring>

#include "goldens.h"

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--update-goldens") == 0) dtensor::testing::set_update_goldens(true);
    else argv[kept++] = argv[i];
  }
  argc = kept;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
