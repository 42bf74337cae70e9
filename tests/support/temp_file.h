// A temporary file holding `text`, for tests of code that reads a file (API
// keys, a worker's key): its path. Left in /tmp for the OS to clean.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace kvroute::testing {

inline std::string temp_file(const std::string& text) {
  char path[] = "/tmp/kvroute_test_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

}  // namespace kvroute::testing
