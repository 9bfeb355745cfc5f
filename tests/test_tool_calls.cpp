// Tool calling in `mzcache serve`: the reply reader (tools/serve/tool_calls.h) on scripted model
// output, split at every byte boundary and byte by byte, and the request validation of tools,
// tool_choice, assistant tool_calls and role "tool" (tools/serve/openai_api.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/serve/openai_api.h"
#include "tools/serve/tool_calls.h"
#include "tools/serve/tool_constraint.h"

#include <random>

namespace mz::serve {
namespace {

struct Outcome {
  std::string content;               // concatenated content events
  std::vector<ToolCall> calls;       // in event order
  std::vector<int> indexes;
  bool operator==(const Outcome& o) const {
    if (content != o.content || calls.size() != o.calls.size() || indexes != o.indexes) return false;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i].id != o.calls[i].id || calls[i].name != o.calls[i].name || calls[i].arguments != o.calls[i].arguments)
        return false;
    return true;
  }
};

// The reply fed in the given pieces.
Outcome Run(ToolSyntax syn, const std::vector<std::string>& pieces) {
  int n = 0;
  ToolCallStream s(syn, [&] { return "call_" + std::to_string(n++); });
  std::vector<ToolEvent> ev;
  for (const auto& p : pieces) s.Push(p, &ev);
  s.Finish(&ev);
  Outcome o;
  for (auto& e : ev) {
    if (e.is_call) o.calls.push_back(e.call), o.indexes.push_back(e.index);
    else o.content += e.content;
  }
  EXPECT_EQ(o.content, s.content());
  EXPECT_EQ(o.calls.size(), s.calls().size());
  return o;
}

// The same outcome whole, split in two at every byte, and byte by byte.
Outcome Stream(ToolSyntax syn, const std::string& text) {
  const Outcome whole = Run(syn, {text});
  for (size_t cut = 0; cut <= text.size(); ++cut)
    EXPECT_TRUE(Run(syn, {text.substr(0, cut), text.substr(cut)}) == whole) << "split at " << cut;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_TRUE(Run(syn, bytes) == whole) << "byte by byte";
  return whole;
}

TEST(ToolCalls, HermesTwoCallsAndContent) {
  const std::string reply =
      "<think>\n\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const Outcome o = Stream(ToolSyntax::kHermes, reply);
  EXPECT_EQ(o.content, "<think>\n\n</think>\n\nLet me check.");  // the blanks before the calls dropped
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].id, "call_0");
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");  // the model's key order
  EXPECT_EQ(o.calls[1].name, "get_time");
  EXPECT_EQ(o.calls[1].arguments, "{}");
  EXPECT_EQ(o.indexes, (std::vector<int>{0, 1}));
}

TEST(ToolCalls, HermesMalformedIsContentVerbatim) {
  for (const std::string bad : {std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>"),  // bad JSON
                                std::string("<tool_call>\n{\"arguments\": {}}\n</tool_call>"),                      // no name
                                std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": 3}\n</tool_call>"),      // bad args
                                std::string("text <tool_call>\n{\"name\": \"f\"")}) {                               // unclosed
    const Outcome o = Stream(ToolSyntax::kHermes, bad);
    EXPECT_EQ(o.content, bad);
    EXPECT_TRUE(o.calls.empty());
  }
  // A marker's beginning at the end is content, and plain text passes unchanged.
  EXPECT_EQ(Stream(ToolSyntax::kHermes, "a < b <tool_c").content, "a < b <tool_c");
  EXPECT_EQ(Stream(ToolSyntax::kHermes, "\n\n").content, "\n\n");
  // A good call after a bad one still counts; arguments given as a JSON string are accepted.
  const Outcome o = Stream(ToolSyntax::kHermes,
                           "<tool_call>oops</tool_call><tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":2}\"}</tool_call>");
  EXPECT_EQ(o.content, "<tool_call>oops</tool_call>");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].arguments, R"({"x":2})");
}

TEST(ToolCalls, HermesContentStreamsBeforeTheEnd) {
  ToolCallStream s(ToolSyntax::kHermes, [] { return "id"; });
  std::vector<ToolEvent> ev;
  s.Push("Hello, wor", &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].content, "Hello, wor");
  ev.clear();
  s.Push("ld <tool", &ev);  // "<tool" may begin a call, " " may end the content: held back
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].content, "ld");
  ev.clear();
  s.Push("_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].is_call);  // reported as soon as it closes, before the reply ends
}

TEST(ToolCalls, Llama3) {
  Outcome o = Stream(ToolSyntax::kLlama3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n");
  EXPECT_EQ(o.content, "");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Paris"})");
  o = Stream(ToolSyntax::kLlama3, "Sure.<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": 1}}");
  EXPECT_EQ(o.content, "Sure.");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[1].name, "b");
  // Not a call: returned as written.
  for (const std::string text : {std::string("{\"answer\": 42}"), std::string("Hello {\"name\": \"x\"} there"),
                                 std::string("<|python_tag|>print(1)"), std::string("{\"name\": \"f\", \"parameters\": ")}) {
    o = Stream(ToolSyntax::kLlama3, text);
    EXPECT_EQ(o.content, text);
    EXPECT_TRUE(o.calls.empty());
  }
  EXPECT_EQ(ToolSyntaxFor("llama"), ToolSyntax::kLlama3);
  EXPECT_EQ(ToolSyntaxFor("qwen3"), ToolSyntax::kHermes);
}

TEST(ToolCalls, Json) {
  const std::vector<ToolCall> calls = {{"call_1", "f", R"({"a":1})"}};
  EXPECT_EQ(ToolCallsJson(calls).dump(), R"([{"function":{"arguments":"{\"a\":1}","name":"f"},"id":"call_1","type":"function"}])");
  EXPECT_EQ(ToolCallDeltaJson(2, calls[0])[0]["index"], 2);
}

// ---- request validation ----

bool Parse(const std::string& body, ChatRequest* r, ApiError* e) { return ParseRequest(body, true, Limits(), r, e); }

const char* kTools =
    R"([{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"z":{},"a":{}}}}},)"
    R"({"type":"function","function":{"name":"get_time"}}])";

TEST(ToolRequests, Accepted) {
  ChatRequest r;
  ApiError e;
  const std::string msgs =
      R"([{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",)"
      R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"21"}])";
  ASSERT_TRUE(Parse(std::string(R"({"messages":)") + msgs + R"(,"tools":)" + kTools + "}", &r, &e)) << e.message;
  EXPECT_TRUE(r.jinja);
  EXPECT_TRUE(r.parse_tool_calls);
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_NE(r.tools_json.find(R"({"z":{},"a":{}})"), std::string::npos);  // key order as sent
  EXPECT_NE(r.messages_json.find("tool_call_id"), std::string::npos);
  // tool_choice none: nothing rendered, nothing parsed; a named one renders that tool only.
  ASSERT_TRUE(Parse(std::string(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none","tools":)") + kTools + "}", &r, &e));
  EXPECT_TRUE(r.jinja);
  EXPECT_FALSE(r.parse_tool_calls);
  EXPECT_EQ(r.tools_json, "");
  ASSERT_TRUE(Parse(std::string(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"get_time"}},"tools":)") +
                        kTools + "}",
                    &r, &e));
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.tool_choice_name, "get_time");
  EXPECT_EQ(r.tools_json.find("get_weather"), std::string::npos);
  EXPECT_NE(r.tools_json.find("get_time"), std::string::npos);
  // A plain chat keeps the built-in template path.
  ASSERT_TRUE(Parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[]})", &r, &e));
  EXPECT_FALSE(r.jinja);
}

TEST(ToolRequests, RefusedNamingTheField) {
  const std::string u = R"({"role":"user","content":"x"})";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"messages":[)" + u + R"(],"tools":{}})", "tools"},
      {R"({"messages":[)" + u + R"(],"tools":[3]})", "tools[0]"},
      {R"({"messages":[)" + u + R"(],"tools":[{"type":"code"}]})", "tools[0].type"},
      {R"({"messages":[)" + u + R"(],"tools":[{"type":"function"}]})", "tools[0].function"},
      {R"({"messages":[)" + u + R"(],"tools":[{"type":"function","function":{"name":"a b"}}]})", "tools[0].function.name"},
      {R"({"messages":[)" + u + R"(],"tools":[{"type":"function","function":{"name":"f","description":1}}]})", "tools[0].function.description"},
      {R"({"messages":[)" + u + R"(],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]})", "tools[0].function.parameters"},
      {R"({"messages":[)" + u + R"(],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})", "tools[1].function.name"},
      {R"({"messages":[)" + u + R"(],"tool_choice":"maybe","tools":)" + kTools + "}", "tool_choice"},
      {R"({"messages":[)" + u + R"(],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[)" + u + R"(],"tool_choice":{"type":"function","function":{"name":"nope"}},"tools":)" + kTools + "}", "tool_choice.function.name"},
      {R"({"messages":[)" + u + R"(],"tool_choice":{"type":"x"},"tools":)" + kTools + "}", "tool_choice.type"},
      {R"({"messages":[)" + u + R"(],"parallel_tool_calls":"yes","tools":)" + kTools + "}", "parallel_tool_calls"},
      {R"({"messages":[)" + u + R"(,{"role":"tool","content":"r"}]})", "messages[1].tool_call_id"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls"},
      {R"({"messages":[)" + u + R"(,{"role":"assistant","tool_calls":{}}]})", "messages[1].tool_calls"},
      {R"({"messages":[)" + u + R"(,{"role":"assistant","tool_calls":[{"type":"function"}]}]})", "messages[1].tool_calls[0].function"},
      {R"({"messages":[)" + u + R"(,{"role":"assistant","tool_calls":[{"function":{"name":""}}]}]})", "messages[1].tool_calls[0].function.name"},
      {R"({"messages":[)" + u + R"(,{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":1}}]}]})", "messages[1].tool_calls[0].function.arguments"},
      {R"({"messages":[)" + u + R"(,{"role":"assistant","tool_calls":[{"id":1,"function":{"name":"f"}}]}]})", "messages[1].tool_calls[0].id"},
      {R"({"messages":[)" + u + R"(,{"role":"assistant","content":null}]})", "messages[1].content"},
  };
  for (const auto& [body, param] : bad) {
    ChatRequest r;
    ApiError e;
    EXPECT_FALSE(Parse(body, &r, &e)) << body;
    EXPECT_EQ(e.http, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
  }
  // /v1/completions has no tools.
  ChatRequest r;
  ApiError e;
  EXPECT_FALSE(ParseRequest(R"({"prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})", false, Limits(), &r, &e));
  EXPECT_EQ(e.param, "tools");
}


// A checker of the schema subset ToolCallConstraint generates (tool_constraint.h): the test's
// own reading of the rules, not the acceptor's code. Returns "" or what is wrong.
std::string Invalid(const nlohmann::json& v, const nlohmann::ordered_json& schema) {
  if (schema.contains("enum")) {
    for (const auto& e : schema["enum"])
      if (nlohmann::json(e) == v) return "";
    return "not in enum: " + v.dump();
  }
  if (schema.contains("anyOf")) {
    for (const auto& a : schema["anyOf"])
      if (Invalid(v, a).empty()) return "";
    return "no anyOf alternative: " + v.dump();
  }
  if (schema.contains("type") && schema["type"].is_array()) {
    for (const auto& t : schema["type"]) {
      nlohmann::ordered_json one = schema;
      one["type"] = t;
      if (Invalid(v, one).empty()) return "";
    }
    return "no type of the list: " + v.dump();
  }
  const std::string type = schema.value("type", std::string("string"));
  if (type == "string") {
    if (!v.is_string()) return "not a string: " + v.dump();
    size_t chars = 0;
    for (unsigned char c : v.get<std::string>()) chars += (c & 0xC0) != 0x80;
    if (chars > size_t(schema.value("maxLength", ToolCallConstraint::kMaxStringChars))) return "too long: " + v.dump();
    if (chars < size_t(schema.value("minLength", 0))) return "too short: " + v.dump();
    if (v.get<std::string>().find('<') != std::string::npos) return "'<' in a string";
    return "";
  }
  if (type == "integer") return v.is_number_integer() ? "" : "not an integer: " + v.dump();
  if (type == "number") return v.is_number() ? "" : "not a number: " + v.dump();
  if (type == "boolean") return v.is_boolean() ? "" : "not a boolean: " + v.dump();
  if (type == "null") return v.is_null() ? "" : "not null: " + v.dump();
  if (type == "array") {
    if (!v.is_array()) return "not an array: " + v.dump();
    if (v.size() > size_t(schema.value("maxItems", ToolCallConstraint::kMaxItems))) return "too many items";
    if (v.size() < size_t(schema.value("minItems", 0))) return "too few items";
    for (const auto& x : v)
      if (std::string w = Invalid(x, schema["items"]); !w.empty()) return w;
    return "";
  }
  if (!v.is_object()) return "not an object: " + v.dump();
  const auto props = schema.value("properties", nlohmann::ordered_json::object());
  for (const auto& k : schema.value("required", nlohmann::ordered_json::array()))
    if (!v.contains(k.get<std::string>())) return "required key missing: " + k.dump();
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!props.contains(it.key())) return "key not in properties: " + it.key();
    if (std::string w = Invalid(it.value(), props[it.key()]); !w.empty()) return it.key() + ": " + w;
  }
  return "";
}

// Tools whose schemas use what agents' schemas use: optional keys, nested objects, arrays of
// strings and of objects, numbers and integers, booleans, null, enums of strings, a nullable string.
const char* kAgentTools = R"([
    {"type":"function","function":{"name":"get","parameters":{"type":"object","properties":{}}}},
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string","maxLength":12},"days":{"type":"integer"},"metric":{"type":"boolean"},
        "unit":{"enum":["c","f"]},"note":{"type":"string","maxLength":8},"extra":{"type":["object","null"]}},
      "required":["city","days","metric","unit","extra"]}}},
    {"type":"function","function":{"name":"edit","parameters":{"type":"object","properties":{
      "path":{"type":"string","minLength":1,"maxLength":6},
      "scale":{"type":"number"},
      "mode":{"type":"string","enum":["append","overwrite"]},
      "tags":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":3},
      "edits":{"type":"array","minItems":1,"maxItems":2,"items":{"type":"object","properties":{
        "line":{"type":"integer"},"text":{"type":["string","null"],"maxLength":5},"done":{"type":"boolean"}},
        "required":["line"]}},
      "opts":{"type":"object","properties":{"dry":{"type":"boolean"},"level":{"type":"null"}}}},
      "required":["path","edits"]}}}])";

// The constrained reply (tool_choice "required" / a named function): random walks over a
// vocabulary of pieces as a model's (single characters, the markers whole, words, digits, blanks,
// escapes, pieces spanning the markers' boundaries), taking any piece the constraint allows, always
// end in a reply ToolCallStream reads as exactly one call of an offered tool whose arguments parse
// and are valid for the tool's schema (Invalid above), within MaxChars characters. And the walks
// reach what the acceptor is for: optional keys both emitted and skipped, fractions, negative
// numbers, escapes, nested objects in arrays, null in a nullable string.
TEST(ToolConstraint, RandomWalksAlwaysEndInOneValidCall) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(kAgentTools);
  std::vector<std::string> vocab;
  for (int c = 0x20; c < 0x7f; ++c) vocab.push_back(std::string(1, char(c)));
  for (const char* p : {"<tool_call>", "\n", "\n\n", "</tool_call>", "{\"", "name", "\": \"", "get", "_weather", "\", \"",
                        "arguments", "parameters", "\": ", "city", "days", "true", "false", "12", "007", "Paris", " Paris",
                        "\"}", "}}", "}\n", "\u00e9", "\xc3\xa9", "\xc3", "\xa9", "\xe2\x82", "\xac", "\t", "<|im_end|>",
                        "\\n", "\\\"", "\\\\", "\\u00e9", "\\u", "00", "3c", "d8", "1.5", "-0.25", ".", "null", ", ",
                        "[\"", "\"]", "[{", "}]", "edits", "line", "text", "\":{\"", "\":[", "append", "\"overwrite\""})
    vocab.push_back(p);
  int with_note = 0, without_note = 0, fractions = 0, negatives = 0, escapes = 0, nested = 0, nulls = 0, opts = 0;
  for (ToolSyntax syn : {ToolSyntax::kHermes, ToolSyntax::kLlama3}) {
    for (const std::string& named : {std::string(), std::string("get_weather"), std::string("edit")}) {
      for (uint32_t seed = 1; seed <= 60; ++seed) {
        std::mt19937 rng(seed);
        ToolCallConstraint k(syn, tools, named);
        EXPECT_FALSE(k.Allows(""));
        EXPECT_FALSE(k.Allows("Sure"));
        std::string reply;
        while (!k.Complete()) {
          std::vector<const std::string*> ok;
          for (const std::string& p : vocab)
            if (k.Allows(p)) ok.push_back(&p);
          ASSERT_FALSE(ok.empty()) << "stuck after " << reply;
          const std::string& p = *ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
          k.Advance(p);
          reply += p;
          ASSERT_LE(int(reply.size()), k.MaxChars()) << reply;
        }
        for (const std::string& p : vocab) EXPECT_FALSE(k.Allows(p)) << "after the call: " << p;
        const Outcome o = serve::Run(syn, {reply});
        ASSERT_EQ(o.calls.size(), 1u) << reply;
        EXPECT_EQ(o.content, "") << reply;
        const std::string& name = o.calls[0].name;
        if (!named.empty()) EXPECT_EQ(name, named) << reply;
        const nlohmann::json args = nlohmann::json::parse(o.calls[0].arguments);
        ASSERT_TRUE(args.is_object()) << reply;
        const nlohmann::ordered_json* schema = nullptr;
        for (const auto& t : tools)
          if (t["function"]["name"] == name) schema = &t["function"]["parameters"];
        ASSERT_NE(schema, nullptr) << reply;
        EXPECT_EQ(Invalid(args, *schema), "") << reply;
        if (name == "get_weather") (args.contains("note") ? with_note : without_note)++;
        if (name == "edit") {
          if (args.contains("scale") && !args["scale"].is_number_integer()) ++fractions;
          if (args.contains("opts") && !args["opts"].empty()) ++opts;
          for (const auto& e : args["edits"]) {
            ++nested;
            if (e.contains("text") && e["text"].is_null()) ++nulls;
          }
        }
        if (reply.find("-") != std::string::npos && (args.contains("days") ? args["days"].get<double>() < 0 : false)) ++negatives;
        if (reply.find('\\') != std::string::npos) ++escapes;
      }
    }
  }
  EXPECT_GT(with_note, 0);
  EXPECT_GT(without_note, 0);
  EXPECT_GT(fractions, 0);
  EXPECT_GT(negatives, 0);
  EXPECT_GT(escapes, 0);
  EXPECT_GT(nested, 0);
  EXPECT_GT(nulls, 0);
  EXPECT_GT(opts, 0);
}

// Scripted continuations of one call, each accepted or refused where the rules say.
TEST(ToolConstraint, OptionalKeysNestingEscapesNumbers) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(kAgentTools);
  const std::string head = "<tool_call>\n{\"name\": \"edit\", \"arguments\": ";
  auto allows = [&](const std::string& text) {
    ToolCallConstraint k(ToolSyntax::kHermes, tools, "edit");
    return k.Allows(head + text);
  };
  auto whole = [&](const std::string& args) {
    ToolCallConstraint k(ToolSyntax::kHermes, tools, "edit");
    const std::string call = head + args + "}\n</tool_call>";
    if (!k.Allows(call)) return false;
    k.Advance(call);
    return k.Complete();
  };
  // Optional keys: emitted or skipped, in the schema's order, each once; required ones never skipped.
  EXPECT_TRUE(whole(R"({"path":"a","edits":[{"line":1}]})"));
  EXPECT_TRUE(whole(R"({"path":"a","scale":-0.25,"mode":"append","tags":["x","y\n"],"edits":[{"line":-3,"text":null,"done":true},{"line":0,"text":"\u00e9\""}],"opts":{"dry":false,"level":null}})"));
  EXPECT_TRUE(whole(R"({"path":"a","edits":[{"line":1,"done":false}],"opts":{}})"));
  EXPECT_FALSE(allows(R"({"edits")"));             // "path" is required before it
  EXPECT_FALSE(allows(R"({"path":"a"})"));         // "edits" is required
  EXPECT_FALSE(allows(R"({"path":"a","path")"));   // a key once
  EXPECT_FALSE(allows(R"({"path":"a","edits":[{"line":1}],"scale")"));  // the schema's order
  EXPECT_FALSE(allows(R"({"path":"a","size")"));   // not a property
  EXPECT_FALSE(allows(R"({"path":"")"));           // minLength 1
  EXPECT_FALSE(allows(R"({"path":"abcdefg")"));    // maxLength 6
  EXPECT_FALSE(allows(R"({"path":"a","edits":[])"));   // minItems 1
  EXPECT_FALSE(allows(R"({"path":"a","edits":[{"line":1},{"line":2},)"));  // maxItems 2
  EXPECT_FALSE(allows(R"({"path":"a","edits":[{"text":"x")"));  // "line" is required in the item
  EXPECT_FALSE(allows(R"({"path":"a","tags":[1)"));   // items are strings
  EXPECT_FALSE(allows(R"({"path":"a","tags":["abcde")"));   // item maxLength 4
  EXPECT_FALSE(allows(R"({"path":"a","mode":"delete")"));   // enum of strings
  EXPECT_TRUE(allows(R"({"path":"a","mode":"overwrite")"));
  EXPECT_FALSE(allows(R"({"path":"a","opts":{"level":0)"));  // null only
  // Numbers: fractions for "number" only, no leading zero, no exponent, bounded digits.
  EXPECT_TRUE(allows(R"({"path":"a","scale":123456.1234,)"));
  EXPECT_TRUE(allows(R"({"path":"a","scale":0.5,)"));
  EXPECT_FALSE(allows(R"({"path":"a","scale":1.,)"));
  EXPECT_FALSE(allows(R"({"path":"a","scale":.5)"));
  EXPECT_FALSE(allows(R"({"path":"a","scale":01)"));
  EXPECT_FALSE(allows(R"({"path":"a","scale":1e5)"));
  EXPECT_FALSE(allows(R"({"path":"a","scale":1.23456)"));
  EXPECT_FALSE(allows(R"({"path":"a","scale":1234567)"));
  EXPECT_FALSE(allows(R"({"path":"a","edits":[{"line":1.5)"));  // an integer
  EXPECT_FALSE(allows(R"({"path":"a","scale":--1)"));
  // Escapes: the JSON ones; \u with four hex digits of any case, no surrogate, never '<'.
  for (const char* ok : {R"(\")", R"(\\)", R"(\/)", R"(\n)", R"(\t)", R"(\u00e9)", R"(\u00E9)", R"(\u001f)"})
    EXPECT_TRUE(allows(std::string(R"({"path":")") + ok + "\"")) << ok;
  for (const char* bad : {R"(\x)", R"(\u00g)", R"(\ud8)", R"(\uDC)", R"(\u003c)", R"(\u003C)", "\n", "<", "\\u\""})
    EXPECT_FALSE(allows(std::string(R"({"path":")") + bad)) << bad;
  EXPECT_FALSE(allows(R"({"path":"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9)"));  // 7 characters > maxLength 6
  // Llama 3: the same object with ", " and ": ".
  ToolCallConstraint l(ToolSyntax::kLlama3, tools, "edit");
  const std::string call = R"({"name": "edit", "parameters": {"path": "a", "tags": ["x", "y"], "edits": [{"line": 1, "done": true}]}})";
  ASSERT_TRUE(l.Allows(call));
  EXPECT_FALSE(l.Allows(R"({"name": "edit", "parameters": {"path":"a")"));
  l.Advance(call);
  EXPECT_TRUE(l.Complete());
  const Outcome o = serve::Run(ToolSyntax::kLlama3, {call});
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(o.calls[0].arguments)["tags"], nlohmann::json::parse(R"(["x","y"])"));
}

// Schemas the compiler must survive, whatever a request sends: deep nesting is cut at kMaxDepth
// (then {} / []), absurd arrays are bounded by kMaxArrayChars, unions whose alternatives could
// start alike keep the first; each still ends in one call that parses, within MaxChars.
TEST(ToolConstraint, HostileSchemasStillEndInOneCall) {
  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 20; ++i) deep = R"({"type":"object","properties":{"a":)" + deep + R"(},"required":["a"]})";
  std::string arrays = R"({"type":"string"})";
  for (int i = 0; i < 20; ++i) arrays = R"({"type":"array","minItems":8,"items":)" + arrays + "}";
  const std::vector<std::string> schemas = {
      deep, R"({"type":"object","properties":{"x":)" + arrays + R"(},"required":["x"]})",
      R"({"type":"object","properties":{"u":{"anyOf":[{"type":"integer"},{"type":"number"},{"enum":[1,"a"]},{"type":"string"}]},
          "t":{"type":["object","object","array","null","null"],"properties":{"p":{"type":"boolean"}},"items":{"type":"integer"}},
          "e":{"enum":[1,10,100]},"k":{"const":{"a":[1]}},"m":{"type":"string","minLength":500,"maxLength":-1}},
          "required":["u","t","e","k","m","nope"]})",
      R"({"type":"array","items":{"type":"integer"}})", R"({"properties":7,"required":"x"})"};
  for (const std::string& sc : schemas) {
    const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
        R"([{"type":"function","function":{"name":"f","parameters":)" + sc + "}}]");
    for (ToolSyntax syn : {ToolSyntax::kHermes, ToolSyntax::kLlama3}) {
      for (uint32_t seed = 1; seed <= 20; ++seed) {
        std::mt19937 rng(seed);
        ToolCallConstraint k(syn, tools, "");
        ASSERT_GT(k.MaxChars(), 0);
        std::string reply;
        while (!k.Complete()) {
          std::vector<int> ok;
          for (int c = 1; c < 256; ++c)
            if (k.Allows(std::string(1, char(c)))) ok.push_back(c);
          ASSERT_FALSE(ok.empty()) << sc << " stuck after " << reply;
          const char c = char(ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)]);
          k.Advance(std::string(1, c));
          reply += c;
          ASSERT_LE(int(reply.size()), k.MaxChars()) << reply;
        }
        const Outcome o = serve::Run(syn, {reply});
        ASSERT_EQ(o.calls.size(), 1u) << reply;
        EXPECT_TRUE(nlohmann::json::parse(o.calls[0].arguments).is_object()) << reply;
      }
    }
  }
}

// The acceptor's edges: the first character decides, a number has no leading zero and at most
// kMaxDigits digits, a string refuses bad escapes and control characters and ends at its cap.
TEST(ToolConstraint, Edges) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type":"function","function":{"name":"f","parameters":
    {"type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string"}},"required":["n","s"]}}}])");
  {  // Hermes: the arguments compact, as the reply reader serializes them for the next request
    ToolCallConstraint h(ToolSyntax::kHermes, tools, "");
    const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\":1,\"s\":\"a\"}}\n</tool_call>";
    ASSERT_TRUE(h.Allows(call));
    h.Advance(call);
    EXPECT_TRUE(h.Complete());
    const Outcome o = serve::Run(ToolSyntax::kHermes, {call});
    ASSERT_EQ(o.calls.size(), 1u);
    EXPECT_EQ(o.calls[0].arguments, "{\"n\":1,\"s\":\"a\"}");
  }
  ToolCallConstraint k(ToolSyntax::kLlama3, tools, "");
  EXPECT_FALSE(k.Allows("<tool_call>"));  // Llama 3's syntax has no marker
  ASSERT_TRUE(k.Allows("{\"name\": \"f\", \"parameters\": {\"n\": "));
  k.Advance("{\"name\": \"f\", \"parameters\": {\"n\": ");
  EXPECT_FALSE(k.Allows(","));     // a number needs a digit
  EXPECT_FALSE(k.Allows("01"));    // no leading zero
  EXPECT_TRUE(k.Allows("0, "));
  EXPECT_TRUE(k.Allows("-12, "));
  EXPECT_FALSE(k.Allows("--"));
  EXPECT_TRUE(k.Allows("123456, "));
  EXPECT_FALSE(k.Allows("1234567"));
  k.Advance("42, \"s\": \"");
  EXPECT_FALSE(k.Allows("\\x"));
  EXPECT_TRUE(k.Allows("\\n"));
  EXPECT_FALSE(k.Allows("\n"));
  EXPECT_FALSE(k.Allows("</tool_call>"));  // no marker or special token inside a string
  EXPECT_TRUE(k.Allows("\xc3\xa9\xe2\x82\xac"));  // é €
  EXPECT_TRUE(k.Allows("\xc3"));                  // a character's first byte: the next piece ends it
  EXPECT_FALSE(k.Allows("\xc3\""));               // the string cannot close inside a character
  EXPECT_FALSE(k.Allows("\x80"));                 // a stray continuation byte
  EXPECT_FALSE(k.Allows("\xc0\xaf"));             // overlong
  EXPECT_FALSE(k.Allows("\xed\xa0\x80"));         // a surrogate
  EXPECT_FALSE(k.Allows("\xf4\x90\x80\x80"));     // above U+10FFFF
  EXPECT_TRUE(k.Allows("ok\"}}"));
  k.Advance(std::string(ToolCallConstraint::kMaxStringChars, 'x'));
  EXPECT_FALSE(k.Allows("x"));
  EXPECT_TRUE(k.Allows("\""));
  k.Advance("\"}}");
  EXPECT_TRUE(k.Complete());
  EXPECT_EQ(serve::Run(ToolSyntax::kLlama3, {"{\"name\": \"f\", \"parameters\": {\"n\": 42, \"s\": \"" +
                                           std::string(ToolCallConstraint::kMaxStringChars, 'x') + "\"}}"})
                .calls.size(),
            1u);
}

}  // namespace
}  // namespace mz::serve
