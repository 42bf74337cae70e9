// The loop both reference comparators share (compare_templates.cpp,
// compare_chat.cpp): each non-empty line of a cases file, parsed as JSON,
// with the reference renderer's line at the same position.
#pragma once

#include <simdjson.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kvroute::testing {

// Calls equal(case, reference) per pair (it prints its own diff when it
// returns false), then prints "N/M equal". Returns the exit status: 0 when
// every pair is equal, 1 if one is not, 2 when the reference file is short.
template <class Equal>
int compare_with_reference(const char* cases_path, const char* ref_path, Equal equal) {
  std::ifstream cases(cases_path), refs(ref_path);
  std::string case_line, ref_line;
  simdjson::dom::parser case_parser, ref_parser;
  size_t total = 0, same = 0;
  while (std::getline(cases, case_line)) {
    if (case_line.empty()) continue;
    if (!std::getline(refs, ref_line)) {
      std::printf("reference file is short\n");
      return 2;
    }
    ++total;
    if (equal(case_parser.parse(case_line).value(), ref_parser.parse(ref_line).value())) ++same;
  }
  std::printf("%zu/%zu equal\n", same, total);
  return same == total ? 0 : 1;
}

}  // namespace kvroute::testing
