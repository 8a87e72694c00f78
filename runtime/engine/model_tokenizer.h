// The tokenizer that goes with a model: a checkpoint directory's own
// tokenizer.json (+ tokenizer_config.json), or for a built-in model the
// generated one (runtime/tokenizer/builtin_tokenizer.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "layers/model_config.h"
#include "runtime/tokenizer/builtin_tokenizer.h"
#include "runtime/tokenizer/tokenizer.h"

namespace mlag {

// The chat format a model speaks when its tokenizer config does not say:
// V3's for deepseek_v3, V2's otherwise.
ChatFormat DefaultChatFormat(const ModelConfig& config);

// The files: a directory's own (NotFound when it has no tokenizer.json), or
// the built-in tokenizer for `config`'s vocabulary.
absl::StatusOr<TokenizerFiles> ModelTokenizerFiles(const std::string& name_or_dir,
                                                   const ModelConfig& config);

// The tokenizer itself. A tokenizer whose ids reach past the model's
// vocabulary is refused (InvalidArgument): its ids could not be embedded.
absl::StatusOr<std::unique_ptr<Tokenizer>> OpenModelTokenizer(const std::string& name_or_dir,
                                                              const ModelConfig& config);

}  // namespace mlag
