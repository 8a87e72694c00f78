#include "runtime/tokenizer/unicode_classes.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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
  // Ranges as a class of their own, or into the class being written.
  auto emit = [&](const std::vector<CodePointRange>& ranges) {
    if (in_class) {
      out += RangesText(ranges);
    } else {
      absl::StrAppend(&out, "[", RangesText(ranges), "]");
    }
  };
  auto all = [](const NamedRanges& r) {
    return std::vector<CodePointRange>(r.ranges, r.ranges + r.size);
  };
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // a literal run, up to \E
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == absl::string_view::npos ? p.size() : end + 2;
        out.append(p.data() + i, stop - i);
        i = stop;
        continue;
      }
      if (e == 'p' || e == 'P') {
        size_t next;
        absl::string_view name;
        if (i + 2 < p.size() && p[i + 2] == '{') {
          const size_t close = p.find('}', i + 3);
          if (close == absl::string_view::npos) {
            return absl::InvalidArgumentError(absl::StrCat(
                "pre-tokenizer regex: \\", std::string(1, e), "{ at offset ", i, " is not closed"));
          }
          name = p.substr(i + 3, close - i - 3);
          next = close + 1;
        } else if (i + 2 < p.size()) {
          name = p.substr(i + 2, 1);
          next = i + 3;
        } else {
          out.append(p.data() + i, p.size() - i);  // PCRE2 names the error
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
        if (table == nullptr) {  // a script or another property: PCRE2's own
          out.append(p.data() + i, next - i);
        } else {
          emit(negate ? Complement(*table) : all(*table));
        }
        i = next;
        continue;
      }
      if (e == 's') {
        emit(all(unicode_tables::kWhiteSpaceRanges));
        i += 2;
        continue;
      }
      if (e == 'S') {
        emit(Complement(unicode_tables::kWhiteSpaceRanges));
        i += 2;
        continue;
      }
      out += c;  // any other escape: both characters as written
      out += e;
      i += 2;
      continue;
    }
    if (!in_class) {
      out += c;
      ++i;
      if (c == '[') {
        in_class = true;
        // A leading ^ negates; a ] right after [ or [^ is a literal.
        if (i < p.size() && p[i] == '^') out += p[i++];
        if (i < p.size() && p[i] == ']') out += p[i++];
      }
      continue;
    }
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] inside a class
      const size_t close = p.find(":]", i + 2);
      if (close != absl::string_view::npos) {
        out.append(p.data() + i, close + 2 - i);
        i = close + 2;
        continue;
      }
    }
    if (c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

}  // namespace mlag
