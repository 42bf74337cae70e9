// Reading an untrusted JSON request body for conversion into another API's
// body, keeping every value's text exactly as the client wrote it. The Responses
// and Messages parsers (router/api/) copy tool schemas, tool-call arguments and
// content parts byte for byte into the chat body they build, so numbers that a
// 64-bit reader cannot hold (1e400, integers beyond 2^64) reach the chat
// template as Python reads them (tokenizer/README.md "Checked against Python").
//
// load() validates the whole body once (simdjson DOM: syntax, UTF-8, numbers,
// depth <= 1024) and keeps a padded copy; object()/array() then read one
// container of it (simdjson On-Demand over that container's text) into fields
// or elements, each with its raw text. A container is read again from its raw
// text when the caller descends into it, at the next `level`: each level has its
// own parser, so the unescaped strings and keys of a level stay valid while
// deeper levels are read, until that level reads another container.
// Thread-safety: a JsonReader is used by one thread at a time; its parsers are
// its own.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>

#include "router/openai_request.h"

namespace kvroute::api {

enum class JsonType : uint8_t { Null, Bool, Number, String, Array, Object };

struct JsonValue {
  JsonType type = JsonType::Null;
  std::string_view raw;  // as written in the body (a string with its quotes and escapes)
  std::string_view str;  // a string, unescaped
  bool boolean = false;
  bool is(JsonType t) const { return type == t; }
  bool null() const { return type == JsonType::Null; }
  // A JSON integer in [INT64_MIN, INT64_MAX], or a number with no fraction in that range
  // (pydantic's lax int); nullopt otherwise.
  std::optional<int64_t> integer() const;
};

struct JsonField {
  std::string_view key;  // unescaped
  JsonValue value;
};

// Fields of one object; a duplicate key's last value wins (Python's json.loads).
struct JsonObject {
  std::vector<JsonField> fields;
  const JsonValue* get(std::string_view key) const {
    for (size_t i = fields.size(); i-- > 0;)
      if (fields[i].key == key) return &fields[i].value;
    return nullptr;
  }
  // Absent or null.
  bool absent(std::string_view key) const {
    const JsonValue* v = get(key);
    return v == nullptr || v->null();
  }
};

class JsonReader {
 public:
  static constexpr int kLevels = 8;
  // A container read by object()/array() holds at most this many fields or
  // elements (each costs 48 bytes of JsonValue, 24 times its "0," in the body).
  static constexpr size_t kMaxElements = 100'000;

  // Copies `body` into the padded buffer and validates it. Returns false with a
  // client-facing message in *error when it is not JSON or not an object.
  bool load(std::string_view body, std::string* error);
  // The whole body as an object (level 0).
  bool root(JsonObject& out) { return object(text_, 0, out); }
  // `raw` must be the raw text of an object (or array) of the loaded body. False
  // when it is not one, or holds more than kMaxElements (then overflowed()).
  bool object(std::string_view raw, int level, JsonObject& out);
  bool array(std::string_view raw, int level, std::vector<JsonValue>& out);
  // Whether a read since load() failed on kMaxElements.
  bool overflowed() const { return overflowed_; }
  // Bytes of document the reader's parsers are sized for (the largest body read
  // since the last trim()); trim() gives back anything over `keep`.
  size_t capacity() const;
  void trim(size_t keep);

 private:
  bool read_value(simdjson::ondemand::value v, JsonValue& out);
  bool overflowed_ = false;
  std::string buffer_;     // body + SIMDJSON_PADDING
  std::string_view text_;  // the body inside buffer_
  simdjson::dom::parser validator_;
  std::array<simdjson::ondemand::parser, kLevels> parsers_;
};

// The calling thread's reader (the io thread's, reused from request to request).
JsonReader& thread_json_reader();

// The end of parsing one body on this thread's reader: a failure caused by
// kMaxElements says so in err's message, and the reader gives back what one
// large body grew it by (over 1 MiB, as router/openai_request.cpp's parsers
// do), so one 8 MiB body does not pin that much on every io thread. Returns ok.
bool finish_body(bool ok, ApiError& err);

}  // namespace kvroute::api
