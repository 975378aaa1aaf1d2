// A small strict JSON reader and writer for the files trident exchanges
// with other tools (safetensors headers, Hugging Face config.json and
// model.safetensors.index.json).
//
// Strict: RFC 8259 text only (no comments, no trailing commas, no NaN), a
// key twice in one object is an error (another reader would keep either
// one), and nothing may follow the value. Numbers keep their text, so an
// integer is read exactly (as_int) and a float as the nearest double.
// Objects keep their keys in file order. Every error is an InputError of
// one line: "<source>: JSON: <what> at byte <offset>".
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trident::json {

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Value() = default;
  static Value boolean(bool b);
  static Value number_text(std::string text);  // already valid JSON number text
  static Value integer(int64_t v);
  static Value real(double v);  // shortest text that reads back as v
  static Value string(std::string s);
  static Value array();
  static Value object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  // Whether the number's text is an integer (no fraction, no exponent).
  bool is_integer() const;

  // Accessors throw InputError("<what>: ...") when the kind does not match;
  // `what` names the value for the message (e.g. "config.json: hidden_size").
  bool as_bool(const std::string& what) const;
  int64_t as_int(const std::string& what) const;  // an integer that fits in int64
  double as_double(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
  const std::vector<Value>& items(const std::string& what) const;  // array
  const std::vector<std::pair<std::string, Value>>& members(const std::string& what) const;
  const std::string& number_text() const { return text_; }

  // Object: the member named key, or null if absent.
  const Value* find(const std::string& key) const;
  // Builders (array / object).
  void push(Value v);
  void set(std::string key, Value v);  // replaces an existing key

  // Compact JSON text (members in insertion order).
  std::string dump() const;

 private:
  Kind kind_ = Kind::null;
  bool b_ = false;
  std::string text_;  // number text or string value
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
  friend class Parser;
};

// Parses the whole of `text`; `source` names it in errors.
Value parse(std::string_view text, const std::string& source);

// `s` as a JSON string literal (quotes and escapes).
std::string quote(std::string_view s);

}  // namespace trident::json
