#include "common/json_numbers.h"

#include <doctest/doctest.h>

#include <string>

using namespace kvroute;

TEST_CASE("replace_out_of_range_numbers: only numbers a 64-bit reader rejects, never inside strings") {
  std::string out;
  CHECK_FALSE(replace_out_of_range_numbers(R"({"a": 1, "b": -9223372036854775808, "c": 18446744073709551615, "d": 1.5e308})", &out));
  REQUIRE(replace_out_of_range_numbers(R"({"a": 1e400, "s": "1e400 18446744073709551616", "b": [-18446744073709551617, 2]})", &out));
  CHECK(out == R"({"a": 1e308, "s": "1e400 18446744073709551616", "b": [-1e308, 2]})");
  CHECK_FALSE(replace_out_of_range_numbers(R"({"s": "unterminated 1e400)", &out));
}
