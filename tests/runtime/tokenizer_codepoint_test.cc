// Every Unicode scalar value through the pre-tokenizer and the encoder, in
// three contexts (" " + c, c * 4, "a" + c), against Hugging Face's
// `tokenizers` (tests/data/tokenizer/make_codepoint_reference.py made the
// digests, one per block of 256 code points): the split patterns'
// character classes must agree on all of Unicode 16, whatever Unicode
// version the system's PCRE2 knows (runtime/tokenizer/unicode_classes.h).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/core/file.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/unicode_classes.h"

namespace mlag {
namespace {

std::string DataPath(const std::string& name) {
  return std::string(MLAG_TEST_DATA_DIR) + "/tokenizer/" + name;
}

std::string Utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// 64-bit FNV-1a, as the reference script computes it.
uint64_t Fnv1a64(const std::string& data) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char b : data) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

TEST(TokenizerCodepointTest, EveryCodePointSplitsAndEncodesAsTheReference) {
  absl::StatusOr<std::string> json = ReadFile(DataPath("tiny-v3.tokenizer.json"));
  absl::StatusOr<std::string> config = ReadFile(DataPath("tiny-v3.tokenizer_config.json"));
  absl::StatusOr<std::string> ref = ReadFile(DataPath("codepoints.json"));
  ASSERT_TRUE(json.ok() && config.ok() && ref.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Create(*json, *config, ChatFormat::kV3);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const nlohmann::json reference = nlohmann::json::parse(*ref);
  ASSERT_EQ(reference["block_size"].get<int>(), 256);
  struct Context {
    const char* name;
    std::string (*make)(const std::string&);
  };
  const Context contexts[] = {
      {"space_before", [](const std::string& c) { return " " + c; }},
      {"four_times", [](const std::string& c) { return c + c + c + c; }},
      {"after_a", [](const std::string& c) { return "a" + c; }},
  };
  int blocks_checked = 0;
  for (const Context& context : contexts) {
    const std::vector<std::string> digests =
        reference["contexts"][context.name].get<std::vector<std::string>>();
    ASSERT_EQ(digests.size(), 0x110000u / 256);
    std::vector<std::string> differing;
    for (uint32_t block = 0; block < 0x110000 / 256; ++block) {
      std::string records;
      for (uint32_t c = block * 256; c < block * 256 + 256; ++c) {
        if (c >= 0xD800 && c <= 0xDFFF) continue;  // not characters
        const std::string text = context.make(Utf8(c));
        absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(text, /*add_bos=*/false);
        ASSERT_TRUE(ids.ok()) << ids.status();
        std::vector<std::string> pieces;
        for (const std::string& piece : (*tok)->PreTokenize(text)) {
          std::string hex;
          for (unsigned char b : piece) absl::StrAppendFormat(&hex, "%02x", b);
          pieces.push_back(hex);
        }
        absl::StrAppendFormat(&records, "%X:%s|%s;", c, absl::StrJoin(*ids, ","),
                              absl::StrJoin(pieces, ","));
      }
      if (absl::StrFormat("%016x", Fnv1a64(records)) != digests[block]) {
        differing.push_back(absl::StrFormat("0x%X", block));
      }
      ++blocks_checked;
    }
    EXPECT_TRUE(differing.empty())
        << context.name << ": " << differing.size() << " blocks of 256 code points differ from "
        << "the reference (make_codepoint_reference.py --show BLOCK shows one): "
        << absl::StrJoin(differing.begin(),
                         differing.begin() + std::min<size_t>(differing.size(), 40), " ");
  }
  EXPECT_EQ(blocks_checked, 3 * 0x110000 / 256);
  std::printf("%d blocks of 256 code points in 3 contexts checked (Unicode %s tables)\n",
              blocks_checked, unicode_tables::kVersion);
}

// The rewrite itself: what it replaces and what it keeps as written.
TEST(UnicodeClassesTest, ExpandsCategoriesAndWhiteSpaceAndKeepsTheRest) {
  auto expand = [](const std::string& p) {
    absl::StatusOr<std::string> e = ExpandUnicodeClasses(p);
    EXPECT_TRUE(e.ok()) << p << ": " << e.status();
    return e.ok() ? *e : std::string();
  };
  auto own = [](const std::string& ranges) { return "(?-i:[" + ranges + "])"; };
  const std::string ws =
      "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
      "\\x{2028}-\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  EXPECT_EQ(expand("\\s+"), own(ws) + "+");  // U+180E is not White_Space
  EXPECT_EQ(expand("[^\\r\\n\\s]"), "[^\\r\\n" + ws + "]");
  EXPECT_EQ(expand("[]\\s]"), "[]" + ws + "]");        // a leading ] is a literal
  EXPECT_EQ(expand("[\\E]\\s]"), "[\\E]" + ws + "]");  // also after \E, as PCRE2 reads it
  EXPECT_EQ(expand("[\\s-]"), "[" + ws + "-]");        // a trailing - is a literal
  // Kept as written: an escaped backslash, a quoted run, \cX, scripts, Cs,
  // POSIX classes, comments and verbs.
  for (const std::string kept :
       {"\\\\p{L}", "\\Q\\p{L}\\E", "\\c\\", "\\p{Han}+", "\\p{Cs}", "[[:alpha:]x]",
        "[[:^alpha:]x]", "(?#[)x", "(*MARK:[)x", "(?i:'s|'t)"}) {
    EXPECT_EQ(expand(kept), kept);
  }
  EXPECT_EQ(expand("\\c\\s"), "\\c\\s");             // \c takes the \ as its data
  EXPECT_EQ(expand("(?#[)\\s"), "(?#[)" + own(ws));  // the [ is a comment's, not a class
  EXPECT_EQ(expand("[[:]:]\\s"), "[[:]:]" + own(ws));
  // A category: its ranges; \pL and \p{L} alike; the negation as its
  // complement, without the surrogates (PCRE2 refuses them in UTF mode).
  const std::string letters = expand("\\p{L}");
  EXPECT_EQ(expand("\\pL"), letters);
  EXPECT_TRUE(absl::StartsWith(letters, "(?-i:[\\x{41}-\\x{5A}\\x{61}-\\x{7A}\\x{AA}")) << letters;
  // U+1C89 and U+1C8A (Unicode 16) extend the run from U+1C80.
  EXPECT_NE(letters.find("\\x{1C80}-\\x{1C8A}"), std::string::npos);
  const std::string not_letters = expand("\\P{L}");
  EXPECT_TRUE(absl::StartsWith(not_letters, "(?-i:[\\x{0}-\\x{40}\\x{5B}-\\x{60}")) << not_letters;
  EXPECT_EQ(not_letters.find("D800"), std::string::npos);
  EXPECT_EQ(expand("\\p{^L}"), not_letters);
  EXPECT_EQ(expand("\\PS"), expand("\\p{^S}"));
  // Refused, naming the place: an unclosed name, a range at an expanded
  // escape (PCRE2 refuses those too), extended mode.
  for (const char* refused : {"\\p{L", "[\\s-z]", "[a-\\s]", "[\\p{L}-\\x{10FFFF}]", "(?x)a b"}) {
    EXPECT_FALSE(ExpandUnicodeClasses(refused).ok()) << refused;
  }
}

}  // namespace
}  // namespace mlag
