// The strict JSON reader and writer (io/json.hpp). Recursive descent over
// the text; the depth is capped so that a hostile header cannot exhaust the
// stack.
#include "trident/io/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "trident/core/error.hpp"

namespace trident::json {
namespace {

constexpr int kMaxDepth = 64;

std::string kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::null:
      return "null";
    case Value::Kind::boolean:
      return "a boolean";
    case Value::Kind::number:
      return "a number";
    case Value::Kind::string:
      return "a string";
    case Value::Kind::array:
      return "an array";
    case Value::Kind::object:
      return "an object";
  }
  return "?";
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace

class Parser {
 public:
  Parser(std::string_view t, const std::string& source) : t_(t), source_(source) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (i_ != t_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(source_ + ": JSON: " + what + " at byte " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r'))
      ++i_;
  }
  bool eat(char c) {
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  void literal(std::string_view word) {
    if (t_.substr(i_, word.size()) != word) fail("invalid literal");
    i_ += word.size();
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (i_ >= t_.size()) fail("unexpected end of text");
    const char c = t_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value::string(string());
    if (c == 't') {
      literal("true");
      return Value::boolean(true);
    }
    if (c == 'f') {
      literal("false");
      return Value::boolean(false);
    }
    if (c == 'n') {
      literal("null");
      return Value();
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
  }

  Value object(int depth) {
    expect('{');
    Value v = Value::object();
    skip_ws();
    if (eat('}')) return v;
    for (;;) {
      skip_ws();
      if (i_ >= t_.size() || t_[i_] != '"') fail("expected a member name");
      const size_t at = i_;
      std::string key = string();
      if (v.find(key)) {
        i_ = at;
        fail("key \"" + key + "\" appears twice in one object");
      }
      skip_ws();
      expect(':');
      skip_ws();
      v.members_.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (eat('}')) return v;
      expect(',');
    }
  }

  Value array(int depth) {
    expect('[');
    Value v = Value::array();
    skip_ws();
    if (eat(']')) return v;
    for (;;) {
      skip_ws();
      v.items_.push_back(value(depth + 1));
      skip_ws();
      if (eat(']')) return v;
      expect(',');
    }
  }

  uint32_t hex4() {
    if (i_ + 4 > t_.size()) fail("truncated \\u escape");
    uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = t_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9')
        cp |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f')
        cp |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        cp |= uint32_t(h - 'A' + 10);
      else
        fail("invalid \\u escape");
    }
    return cp;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= t_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(t_[i_++]);
      if (c == '"') return out;
      if (c < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += char(c);
        continue;
      }
      if (i_ >= t_.size()) fail("unterminated string");
      const char e = t_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
            if (!(eat('\\') && eat('u'))) fail("unpaired surrogate in \\u escape");
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  Value number() {
    const size_t b = i_;
    eat('-');
    if (eat('0')) {
      // a leading zero stands alone
    } else if (i_ < t_.size() && t_[i_] >= '1' && t_[i_] <= '9') {
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
    } else {
      fail("invalid number");
    }
    if (eat('.')) {
      if (i_ >= t_.size() || t_[i_] < '0' || t_[i_] > '9') fail("invalid number");
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      ++i_;
      if (!eat('+')) eat('-');
      if (i_ >= t_.size() || t_[i_] < '0' || t_[i_] > '9') fail("invalid number");
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
    }
    return Value::number_text(std::string(t_.substr(b, i_ - b)));
  }

  std::string_view t_;
  const std::string& source_;
  size_t i_ = 0;
};

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.b_ = b;
  return v;
}
Value Value::number_text(std::string text) {
  Value v;
  v.kind_ = Kind::number;
  v.text_ = std::move(text);
  return v;
}
Value Value::integer(int64_t i) { return number_text(std::to_string(i)); }
Value Value::real(double d) {
  TRIDENT_CHECK(std::isfinite(d), "json: a number must be finite");
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  // JSON has no bare "1e5" problem, but keep a float recognisable as one.
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return number_text(s);
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.text_ = std::move(s);
  return v;
}
Value Value::array() {
  Value v;
  v.kind_ = Kind::array;
  return v;
}
Value Value::object() {
  Value v;
  v.kind_ = Kind::object;
  return v;
}

bool Value::is_integer() const {
  return kind_ == Kind::number && text_.find_first_of(".eE") == std::string::npos;
}

namespace {
[[noreturn]] void wrong_kind(const std::string& what, const std::string& want, Value::Kind got) {
  throw InputError(what + ": must be " + want + " (got " + kind_name(got) + ")");
}
}  // namespace

bool Value::as_bool(const std::string& what) const {
  if (kind_ != Kind::boolean) wrong_kind(what, "true or false", kind_);
  return b_;
}

int64_t Value::as_int(const std::string& what) const {
  if (!is_integer()) wrong_kind(what, "an integer", kind_);
  int64_t v = 0;
  auto r = std::from_chars(text_.data(), text_.data() + text_.size(), v);
  if (r.ec != std::errc() || r.ptr != text_.data() + text_.size())
    throw InputError(what + ": integer " + text_ + " does not fit in 64 bits");
  return v;
}

double Value::as_double(const std::string& what) const {
  if (kind_ != Kind::number) wrong_kind(what, "a number", kind_);
  char* end = nullptr;
  const double v = std::strtod(text_.c_str(), &end);
  if (!std::isfinite(v)) throw InputError(what + ": " + text_ + " is out of range for a double");
  return v;
}

const std::string& Value::as_string(const std::string& what) const {
  if (kind_ != Kind::string) wrong_kind(what, "a string", kind_);
  return text_;
}

const std::vector<Value>& Value::items(const std::string& what) const {
  if (kind_ != Kind::array) wrong_kind(what, "an array", kind_);
  return items_;
}

const std::vector<std::pair<std::string, Value>>& Value::members(const std::string& what) const {
  if (kind_ != Kind::object) wrong_kind(what, "an object", kind_);
  return members_;
}

const Value* Value::find(const std::string& key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

void Value::push(Value v) {
  TRIDENT_CHECK(kind_ == Kind::array, "json: push on a non-array");
  items_.push_back(std::move(v));
}

void Value::set(std::string key, Value v) {
  TRIDENT_CHECK(kind_ == Kind::object, "json: set on a non-object");
  for (auto& [k, old] : members_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  members_.emplace_back(std::move(key), std::move(v));
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string Value::dump() const {
  switch (kind_) {
    case Kind::null:
      return "null";
    case Kind::boolean:
      return b_ ? "true" : "false";
    case Kind::number:
      return text_;
    case Kind::string:
      return quote(text_);
    case Kind::array: {
      std::string out = "[";
      for (size_t i = 0; i < items_.size(); ++i) out += (i ? "," : "") + items_[i].dump();
      return out + "]";
    }
    case Kind::object: {
      std::string out = "{";
      for (size_t i = 0; i < members_.size(); ++i)
        out += (i ? "," : "") + quote(members_[i].first) + ":" + members_[i].second.dump();
      return out + "}";
    }
  }
  return "null";
}

Value parse(std::string_view text, const std::string& source) {
  return Parser(text, source).document();
}

}  // namespace trident::json
