// The tokenizer (runtime/tokenizer): encodings of tests/data/tokenizer's
// texts against those Hugging Face's `tokenizers` made of the same
// tokenizer.json (make_reference.py says how), round trips, the built-in
// tokenizer being the one those references were made from, incremental
// detokenization, chat formats, stop strings and refused inputs.
#include "runtime/tokenizer/tokenizer.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/core/file.h"
#include "runtime/tokenizer/builtin_tokenizer.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

using ::mlag::testing::StatusIs;
using ::testing::HasSubstr;

std::string DataPath(const std::string& name) {
  return std::string(MLAG_TEST_DATA_DIR) + "/tokenizer/" + name;
}

std::unique_ptr<Tokenizer> LoadTiny() {
  absl::StatusOr<std::string> json = ReadFile(DataPath("tiny-v3.tokenizer.json"));
  absl::StatusOr<std::string> config = ReadFile(DataPath("tiny-v3.tokenizer_config.json"));
  EXPECT_TRUE(json.ok() && config.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Create(*json, *config, ChatFormat::kV2);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

TEST(TokenizerTest, MatchesTheReferenceEncodings) {
  std::unique_ptr<Tokenizer> tok = LoadTiny();
  ASSERT_NE(tok, nullptr);
  absl::StatusOr<std::string> ref = ReadFile(DataPath("reference.json"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  const nlohmann::json j = nlohmann::json::parse(*ref);
  ASSERT_GE(j["cases"].size(), 10u);
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> expected = c["ids"].get<std::vector<int32_t>>();
    absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, expected) << "text: " << text;
    EXPECT_EQ(tok->Decode(*ids, /*skip_special=*/false), text);
  }
}

// The committed file is what the built-in generator makes today: a change to
// the generator must come with new references.
TEST(TokenizerTest, BuiltinGeneratorMakesTheReferenceTokenizer) {
  absl::StatusOr<TokenizerFiles> files = BuiltinTokenizerFiles(1024, ChatFormat::kV3);
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<std::string> json = ReadFile(DataPath("tiny-v3.tokenizer.json"));
  absl::StatusOr<std::string> config = ReadFile(DataPath("tiny-v3.tokenizer_config.json"));
  ASSERT_TRUE(json.ok() && config.ok());
  EXPECT_EQ(files->tokenizer_json, *json);
  EXPECT_EQ(files->tokenizer_config_json, *config);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Create(files->tokenizer_json, files->tokenizer_config_json, ChatFormat::kV2);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 1024);              // every id of the model has a token
  EXPECT_EQ((*tok)->chat_format(), ChatFormat::kV3);  // from the chat template
  ASSERT_TRUE((*tok)->bos_id().has_value() && (*tok)->eos_id().has_value());
  EXPECT_EQ((*tok)->TokenBytes(*(*tok)->bos_id()), kBosToken);
  EXPECT_TRUE((*tok)->add_bos());
  EXPECT_THAT(BuiltinTokenizerFiles(100, ChatFormat::kV3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 260")));
}

TEST(TokenizerTest, RandomTextRoundTrips) {
  std::unique_ptr<Tokenizer> tok = LoadTiny();
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "b",  "Z",  " ", "  ", "\n", "1", "23", ",",
                                             "é", "中", "ゟ", "😀", "\t", "'s", "<", "｜", "x"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text, /*add_bos=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_FALSE(ids->empty());
    EXPECT_EQ(ids->front(), *tok->bos_id());
    EXPECT_EQ(tok->Decode(*ids, /*skip_special=*/true), text);
    // Streaming gives the same text, whole characters at a time.
    IncrementalDetokenizer stream(tok.get(), /*skip_special=*/true);
    std::string streamed;
    for (int32_t id : *ids) {
      const std::string piece = stream.Push(id);
      EXPECT_EQ(SanitizeUtf8(piece), piece);  // never a partial character
      streamed += piece;
    }
    streamed += stream.Finish();
    EXPECT_EQ(streamed, text);
  }
}

TEST(TokenizerTest, SplitCharactersAppearWithTheirLastByte) {
  std::unique_ptr<Tokenizer> tok = LoadTiny();
  ASSERT_NE(tok, nullptr);
  // Byte tokens 4 + b (the built-in layout): U+4E2D is E4 B8 AD.
  IncrementalDetokenizer stream(tok.get(), true);
  EXPECT_EQ(stream.Push(4 + 0xE4), "");
  EXPECT_EQ(stream.Push(4 + 0xB8), "");
  EXPECT_EQ(stream.Push(4 + 0xAD), "中");
  EXPECT_EQ(stream.Push(4 + 0xE4), "");
  EXPECT_EQ(stream.Finish(), "\xEF\xBF\xBD");  // an unfinished character
  EXPECT_EQ(tok->Decode({4 + 0xFF, 4 + 'a'}, true),
            "\xEF\xBF\xBD"
            "a");                                // invalid byte
  EXPECT_EQ(tok->Decode({-1, 5000}, true), "");  // unknown ids
}

TEST(TokenizerTest, ChatFormats) {
  std::unique_ptr<Tokenizer> tok = LoadTiny();
  ASSERT_NE(tok, nullptr);
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "hi"}, {"assistant", "hello"}, {"user", "bye"}};
  tok->set_chat_format(ChatFormat::kV3);
  absl::StatusOr<std::string> v3 = tok->FormatChat(msgs, true);
  ASSERT_TRUE(v3.ok());
  EXPECT_EQ(*v3, std::string(kBosToken) + "Be brief.<｜User｜>hi<｜Assistant｜>hello" + kEosToken +
                     "<｜User｜>bye<｜Assistant｜>");
  tok->set_chat_format(ChatFormat::kV2);
  absl::StatusOr<std::string> v2 = tok->FormatChat(msgs, true);
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(*v2, std::string(kBosToken) + "Be brief.\n\nUser: hi\n\nAssistant: hello" + kEosToken +
                     "User: bye\n\nAssistant:");
  EXPECT_THAT(tok->FormatChat({{"tool", "x"}}, true).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("role 'tool'")));
  // The special tokens' text encodes to their ids.
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(*v3, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), *tok->bos_id());
  EXPECT_EQ(tok->Decode(*ids, false), *v3);
}

TEST(TokenizerTest, StopStrings) {
  const std::vector<std::string> stops = {"END", "\n\n", ""};
  EXPECT_EQ(FindStopString("abc\n\nxEND", stops), 3u);
  EXPECT_EQ(FindStopString("abcEND", stops, 2), 3u);
  EXPECT_EQ(FindStopString("abc", stops), absl::string_view::npos);
}

TEST(TokenizerTest, RefusesWhatItCannotRead) {
  EXPECT_THAT(Tokenizer::Create("[1, 2]", "", ChatFormat::kV3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  EXPECT_THAT(
      Tokenizer::Create(R"({"model": {"type": "Unigram", "vocab": {}}})", "", ChatFormat::kV3)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Unigram")));
  EXPECT_THAT(Tokenizer::Create(R"({"model": {"type": "BPE", "vocab": {"a": 0},
                                   "merges": ["a b"]}})",
                                "", ChatFormat::kV3)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not in the vocab")));
  EXPECT_THAT(Tokenizer::Create(R"({"model": {"type": "BPE", "vocab": {"a": 0}},
                                   "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["},
                                                     "behavior": "Isolated"}})",
                                "", ChatFormat::kV3)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("regex")));
  EXPECT_THAT(Tokenizer::Create(R"({"model": {"type": "BPE", "vocab": {"a": 0}},
                                   "normalizer": {"type": "NFKC"}})",
                                "", ChatFormat::kV3)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NFKC")));
  std::unique_ptr<Tokenizer> tok = LoadTiny();
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("bad \xC3\x28 utf8", false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8 at byte 4")));
  // A byte-level vocabulary without the byte's character, no fallback.
  absl::StatusOr<std::unique_ptr<Tokenizer>> small = Tokenizer::Create(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}},
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}})",
      "", ChatFormat::kV3);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_THAT((*small)->Encode("ab", false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot encode 'b'")));
}

// byte_fallback: characters without a token become their <0xXX> bytes.
TEST(TokenizerTest, ByteFallback) {
  std::string vocab = R"("a": 0, "ab": 1, "b": 2)";
  for (int b = 0; b < 256; ++b) {
    char name[16];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab += ", \"" + std::string(name) + "\": " + std::to_string(3 + b);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Create(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {)" + vocab +
                            R"(}, "merges": ["a b"]}, "decoder": {"type": "Sequence", "decoders":
          [{"type": "ByteFallback"}]}, "pre_tokenizer": null})",
                        "", ChatFormat::kV3);
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode("abcé", false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 3 + 'c', 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ((*tok)->Decode(*ids, false), "abcé");
}

}  // namespace
}  // namespace mlag
