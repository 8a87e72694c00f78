#include "runtime/engine/model_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/core/file.h"
#include "runtime/core/status.h"

namespace mlag {

ChatFormat DefaultChatFormat(const ModelConfig& config) {
  return config.model_type == "deepseek_v3" ? ChatFormat::kV3 : ChatFormat::kV2;
}

absl::StatusOr<TokenizerFiles> ModelTokenizerFiles(const std::string& name_or_dir,
                                                   const ModelConfig& config) {
  if (IsBuiltinModel(name_or_dir)) {
    return BuiltinTokenizerFiles(config.vocab_size, DefaultChatFormat(config));
  }
  TokenizerFiles files;
  absl::StatusOr<std::string> json = ReadFile(name_or_dir + "/tokenizer.json");
  if (!json.ok()) return json.status();
  files.tokenizer_json = *std::move(json);
  absl::StatusOr<std::string> config_json = ReadFile(name_or_dir + "/tokenizer_config.json");
  if (config_json.ok()) {
    files.tokenizer_config_json = *std::move(config_json);
  } else if (!absl::IsNotFound(config_json.status())) {
    return config_json.status();
  }
  return files;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> OpenModelTokenizer(const std::string& name_or_dir,
                                                              const ModelConfig& config) {
  MLAG_ASSIGN_OR_RETURN(TokenizerFiles files, ModelTokenizerFiles(name_or_dir, config));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Create(
      files.tokenizer_json, files.tokenizer_config_json, DefaultChatFormat(config));
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat(name_or_dir, ": ", tok.status().message()));
  }
  if ((*tok)->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_or_dir, ": the tokenizer has ids up to ", (*tok)->vocab_size() - 1,
                     ", beyond the model's vocab_size ", config.vocab_size));
  }
  return tok;
}

}  // namespace mlag
