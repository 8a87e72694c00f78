// The tokenizer of the built-in models, and of what `mlag export` writes for
// them: a byte-level BPE in Hugging Face's tokenizer.json format with
// DeepSeek-V3's pre-tokenizer and special tokens, its merges learned from a
// fixed English text, so that it is the same on every machine and its ids fit
// the model's vocab_size.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "runtime/tokenizer/tokenizer.h"

namespace mlag {

struct TokenizerFiles {
  std::string tokenizer_json;         // tokenizer.json
  std::string tokenizer_config_json;  // tokenizer_config.json
};

// Exactly `vocab_size` ids: 4 special tokens, the 256 bytes, merges for as
// long as the training text has an adjacent pair left, then reserved special
// tokens. `format` picks the chat template written into tokenizer_config.json. InvalidArgument when
// vocab_size < 260.
absl::StatusOr<TokenizerFiles> BuiltinTokenizerFiles(int vocab_size, ChatFormat format);

// The special tokens, DeepSeek's spelling.
inline constexpr char kBosToken[] = "<｜begin▁of▁sentence｜>";
inline constexpr char kEosToken[] = "<｜end▁of▁sentence｜>";

}  // namespace mlag
