// io::JsonPull against nlohmann's parser as the oracle: documents rebuilt through the pull reader equal
// nlohmann's parse of the same text, and text nlohmann refuses, the pull reader refuses too.

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "../../src/io/json_pull.h"

namespace dtensor::testing {
namespace {

using io::JsonPull;
using Json = nlohmann::json;

Json pulled_value(JsonPull& in) {
  switch (in.peek()) {
    case JsonPull::Kind::Null: in.read_null(); return nullptr;
    case JsonPull::Kind::Boolean: return in.read_bool();
    case JsonPull::Kind::String: {
      std::string s;
      in.read_string(s);
      return s;
    }
    case JsonPull::Kind::Number: {
      const JsonPull::Number n = in.read_number();
      if (n.type == JsonPull::Number::Type::Signed) return n.signed_value;
      if (n.type == JsonPull::Number::Type::Unsigned) return n.unsigned_value;
      return n.float_value;
    }
    case JsonPull::Kind::Array: {
      Json out = Json::array();
      in.begin_array();
      while (in.next_element()) out.push_back(pulled_value(in));
      return out;
    }
    case JsonPull::Kind::Object: {
      Json out = Json::object();
      in.begin_object();
      std::string_view key;
      while (in.next_member(key)) {
        const std::string k(key);
        out[k] = pulled_value(in);
      }
      return out;
    }
  }
  return nullptr;
}

// The document `text` holds, through the pull reader; nullopt where it refuses the text.
std::optional<Json> pulled(const std::string& text) {
  JsonPull in(text);
  try {
    Json out = pulled_value(in);
    in.finish();
    return out;
  } catch (const JsonPull::Problem&) {
    return std::nullopt;
  }
}

Json random_value(std::mt19937& rng, int depth) {
  const int kind = static_cast<int>(rng() % (depth > 3 ? 6 : 8));
  switch (kind) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng()) * (rng() % 2 ? 1 : -1) * static_cast<int64_t>(rng() % 1000000);
    case 3: return std::ldexp(static_cast<double>(rng()) - 2147483648.0, static_cast<int>(rng() % 200) - 100);
    case 4: return uint64_t{0xFFFFFFFF00000000} + rng();
    case 5: {
      // ASCII, escapes, control characters, and 2-, 3- and 4-byte UTF-8.
      static const std::vector<std::string> pieces = {"a", "Z", " ", "\"", "\\", "/", "\n", "\t", std::string(1, '\x01'),
                                                      "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xED\x9F\xBF"};
      std::string s;
      for (int i = static_cast<int>(rng() % 8); i > 0; --i) s += pieces[rng() % pieces.size()];
      return s;
    }
    case 6: {
      Json a = Json::array();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      Json o = Json::object();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) o["k" + std::to_string(rng() % 10) + "\xC3\xA9"] = random_value(rng, depth + 1);
      return o;
    }
  }
}

TEST(JsonPull, RebuildsWhatNlohmannParses) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const Json doc = random_value(rng, 0);
    for (const std::string& text : {doc.dump(), doc.dump(2), doc.dump(-1, ' ', true)}) {
      const auto back = pulled(text);
      ASSERT_TRUE(back.has_value()) << text;
      EXPECT_EQ(*back, Json::parse(text)) << text;
    }
  }
}

TEST(JsonPull, RefusesWhatNlohmannRefuses) {
  const std::vector<std::string> texts = {
      "", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "[1 2]", "01", "-", "1.", ".5", "1e", "+1", "tru", "nul", "\"abc",
      "\"a\\x\"", "\"\\u12\"", "\"\\uD800\"", "\"\\uDC00\"", "\"\\uD800\\u0041\"", std::string("\"a\x01\""), "\"\xC3\"",
      "\"\xC0\xAF\"", "\"\xE0\x80\xAF\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"\xFF\"", "[1] x", "{} {}", "[\"a\" : 1]",
      "{1: 2}", "NaN", "Infinity", "1e999",
  };
  for (const std::string& text : texts) {
    bool nlohmann_refuses = false;
    try {
      [[maybe_unused]] const Json parsed = Json::parse(text);
    } catch (const Json::exception&) {
      nlohmann_refuses = true;
    }
    if (text == "1e999") nlohmann_refuses = true;  // nlohmann reads it as infinity; no JSON number is
    EXPECT_TRUE(nlohmann_refuses) << text;
    EXPECT_FALSE(pulled(text).has_value()) << text;
  }
}

TEST(JsonPull, NumbersKeepTheirType) {
  auto number = [](const std::string& text) {
    JsonPull in(text);
    return in.read_number();
  };
  EXPECT_EQ(number("-9223372036854775808").type, JsonPull::Number::Type::Signed);
  EXPECT_EQ(number("9223372036854775808").type, JsonPull::Number::Type::Unsigned);
  EXPECT_EQ(number("18446744073709551615").unsigned_value, UINT64_MAX);
  EXPECT_EQ(number("18446744073709551616").type, JsonPull::Number::Type::Float);
  EXPECT_EQ(number("-9223372036854775809").type, JsonPull::Number::Type::Float);
  EXPECT_EQ(number("2.0").type, JsonPull::Number::Type::Float);
  EXPECT_EQ(number("1E2").float_value, 100.0);
  EXPECT_EQ(number("1e-400").float_value, 0.0);  // below a double's range: zero, as nlohmann and Python read it
  EXPECT_EQ(number("-1e-400").float_value, Json::parse("-1e-400").get<double>());
}

TEST(JsonPull, DescribesAValueWithoutBuildingIt) {
  const std::string text = R"({"a": [1, 2, 3], "b": {"c": null}, "d": 16.5, "e": "xy", "f": true, "g": 18446744073709551615, "h": [1,)";
  JsonPull in(text);
  auto at = [&](const char* key) { return text.find(key) + 5; };
  EXPECT_EQ(in.describe_at(at("\"a\"")), "an array of 3 elements");
  EXPECT_EQ(in.describe_at(at("\"b\"")), "an object of 1 members");
  EXPECT_EQ(in.describe_at(at("\"d\"")), "a fractional number 16.5");
  EXPECT_EQ(in.describe_at(at("\"e\"")), "a string \"xy\"");
  EXPECT_EQ(in.describe_at(at("\"f\"")), "a boolean true");
  EXPECT_EQ(in.describe_at(at("\"g\"")), "an integer 18446744073709551615");
  // A value cut short is the syntax error it is, at its offset in the whole text.
  try {
    in.describe_at(at("\"h\""));
    FAIL() << "no problem";
  } catch (const JsonPull::Problem& problem) {
    EXPECT_EQ(problem.offset, text.size());
    EXPECT_NE(problem.what.find("invalid JSON at byte " + std::to_string(text.size())), std::string::npos) << problem.what;
  }
}

TEST(JsonPull, DepthIsLimited) {
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  JsonPull in(deep, 128);
  try {
    in.skip_value();
    FAIL() << "no problem";
  } catch (const JsonPull::Problem& problem) {
    EXPECT_EQ(problem.what, "JSON nested deeper than 128 levels");
    EXPECT_EQ(problem.offset, 128u);
  }
}

TEST(JsonPull, PathToAnOffsetAndAStringMember) {
  const std::string text = R"({"a": [1, {"b": "x", "name": "n\u0041"}], "c": {}})";
  const size_t at = text.find("\"x\"");
  const auto steps = io::json_path_to(text, at);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].key, "a");
  EXPECT_EQ(steps[1].index, std::optional<size_t>(1));
  EXPECT_EQ(steps[2].key, "b");
  EXPECT_EQ(steps[2].value_offset, at);
  EXPECT_EQ(io::json_string_member(text, steps[1].value_offset, "name"), std::optional<std::string>("nA"));
  EXPECT_EQ(io::json_string_member(text, steps[1].value_offset, "nope"), std::nullopt);
  EXPECT_TRUE(io::json_path_to(text, 0).empty());
}

}  // namespace
}  // namespace dtensor::testing
