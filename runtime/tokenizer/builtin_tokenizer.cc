#include "runtime/tokenizer/builtin_tokenizer.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/core/status.h"

namespace mlag {
namespace {

using Json = nlohmann::json;

// DeepSeek-V3's pre-tokenizer: digits in runs of at most three, CJK and kana
// runs, then words, punctuation and whitespace.
const char* const kDeepseekV3Splits[] = {
    R"(\p{N}{1,3})",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^)"
    "\r\n"
    R"(\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[)"
    "\r\n"
    R"(]*|\s*[)"
    "\r\n"
    R"(]+|\s+(?!\S)|\s+)",
};

// The text the merges are learned from. Fixed: changing it changes every
// built-in tokenizer (and tests/data/tokenizer must then be made again).
constexpr char kTrainingText[] = R"(
The runtime serves models of the DeepSeek family: multi-head latent attention
and a mixture of experts. A request arrives as text, the tokenizer turns it into
token ids, and the engine schedules it with the other requests of the step. The
scheduler keeps a batch of running sequences; each step computes one new token
for every sequence that is decoding, and a chunk of the prompt for every
sequence that is still in prefill. The key and value cache is split into blocks
of tokens, and a block that holds the same prompt prefix as another request is
shared instead of computed again.

Graphs are captured once for every batch size and replayed for each decode
step, so the host does not launch hundreds of kernels one by one. The attention
of each layer records two nodes: the update of the cache, and the attention
itself. When the group of expert-parallel ranks changes, the runtime replays
dummy captures without touching the pages of live requests.

Weights are stored in f32, bf16 or fp8 with one scale for every block of 128 by
128 values. The host computes in f32 and gives the same bits for a request
whether it runs alone or in a batch of 64, in graph mode or in eager mode, with
one rank or with four. The benchmark reports tokens per second, the bytes a step
reads, and the fraction of the memory bandwidth measured in the same run: 1, 2,
4, 8, 16 and 32 sequences at a context of 512 tokens.

Hello, world! How are you today? I am fine, thank you. What is the time? It is
half past ten in the morning, on the 2nd of December 2026. The weather is cold
and the sky is grey, but the office is warm and the coffee is hot. We write code,
we read code, and we test the code we write. Every test checks a result against
a reference computed in double precision; every error names what is wrong.
)";

Json PreTokenizerJson() {
  Json steps = Json::array();
  for (const char* pattern : kDeepseekV3Splits) {
    steps.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", pattern}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
  }
  steps.push_back({{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}});
  return {{"type", "Sequence"}, {"pretokenizers", steps}};
}

constexpr const char* kSpecialTokens[] = {kBosToken, kEosToken, "<｜User｜>", "<｜Assistant｜>"};

Json TokenizerJson(const std::map<std::string, int>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges) {
  Json added = Json::array();
  for (int i = 0; i < 4; ++i) {
    added.push_back({{"id", i},
                     {"content", kSpecialTokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  Json merges_json = Json::array();
  for (const auto& [l, r] : merges) merges_json.push_back(Json::array({l, r}));
  Json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", false},
                     {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", PreTokenizerJson()},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges_json}}}};
}

std::string ChatTemplate(ChatFormat format) {
  if (format == ChatFormat::kV3) {
    return "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
           "{% elif m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
           "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'] + eos_token }}"
           "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif "
           "%}";
  }
  return "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
         "{{ m['content'] + '\\n\\n' }}{% elif m['role'] == 'user' %}"
         "{{ 'User: ' + m['content'] + '\\n\\n' }}{% elif m['role'] == 'assistant' %}"
         "{{ 'Assistant: ' + m['content'] + eos_token }}{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
}

}  // namespace

absl::StatusOr<TokenizerFiles> BuiltinTokenizerFiles(int vocab_size, ChatFormat format) {
  constexpr int kFirstByteId = 4, kFirstMergeId = kFirstByteId + 256;
  if (vocab_size < kFirstMergeId) {
    return absl::InvalidArgumentError(
        absl::StrCat("a built-in tokenizer needs a vocab_size of at least ", kFirstMergeId,
                     ", got ", vocab_size));
  }
  // The special tokens are in the model's vocabulary as well as among the
  // added tokens (as in DeepSeek's files): loaders that number added tokens
  // after the vocabulary then keep their ids.
  std::map<std::string, int> vocab;
  for (int i = 0; i < kFirstByteId; ++i) vocab[kSpecialTokens[i]] = i;
  std::vector<std::string> byte_char(256);
  for (int b = 0; b < 256; ++b) {
    byte_char[b] = ByteLevelChar(static_cast<uint8_t>(b));
    vocab[byte_char[b]] = kFirstByteId + b;
  }
  // The training text's words through the same pre-tokenizer, counted.
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> bytes_only,
                        Tokenizer::Create(TokenizerJson(vocab, {}).dump(), "", format));
  std::map<std::vector<std::string>, int> words;
  for (const std::string& piece : bytes_only->PreTokenize(kTrainingText)) {
    std::vector<std::string> symbols;
    for (unsigned char c : piece) symbols.push_back(byte_char[c]);
    ++words[symbols];
  }
  // Merge the most frequent pair (ties: the smallest pair) until the
  // vocabulary is full or no pair repeats.
  std::vector<std::pair<std::string, std::string>> merges;
  int next_id = kFirstMergeId;
  while (next_id < vocab_size) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& [w, n] : words) {
      for (size_t i = 0; i + 1 < w.size(); ++i) counts[{w[i], w[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 0;
    for (const auto& [pair, n] : counts) {
      if (n > best_count) best = &pair, best_count = n;
    }
    if (best == nullptr) break;
    const auto pair = *best;
    const std::string merged = pair.first + pair.second;
    merges.push_back(pair);
    vocab[merged] = next_id++;
    std::map<std::vector<std::string>, int> next_words;
    for (const auto& [w, n] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == pair.first && w[i + 1] == pair.second) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      next_words[out] += n;
    }
    words = std::move(next_words);
  }
  // The ids no merge reached: reserved special tokens, as DeepSeek-V3's
  // tokenizer has, so that every id of the model has a token.
  for (int id = next_id; id < vocab_size; ++id) {
    vocab[absl::StrCat("<｜place▁holder▁no▁", id, "｜>")] = id;
  }
  TokenizerFiles files;
  Json json = TokenizerJson(vocab, merges);
  for (int id = next_id; id < vocab_size; ++id) {
    json["added_tokens"].push_back({{"id", id},
                                    {"content", absl::StrCat("<｜place▁holder▁no▁", id, "｜>")},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", true}});
  }
  files.tokenizer_json = json.dump(1) + "\n";
  Json config = {{"add_bos_token", true},
                 {"add_eos_token", false},
                 {"bos_token", {{"content", kBosToken}, {"special", true}}},
                 {"eos_token", {{"content", kEosToken}, {"special", true}}},
                 {"model_max_length", 16384},
                 {"tokenizer_class", "LlamaTokenizerFast"},
                 {"chat_template", ChatTemplate(format)}};
  files.tokenizer_config_json = config.dump(1) + "\n";
  return files;
}

}  // namespace mlag
