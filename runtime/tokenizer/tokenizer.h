// Text <-> token ids through a Hugging Face `tokenizer.json`: the byte-level
// BPE of DeepSeek-V2/V3 (and of every built-in model, see builtin_tokenizer.h).
//
// What is implemented, and what is refused with an error naming it:
// - model: BPE with merges ("a b" strings or [a, b] pairs), ignore_merges,
//   byte_fallback (<0xXX> tokens); unk_token when a piece cannot be encoded.
// - normalizer: none (null or an empty Sequence).
// - pre_tokenizer: Sequence of Split (Regex or String pattern; Isolated or
//   Removed) and ByteLevel (add_prefix_space, use_regex with GPT-2's
//   pattern). Regexes run on PCRE2 with Unicode properties (UTF + UCP);
//   their general categories (\p{L}, ...) and \s are Unicode 16.0's, as in
//   Hugging Face `tokenizers`, whatever Unicode PCRE2 knows
//   (unicode_classes.h; tests/runtime/tokenizer_codepoint_test.cc checks
//   every code point).
// - added tokens: matched literally before pre-tokenization, longest first.
// - decoder: ByteLevel (and ByteFallback of <0xXX> tokens).
// - tokenizer_config.json: bos_token, eos_token (strings or {"content": ...}),
//   add_bos_token, chat_template (to choose the chat format).
//
//   MLAG_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromDirectory("/models/v3"));
//   MLAG_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("Hello", true));
//   std::string text = tok->Decode(ids, /*skip_special=*/true);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mlag {

// The chat formats of DeepSeek's models, written natively (no template
// engine): V2 "User: ...\n\nAssistant: ..." and V3 "<｜User｜>...<｜Assistant｜>...".
enum class ChatFormat { kV2, kV3 };
absl::StatusOr<ChatFormat> ParseChatFormat(absl::string_view name);  // "v2" or "v3"
absl::string_view ChatFormatName(ChatFormat format);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // `tokenizer_json` is the text of tokenizer.json; `config_json` that of
  // tokenizer_config.json, or empty. The chat format is V3 when the config's
  // chat_template speaks of <｜User｜>, V2 when it has "User: ", and
  // `default_format` otherwise.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(absl::string_view tokenizer_json,
                                                           absl::string_view config_json,
                                                           ChatFormat default_format);
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  // NotFound when DIR has no tokenizer.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir,
                                                                  ChatFormat default_format);

  ~Tokenizer();

  // Token ids of `text` (UTF-8; InvalidArgument otherwise), with the bos
  // token first when `add_bos` and the tokenizer has one.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text, bool add_bos) const;

  // The text of `ids`: the bytes of each token, invalid UTF-8 replaced by
  // U+FFFD. Special added tokens are left out when `skip_special`. Ids
  // outside the vocabulary decode to nothing.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special) const;

  // The pieces the pre-tokenizer cuts `text` (valid UTF-8) into, each then
  // encoded by BPE on its own. For building vocabularies and for tests.
  std::vector<std::string> PreTokenize(absl::string_view text) const;

  // The raw bytes one token stands for ("" for an unknown id).
  std::string TokenBytes(int32_t id) const;
  bool IsSpecial(int32_t id) const;

  // One more than the largest id (vocabulary and added tokens).
  int32_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }

  ChatFormat chat_format() const { return chat_format_; }
  void set_chat_format(ChatFormat format) { chat_format_ = format; }
  // The prompt text of a conversation in this tokenizer's chat format, with
  // the bos token's text first and, when `add_generation_prompt`, the opening
  // of the assistant's reply last. InvalidArgument for an unknown role.
  absl::StatusOr<std::string> FormatChat(absl::Span<const ChatMessage> messages,
                                         bool add_generation_prompt) const;

 private:
  struct Impl;
  Tokenizer();
  std::unique_ptr<Impl> impl_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_, eos_id_;
  bool add_bos_ = false;
  ChatFormat chat_format_ = ChatFormat::kV3;
};

// Turns a stream of token ids into text as it grows, emitting only whole
// UTF-8 characters: a character split over several byte tokens appears once
// its last byte has arrived. Decode(all ids) == concatenation of every Push
// plus Finish.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // The text that token `id` completes (possibly empty).
  std::string Push(int32_t id);
  // Whatever is still held back (an incomplete character), as U+FFFD.
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an unfinished UTF-8 sequence
};

// The character (UTF-8) that stands for `byte` in GPT-2's byte-level
// alphabet: the byte itself when it is a printable Latin-1 character, else
// U+0100 + its rank among the others.
const std::string& ByteLevelChar(uint8_t byte);

// `bytes` with every invalid UTF-8 sequence replaced by U+FFFD; when
// `keep_incomplete_tail` is set, an unfinished sequence at the end is not
// replaced but returned in *tail (and left out of the result).
std::string SanitizeUtf8(absl::string_view bytes, bool keep_incomplete_tail = false,
                         std::string* tail = nullptr);

// The first position in `text` at or after `from` where any of `stops`
// begins, or npos. Empty stop strings never match.
size_t FindStopString(absl::string_view text, absl::Span<const std::string> stops, size_t from = 0);

}  // namespace mlag
