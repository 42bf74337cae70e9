// Fuzz target: ResponseIdScanner (router/api/response_id.h), the id of a
// Responses answer read from the first bytes a worker sends. The first byte
// chooses the mode (JSON body or SSE stream) and the size of the pieces the
// rest is fed in. Checked: an id found is 1..kMaxIdBytes bytes with no quote
// or backslash; the same bytes fed whole give the same id; after the scan
// gives up or finds, it wants no more.
#include <string>

#include "router/api/response_id.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

std::optional<std::string> scan(std::string_view bytes, bool stream, size_t piece) {
  ResponseIdScanner s(stream);
  for (size_t at = 0; at < bytes.size() && s.wants_more(); at += piece) s.feed(bytes.substr(at, piece));
  if (bytes.size() >= ResponseIdScanner::kMaxScanBytes || s.id()) FUZZ_CHECK(!s.wants_more());
  return s.id();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool stream = data[0] & 1;
  const size_t piece = 1 + (data[0] >> 1);
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto id = scan(bytes, stream, piece);
  FUZZ_CHECK(id == scan(bytes, stream, bytes.size() + 1));
  if (!id) return 0;
  FUZZ_CHECK(!id->empty() && id->size() <= ResponseIdScanner::kMaxIdBytes);
  FUZZ_CHECK(id->find('"') == std::string::npos && id->find('\\') == std::string::npos);
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      std::string("\x00") + R"({"id":"resp_abc","object":"response","output":[]})",
      std::string("\x07") + R"({ "id" : "resp_1-2" })",
      std::string("\x01") +
          "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"
          "\"response\":{\"id\":\"resp_s1\",\"object\":\"response\"}}\n\n",
      std::string("\x05") + "event: error\ndata: {\"type\":\"error\"}\n\n",
  };
}
