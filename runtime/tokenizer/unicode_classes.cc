#include "runtime/tokenizer/unicode_classes.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;

std::vector<CodePointRange> Complement(const NamedRanges& r) {
  std::vector<CodePointRange> out;
  uint32_t next = 0;
  for (size_t i = 0; i < r.size; ++i) {
    if (r.ranges[i].first > next) out.push_back({next, r.ranges[i].first - 1});
    next = r.ranges[i].last + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

// "\x{41}-\x{5A}\x{5F}...": the ranges without the surrogates, which are not
// characters (UTF-8 cannot hold them, and PCRE2 refuses them in UTF mode).
std::string RangesText(const std::vector<CodePointRange>& ranges) {
  std::string out;
  auto add = [&out](uint32_t a, uint32_t b) {
    if (a > b) return;
    absl::StrAppendFormat(&out, "\\x{%X}", a);
    if (b > a) absl::StrAppendFormat(&out, "-\\x{%X}", b);
  };
  for (const CodePointRange& r : ranges) {
    if (r.last < kSurrogateFirst || r.first > kSurrogateLast) {
      add(r.first, r.last);
    } else {
      if (r.first < kSurrogateFirst) add(r.first, kSurrogateFirst - 1);
      if (r.last > kSurrogateLast) add(kSurrogateLast + 1, r.last);
    }
  }
  return out;
}

}  // namespace

const NamedRanges* UnicodeCategory(absl::string_view name) {
  for (int i = 0; i < unicode_tables::kNumCategories; ++i) {
    if (name == unicode_tables::kCategories[i].name) return &unicode_tables::kCategories[i];
  }
  return nullptr;
}

absl::StatusOr<std::string> ExpandUnicodeClasses(absl::string_view p) {
  std::string out;
  out.reserve(p.size());
  bool in_class = false;
  auto refuse = [&p](size_t at, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre-tokenizer regex '", p, "', offset ", at, ": ", why));
  };
  // Ranges as a class of their own (case-sensitive, as PCRE2 treats \p
  // even under (?i): explicit ranges would gain case partners), or into
  // the class being written. `at`..`next`: the escape's span in `p`.
  auto emit = [&](const std::vector<CodePointRange>& ranges, size_t at,
                  size_t next) -> absl::Status {
    if (!in_class) {
      absl::StrAppend(&out, "(?-i:[", RangesText(ranges), "])");
      return absl::OkStatus();
    }
    // A range may not start or end at a class escape (PCRE2 refuses it; as
    // ranges it would mean something else).
    const bool dash_after = next + 1 < p.size() && p[next] == '-' && p[next + 1] != ']';
    const bool dash_before = at >= 2 && p[at - 1] == '-' && p[at - 2] != '[' &&
                             !(p[at - 2] == '^' && at >= 3 && p[at - 3] == '[');
    if (dash_after || dash_before) return refuse(at, "a range cannot start or end at \\p or \\s");
    out += RangesText(ranges);
    return absl::OkStatus();
  };
  auto all = [](const NamedRanges& r) {
    return std::vector<CodePointRange>(r.ranges, r.ranges + r.size);
  };
  // Copies `p[from, to)` as written.
  auto copy = [&](size_t from, size_t to) { out.append(p.data() + from, to - from); };
  // After [ or [^: \E and \Q\E are skipped, as PCRE2 does, before a ]
  // that is then a literal.
  auto class_start = [&](size_t j) {
    for (;;) {
      if (p.substr(j, 2) == "\\E") {
        copy(j, j + 2), j += 2;
      } else if (p.substr(j, 4) == "\\Q\\E") {
        copy(j, j + 4), j += 4;
      } else {
        break;
      }
    }
    if (j < p.size() && p[j] == ']') copy(j, j + 1), ++j;
    return j;
  };
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // a literal run, up to \E
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == absl::string_view::npos ? p.size() : end + 2;
        copy(i, stop);
        i = stop;
        continue;
      }
      if (e == 'c' && i + 2 < p.size()) {  // \cX: X is data
        copy(i, i + 3);
        i += 3;
        continue;
      }
      if (e == 'p' || e == 'P') {
        size_t next;
        absl::string_view name;
        if (i + 2 < p.size() && p[i + 2] == '{') {
          const size_t close = p.find('}', i + 3);
          if (close == absl::string_view::npos) {
            return refuse(i, absl::StrCat("\\", std::string(1, e), "{ is not closed"));
          }
          name = p.substr(i + 3, close - i - 3);
          next = close + 1;
        } else if (i + 2 < p.size()) {
          name = p.substr(i + 2, 1);
          next = i + 3;
        } else {
          copy(i, p.size());  // PCRE2 names the error
          break;
        }
        bool negate = e == 'P';
        if (!name.empty() && name[0] == '^') {
          negate = !negate;
          name.remove_prefix(1);
        }
        for (absl::string_view prefix : {"General_Category=", "gc="}) {
          if (absl::StartsWith(name, prefix)) name.remove_prefix(prefix.size());
        }
        const NamedRanges* table = UnicodeCategory(name);
        // Scripts and other properties stay PCRE2's; so does Cs, the
        // surrogates, which are not characters (and the same in every
        // version): as ranges it would be an empty class.
        if (table == nullptr || name == "Cs") {
          copy(i, next);
        } else {
          MLAG_RETURN_IF_ERROR(emit(negate ? Complement(*table) : all(*table), i, next));
        }
        i = next;
        continue;
      }
      if (e == 's' || e == 'S') {
        MLAG_RETURN_IF_ERROR(emit(e == 's' ? all(unicode_tables::kWhiteSpaceRanges)
                                           : Complement(unicode_tables::kWhiteSpaceRanges),
                                  i, i + 2));
        i += 2;
        continue;
      }
      copy(i, i + 2);  // any other escape: both characters as written
      i += 2;
      continue;
    }
    if (!in_class) {
      // Comments (?#...) and verbs (*...) hold no syntax: copied whole.
      if (c == '(' && (p.substr(i, 3) == "(?#" || p.substr(i, 2) == "(*")) {
        const size_t close = p.find(')', i);
        const size_t stop = close == absl::string_view::npos ? p.size() : close + 1;
        copy(i, stop);
        i = stop;
        continue;
      }
      // Extended mode would make whitespace and # comments syntax too.
      if (c == '(' && p.substr(i, 2) == "(?") {
        size_t j = i + 2;
        while (j < p.size() && (absl::ascii_isalpha(p[j]) || p[j] == '-' || p[j] == '^')) {
          if (p[j] == 'x') return refuse(i, "extended mode (?x) is not supported");
          ++j;
        }
      }
      copy(i, i + 1);
      ++i;
      if (c == '[') {
        in_class = true;
        if (i < p.size() && p[i] == '^') copy(i, i + 1), ++i;
        i = class_start(i);
      }
      continue;
    }
    // [:name:] or [:^name:] inside a class, as PCRE2 reads one.
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      size_t j = i + 2;
      if (j < p.size() && p[j] == '^') ++j;
      while (j < p.size() && absl::ascii_isalpha(p[j])) ++j;
      if (j > i + 2 && p.substr(j, 2) == ":]") {
        copy(i, j + 2);
        i = j + 2;
        continue;
      }
    }
    if (c == ']') in_class = false;
    copy(i, i + 1);
    ++i;
  }
  return out;
}

}  // namespace mlag
