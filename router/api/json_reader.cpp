#include "router/api/json_reader.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "common/json_numbers.h"

namespace kvroute::api {

namespace ondemand = simdjson::ondemand;

std::optional<int64_t> JsonValue::integer() const {
  if (type != JsonType::Number) return std::nullopt;
  std::string_view t = raw;
  while (!t.empty() && (t.back() == ' ' || t.back() == '\n' || t.back() == '\r' || t.back() == '\t')) t.remove_suffix(1);
  int64_t i = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), i);
  if (ec == std::errc() && p == t.data() + t.size()) return i;
  const std::string copy(t);
  char* end = nullptr;
  const double d = std::strtod(copy.c_str(), &end);
  // Doubles from -2^63 up to (not including) 2^63 convert exactly when integral.
  if (end != copy.c_str() + copy.size() || !(d >= -9223372036854775808.0 && d < 9223372036854775808.0) ||
      std::trunc(d) != d)
    return std::nullopt;
  return static_cast<int64_t>(d);
}

bool JsonReader::load(std::string_view body, std::string* error) {
  overflowed_ = false;
  buffer_.assign(body);
  buffer_.append(simdjson::SIMDJSON_PADDING, '\0');
  text_ = std::string_view(buffer_.data(), body.size());
  auto doc = validator_.parse(buffer_.data(), body.size(), false);
  // Numbers beyond 64 bits / the double range are valid for Python's json (vLLM): the
  // copy with them replaced is validated instead; the conversion reads the original.
  if (doc.error() == simdjson::NUMBER_ERROR) {
    std::string in_range;
    if (replace_out_of_range_numbers(body, &in_range)) doc = validator_.parse(in_range);
  }
  if (doc.error()) {
    *error = fmt::format("We could not parse the JSON body of your request ({}).",
                         simdjson::error_message(doc.error()));
    return false;
  }
  if (!doc.value_unsafe().is_object()) {
    *error = "The request body must be a JSON object.";
    return false;
  }
  return true;
}

bool JsonReader::read_value(ondemand::value v, JsonValue& out) {
  out = JsonValue{};
  ondemand::json_type t;
  if (v.type().get(t)) return false;
  switch (t) {
    case ondemand::json_type::object: {
      ondemand::object o;
      out.type = JsonType::Object;
      return !v.get_object().get(o) && !o.raw_json().get(out.raw);
    }
    case ondemand::json_type::array: {
      ondemand::array a;
      out.type = JsonType::Array;
      return !v.get_array().get(a) && !a.raw_json().get(out.raw);
    }
    case ondemand::json_type::string:
      out.type = JsonType::String;
      out.raw = v.raw_json_token();
      return !v.get_string().get(out.str);
    case ondemand::json_type::boolean:
      out.type = JsonType::Bool;
      out.raw = v.raw_json_token();
      return !v.get_bool().get(out.boolean);
    case ondemand::json_type::number:
      out.type = JsonType::Number;
      out.raw = v.raw_json_token();
      return true;
    case ondemand::json_type::null:
      out.type = JsonType::Null;
      out.raw = v.raw_json_token();
      return true;
  }
  return false;
}

bool JsonReader::object(std::string_view raw, int level, JsonObject& out) {
  out.fields.clear();
  if (level < 0 || level >= kLevels) return false;
  // raw lies inside buffer_, which has SIMDJSON_PADDING readable bytes after the body.
  const size_t room = static_cast<size_t>(buffer_.data() + buffer_.size() - raw.data());
  ondemand::document doc;
  ondemand::object o;
  if (parsers_[level].iterate(raw.data(), raw.size(), room).get(doc) || doc.get_object().get(o)) return false;
  for (auto field : o) {
    JsonField f;
    ondemand::value v;
    if (field.unescaped_key().get(f.key) || field.value().get(v) || !read_value(v, f.value)) return false;
    if (out.fields.size() == kMaxElements) return !(overflowed_ = true);
    out.fields.push_back(f);
  }
  return true;
}

bool JsonReader::array(std::string_view raw, int level, std::vector<JsonValue>& out) {
  out.clear();
  if (level < 0 || level >= kLevels) return false;
  const size_t room = static_cast<size_t>(buffer_.data() + buffer_.size() - raw.data());
  ondemand::document doc;
  ondemand::array a;
  if (parsers_[level].iterate(raw.data(), raw.size(), room).get(doc) || doc.get_array().get(a)) return false;
  for (auto element : a) {
    ondemand::value v;
    JsonValue jv;
    if (element.get(v) || !read_value(v, jv)) return false;
    if (out.size() == kMaxElements) return !(overflowed_ = true);
    out.push_back(jv);
  }
  return true;
}

size_t JsonReader::capacity() const {
  size_t c = validator_.capacity();
  for (const auto& p : parsers_) c = std::max(c, p.capacity());
  return std::max(c, buffer_.capacity());
}

void JsonReader::trim(size_t keep) {
  if (validator_.capacity() > keep) validator_ = simdjson::dom::parser();
  for (auto& p : parsers_)
    if (p.capacity() > keep) p = ondemand::parser();
  if (buffer_.capacity() > keep) std::string().swap(buffer_);
  text_ = {};
}

JsonReader& thread_json_reader() {
  thread_local JsonReader reader;
  return reader;
}

bool finish_body(bool ok, ApiError& err) {
  JsonReader& reader = thread_json_reader();
  if (!ok && reader.overflowed())
    err.message += fmt::format(" (a JSON array or object of more than {} elements)", JsonReader::kMaxElements);
  reader.trim(size_t{1} << 20);
  return ok;
}

}  // namespace kvroute::api
