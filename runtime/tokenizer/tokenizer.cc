#include "runtime/tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <queue>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/core/file.h"
#include "runtime/core/status.h"
#include "runtime/tokenizer/unicode_classes.h"

namespace mlag {
namespace {

using Json = nlohmann::json;

// GPT-2's byte-level alphabet: byte b stands for code point b when b is a
// printable Latin-1 character, and for 256 + n (n-th of the others) if not.
struct ByteAlphabet {
  std::string char_of_byte[256];                   // UTF-8 of the code point
  absl::flat_hash_map<uint32_t, uint8_t> byte_of;  // code point -> byte

  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + n++;
      char_of_byte[b] = EncodeUtf8(cp);
      byte_of[cp] = static_cast<uint8_t>(b);
    }
  }

  static std::string EncodeUtf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t byte) { return Alphabet().char_of_byte[byte]; }

namespace {

// Length of the valid UTF-8 sequence at s[i] (1..4), 0 when it is invalid,
// or -1 when it is a valid but unfinished prefix running past the end.
int Utf8SequenceLength(absl::string_view s, size_t i, uint32_t* cp_out = nullptr) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  int len;
  uint32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c < 0x80) {
    if (cp_out != nullptr) *cp_out = c;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // beyond U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp_out != nullptr) *cp_out = cp;
  return len;
}

// A compiled PCRE2 pattern (UTF + Unicode properties), JIT-compiled where
// the platform offers it. Its general categories and \s are the Unicode
// tables' (unicode_classes.h), not those of the Unicode PCRE2 was built with.
class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern) {
    MLAG_ASSIGN_OR_RETURN(const std::string expanded, ExpandUnicodeClasses(pattern));
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expanded.data()), expanded.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      // (PCRE2's offset would be into the expanded pattern.)
      return absl::InvalidArgumentError(
          absl::StrCat("pre-tokenizer regex '", pattern, "': ", reinterpret_cast<char*>(message)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
    return std::unique_ptr<Regex>(new Regex(code));
  }
  ~Regex() { pcre2_code_free(code_); }

  // The [begin, end) of every non-overlapping match in `s`, left to right.
  std::vector<std::pair<size_t, size_t>> FindAll(absl::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t at = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;  // no match (or a match-time error: no more splits)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] > ov[0]) out.emplace_back(ov[0], ov[1]);
      if (ov[1] > ov[0]) {
        at = ov[1];
      } else {  // an empty match: step over one character
        if (ov[0] >= s.size()) break;
        const int len = Utf8SequenceLength(s, ov[0]);
        at = ov[0] + std::max(len, 1);
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

// GPT-2's pattern, for ByteLevel pre-tokenizers with use_regex.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel } kind;
  std::unique_ptr<Regex> regex;  // kSplit, and kByteLevel with use_regex
  bool remove = false;           // Split behavior Removed (else Isolated)
  bool add_prefix_space = false;
};

std::string StringOrContent(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

}  // namespace

struct Tokenizer::Impl {
  absl::flat_hash_map<std::string, int32_t> vocab;  // token text -> id
  std::vector<std::string> bytes_of_id;             // decoded bytes
  std::vector<uint8_t> special;                     // per id
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  absl::flat_hash_map<uint64_t, Merge> merges;  // (left << 32 | right) -> merge
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Added> added;                   // longest first
  std::vector<int> added_by_first_byte[256];  // indices into `added`, longest first
  std::vector<PreTokenizerStep> steps;
  bool byte_level = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;
  int32_t byte_token[256];  // <0xXX> ids for byte_fallback; -1 when absent

  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::Status EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const;
  std::vector<std::string> PreTokenize(absl::string_view text) const;
};

Tokenizer::Tokenizer() : impl_(new Impl()) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<ChatFormat> ParseChatFormat(absl::string_view name) {
  if (name == "v2") return ChatFormat::kV2;
  if (name == "v3") return ChatFormat::kV3;
  return absl::InvalidArgumentError(absl::StrCat("chat format '", name, "': expected v2 or v3"));
}

absl::string_view ChatFormatName(ChatFormat format) {
  return format == ChatFormat::kV2 ? "v2" : "v3";
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(absl::string_view tokenizer_json,
                                                             absl::string_view config_json,
                                                             ChatFormat default_format) {
  Json j = Json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  Impl& im = *tok->impl_;
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", what));
  };

  // The model.
  if (!j.contains("model") || !j["model"].is_object()) return bad("no \"model\" object");
  const Json& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") return bad(absl::StrCat("model type '", type, "' (only BPE is supported)"));
  if (!m.contains("vocab") || !m["vocab"].is_object()) return bad("model has no vocab object");
  int64_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t{1} << 30)) {
      return bad(absl::StrCat("vocab entry '", it.key(), "' has no valid id"));
    }
    const int32_t id = it.value().get<int32_t>();
    im.vocab[it.key()] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  im.byte_fallback = m.value("byte_fallback", false);
  im.ignore_merges = m.value("ignore_merges", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto u = im.vocab.find(m["unk_token"].get<std::string>());
    if (u != im.vocab.end()) im.unk_id = u->second;
  }
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0) {
    return bad("BPE dropout is not supported");
  }

  // Added tokens (may extend the id range).
  std::vector<std::pair<std::string, std::pair<int32_t, bool>>> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const Json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return bad("an added_tokens entry lacks an integer id or a string content");
      }
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 30)) return bad("an added token id is out of range");
      added.push_back(
          {a["content"].get<std::string>(), {static_cast<int32_t>(id), a.value("special", false)}});
      max_id = std::max<int64_t>(max_id, id);
    }
  }
  tok->vocab_size_ = static_cast<int32_t>(max_id + 1);
  im.bytes_of_id.assign(tok->vocab_size_, "");
  im.special.assign(tok->vocab_size_, 0);

  // Byte-level when the pre-tokenizer has a ByteLevel step: pieces are then
  // bytes spelled in GPT-2's alphabet, and so are the vocabulary's tokens.
  im.byte_level = false;
  if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
    const Json& p = j["pre_tokenizer"];
    if (p.value("type", std::string()) == "ByteLevel") im.byte_level = true;
    if (p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
      for (const Json& s : p["pretokenizers"]) {
        if (s.is_object() && s.value("type", std::string()) == "ByteLevel") im.byte_level = true;
      }
    }
  }
  // The decoder and each id's bytes.
  if (j.contains("decoder") && j["decoder"].is_object()) {
    const std::string d = j["decoder"].value("type", std::string());
    bool ok = d == "ByteLevel";
    if (d == "Sequence") {
      ok = true;
      for (const Json& s : j["decoder"].value("decoders", Json::array())) {
        const std::string t = s.value("type", std::string());
        if (t != "ByteLevel" && t != "ByteFallback") ok = false;
      }
    }
    if (!ok) return bad(absl::StrCat("decoder '", d, "' (only ByteLevel is supported)"));
  }
  std::fill(std::begin(im.byte_token), std::end(im.byte_token), -1);
  const ByteAlphabet& alphabet = Alphabet();
  for (const auto& [text, id] : im.vocab) {
    if (text.size() == 6 && absl::StartsWith(text, "<0x") && text[5] == '>') {
      int byte = 0;
      if (std::sscanf(text.c_str() + 3, "%2x", &byte) == 1) {
        im.byte_token[byte] = id;
        if (im.byte_fallback) {
          im.bytes_of_id[id] = std::string(1, static_cast<char>(byte));
          continue;
        }
      }
    }
    std::string bytes;
    for (size_t i = 0; i < text.size();) {
      uint32_t cp = 0;
      const int len = Utf8SequenceLength(text, i, &cp);
      if (len <= 0) return bad(absl::StrCat("vocab entry with id ", id, " is not UTF-8"));
      auto b = alphabet.byte_of.find(cp);
      if (!im.byte_level || b == alphabet.byte_of.end()) {
        bytes.append(text, i, len);  // not a byte-level character: itself
      } else {
        bytes += static_cast<char>(b->second);
      }
      i += len;
    }
    im.bytes_of_id[id] = std::move(bytes);
  }
  for (const auto& [content, v] : added) {
    im.bytes_of_id[v.first] = content;
    im.special[v.first] = v.second ? 1 : 0;
    im.added.push_back({content, v.first});
  }
  std::stable_sort(im.added.begin(), im.added.end(),
                   [](const Impl::Added& a, const Impl::Added& b) {
                     return a.content.size() > b.content.size();
                   });
  im.added.erase(std::remove_if(im.added.begin(), im.added.end(),
                                [](const Impl::Added& a) { return a.content.empty(); }),
                 im.added.end());
  for (size_t i = 0; i < im.added.size(); ++i) {
    im.added_by_first_byte[static_cast<unsigned char>(im.added[i].content[0])].push_back(
        static_cast<int>(i));
  }

  // Merges.
  if (m.contains("merges") && m["merges"].is_array()) {
    int32_t rank = 0;
    for (const Json& e : m["merges"]) {
      std::string left, right;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) return bad(absl::StrCat("merge '", s, "' has no space"));
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        left = e[0].get<std::string>();
        right = e[1].get<std::string>();
      } else {
        return bad("a merge is neither \"a b\" nor [a, b]");
      }
      auto l = im.vocab.find(left), r = im.vocab.find(right), lr = im.vocab.find(left + right);
      if (l == im.vocab.end() || r == im.vocab.end() || lr == im.vocab.end()) {
        return bad(absl::StrCat("merge '", left, " ", right, "' names a token not in the vocab"));
      }
      im.merges.try_emplace(Impl::Key(l->second, r->second), Impl::Merge{rank++, lr->second});
    }
  }

  // Normalizer: none.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const Json& n = j["normalizer"];
    const bool empty_sequence = n.value("type", std::string()) == "Sequence" &&
                                n.value("normalizers", Json::array()).empty();
    if (!empty_sequence) {
      return bad(
          absl::StrCat("normalizer '", n.value("type", std::string("?")), "' is not supported"));
    }
  }
  // Pre-tokenizer.
  std::vector<const Json*> steps;
  if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
    const Json& p = j["pre_tokenizer"];
    if (p.value("type", std::string()) == "Sequence") {
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
        return bad("a Sequence pre-tokenizer has no pretokenizers array");
      }
      for (const Json& s : p["pretokenizers"]) steps.push_back(&s);
    } else {
      steps.push_back(&p);
    }
  }
  for (const Json* s : steps) {
    if (!s->is_object()) return bad("a pre-tokenizer is not an object");
    const std::string t = s->value("type", std::string());
    PreTokenizerStep step;
    if (t == "Split") {
      step.kind = PreTokenizerStep::kSplit;
      const Json& pat = (*s)["pattern"];
      std::string pattern;
      if (pat.contains("Regex")) {
        pattern = pat["Regex"].get<std::string>();
      } else if (pat.contains("String")) {
        // A literal: quote every character for the regex engine.
        pattern = absl::StrCat("\\Q", pat["String"].get<std::string>(), "\\E");
      } else {
        return bad("a Split pre-tokenizer has neither a Regex nor a String pattern");
      }
      const std::string behavior = s->value("behavior", std::string("Isolated"));
      if (behavior != "Isolated" && behavior != "Removed") {
        return bad(
            absl::StrCat("Split behavior '", behavior, "' (Isolated and Removed are supported)"));
      }
      if (s->value("invert", false)) return bad("inverted Split is not supported");
      step.remove = behavior == "Removed";
      MLAG_ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern));
    } else if (t == "ByteLevel") {
      step.kind = PreTokenizerStep::kByteLevel;
      step.add_prefix_space = s->value("add_prefix_space", false);
      if (s->value("use_regex", true)) {
        MLAG_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern));
      }
    } else {
      return bad(absl::StrCat("pre-tokenizer '", t, "' is not supported"));
    }
    im.steps.push_back(std::move(step));
  }

  // tokenizer_config.json.
  std::string template_text;
  if (!config_json.empty()) {
    Json c = Json::parse(config_json.begin(), config_json.end(), nullptr, false);
    if (c.is_discarded() || !c.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
    }
    auto token_id = [&](const char* key) -> absl::StatusOr<std::optional<int32_t>> {
      if (!c.contains(key) || c[key].is_null()) return std::optional<int32_t>();
      const std::string text = StringOrContent(c[key]);
      for (const Impl::Added& a : im.added) {
        if (a.content == text) return std::optional<int32_t>(a.id);
      }
      auto v = im.vocab.find(text);
      if (v != im.vocab.end()) return std::optional<int32_t>(v->second);
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer_config.json: ", key, " '", text, "' is not a token"));
    };
    MLAG_ASSIGN_OR_RETURN(tok->bos_id_, token_id("bos_token"));
    MLAG_ASSIGN_OR_RETURN(tok->eos_id_, token_id("eos_token"));
    tok->add_bos_ = c.value("add_bos_token", tok->bos_id_.has_value()) && tok->bos_id_;
    if (c.contains("chat_template") && c["chat_template"].is_string()) {
      template_text = c["chat_template"].get<std::string>();
    }
  }
  tok->chat_format_ = absl::StrContains(template_text, "<｜User｜>") ? ChatFormat::kV3
                      : absl::StrContains(template_text, "User: ")   ? ChatFormat::kV2
                                                                     : default_format;
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir,
                                                                    ChatFormat default_format) {
  absl::StatusOr<std::string> json = ReadFile(dir + "/tokenizer.json");
  if (!json.ok()) {
    return absl::Status(
        json.status().code(),
        absl::StrCat(dir, " has no readable tokenizer.json: ", json.status().message()));
  }
  std::string config;
  absl::StatusOr<std::string> c = ReadFile(dir + "/tokenizer_config.json");
  if (c.ok()) config = *std::move(c);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Create(*json, config, default_format);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat(dir, ": ", tok.status().message()));
  }
  return tok;
}

std::vector<std::string> Tokenizer::PreTokenize(absl::string_view text) const {
  return impl_->PreTokenize(text);
}

std::vector<std::string> Tokenizer::Impl::PreTokenize(absl::string_view text) const {
  std::vector<std::string> pieces = {std::string(text)};
  for (const PreTokenizerStep& step : steps) {
    std::vector<std::string> next;
    for (std::string& piece : pieces) {
      if (step.kind == PreTokenizerStep::kByteLevel) {
        std::string p = std::move(piece);
        if (step.add_prefix_space && !absl::StartsWith(p, " ")) p.insert(0, " ");
        if (step.regex == nullptr) {
          next.push_back(std::move(p));
          continue;
        }
        for (const auto& [b, e] : step.regex->FindAll(p)) next.push_back(p.substr(b, e - b));
        continue;
      }
      size_t at = 0;
      for (const auto& [b, e] : step.regex->FindAll(piece)) {
        if (b > at) next.push_back(piece.substr(at, b - at));
        if (!step.remove) next.push_back(piece.substr(b, e - b));
        at = e;
      }
      if (at < piece.size()) next.push_back(piece.substr(at));
    }
    pieces = std::move(next);
  }
  return pieces;
}

absl::Status Tokenizer::Impl::EncodePiece(absl::string_view piece,
                                          std::vector<int32_t>* out) const {
  std::string text;
  if (byte_level) {
    for (unsigned char c : piece) text += Alphabet().char_of_byte[c];
  } else {
    text = std::string(piece);
  }
  if (ignore_merges) {
    auto whole = vocab.find(text);
    if (whole != vocab.end()) {
      out->push_back(whole->second);
      return absl::OkStatus();
    }
  }
  // Initial symbols: one per character.
  std::vector<int32_t> sym;
  for (size_t i = 0; i < text.size();) {
    const int len = std::max(Utf8SequenceLength(text, i), 1);
    auto v = vocab.find(absl::string_view(text).substr(i, len));
    if (v != vocab.end()) {
      sym.push_back(v->second);
    } else if (byte_fallback) {
      for (int k = 0; k < len; ++k) {
        const int32_t b = byte_token[static_cast<unsigned char>(text[i + k])];
        if (b < 0) return absl::InvalidArgumentError("byte_fallback without its <0xXX> token");
        sym.push_back(b);
      }
    } else if (unk_id) {
      sym.push_back(*unk_id);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "the tokenizer cannot encode '", text.substr(i, len), "' (no such token, no fallback)"));
    }
    i += len;
  }
  // Merges, lowest rank first (leftmost among equals), through a heap of
  // candidate pairs over a linked list; stale candidates are skipped.
  const int n = static_cast<int>(sym.size());
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Cand {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto mg = merges.find(Key(sym[i], sym[next[i]]));
    if (mg != merges.end()) heap.push({mg->second.rank, i, sym[i], sym[next[i]]});
  };
  for (int i = 0; i < n; ++i) push(i);
  std::vector<uint8_t> alive(n, 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int i = c.pos;
    if (!alive[i] || next[i] < 0 || sym[i] != c.left || sym[next[i]] != c.right) continue;
    const int j = next[i];
    sym[i] = merges.find(Key(c.left, c.right))->second.merged;
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) out->push_back(sym[i]);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text, bool add_bos) const {
  for (size_t i = 0; i < text.size();) {
    const int len = Utf8SequenceLength(text, i);
    if (len <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 at byte ", i));
    }
    i += len;
  }
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  if (add_bos && bos_id_) ids.push_back(*bos_id_);
  // Added tokens split the text first; the rest is pre-tokenized and BPE'd.
  auto encode_plain = [&](absl::string_view plain) -> absl::Status {
    if (plain.empty()) return absl::OkStatus();
    for (const std::string& piece : im.PreTokenize(plain)) {
      if (!piece.empty()) MLAG_RETURN_IF_ERROR(im.EncodePiece(piece, &ids));
    }
    return absl::OkStatus();
  };
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const Impl::Added* hit = nullptr;
    for (int k : im.added_by_first_byte[static_cast<unsigned char>(text[i])]) {
      const Impl::Added& a = im.added[k];
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    MLAG_RETURN_IF_ERROR(encode_plain(text.substr(start, i - start)));
    ids.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  MLAG_RETURN_IF_ERROR(encode_plain(text.substr(start)));
  return ids;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return "";
  return impl_->bytes_of_id[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size_ && impl_->special[id] != 0;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && IsSpecial(id)) continue;
    if (id >= 0 && id < vocab_size_) bytes += impl_->bytes_of_id[id];
  }
  return SanitizeUtf8(bytes);
}

absl::StatusOr<std::string> Tokenizer::FormatChat(absl::Span<const ChatMessage> messages,
                                                  bool add_generation_prompt) const {
  const std::string bos = bos_id_ ? TokenBytes(*bos_id_) : "";
  const std::string eos = eos_id_ ? TokenBytes(*eos_id_) : "";
  std::string system, turns;
  for (const ChatMessage& msg : messages) {
    if (msg.role == "system") {
      if (!system.empty()) system += "\n\n";
      system += msg.content;
    } else if (msg.role == "user") {
      turns += chat_format_ == ChatFormat::kV3 ? absl::StrCat("<｜User｜>", msg.content)
                                               : absl::StrCat("User: ", msg.content, "\n\n");
    } else if (msg.role == "assistant") {
      turns += chat_format_ == ChatFormat::kV3 ? absl::StrCat("<｜Assistant｜>", msg.content, eos)
                                               : absl::StrCat("Assistant: ", msg.content, eos);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("message role '", msg.role, "': expected system, user or assistant"));
    }
  }
  if (chat_format_ == ChatFormat::kV2 && !system.empty()) system += "\n\n";
  std::string prompt = absl::StrCat(bos, system, turns);
  if (add_generation_prompt) {
    prompt += chat_format_ == ChatFormat::kV3 ? "<｜Assistant｜>" : "Assistant:";
  }
  return prompt;
}

std::string SanitizeUtf8(absl::string_view bytes, bool keep_incomplete_tail, std::string* tail) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int len = Utf8SequenceLength(bytes, i);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
    } else if (len < 0 && keep_incomplete_tail) {
      if (tail != nullptr) tail->assign(bytes.data() + i, bytes.size() - i);
      return out;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  if (tail != nullptr) tail->clear();
  return out;
}

std::string IncrementalDetokenizer::Push(int32_t id) {
  if (skip_special_ && tokenizer_->IsSpecial(id)) return "";
  pending_ += tokenizer_->TokenBytes(id);
  std::string tail;
  std::string out = SanitizeUtf8(pending_, /*keep_incomplete_tail=*/true, &tail);
  pending_ = std::move(tail);
  return out;
}

std::string IncrementalDetokenizer::Finish() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

size_t FindStopString(absl::string_view text, absl::Span<const std::string> stops, size_t from) {
  size_t best = absl::string_view::npos;
  for (const std::string& s : stops) {
    if (s.empty() || from > text.size()) continue;
    const size_t at = text.find(s, from);
    if (at != absl::string_view::npos && (best == absl::string_view::npos || at < best)) best = at;
  }
  return best;
}

}  // namespace mlag
