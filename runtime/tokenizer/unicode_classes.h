// Unicode character classes for pre-tokenizer regexes that must agree with
// Hugging Face `tokenizers` on every code point, whatever Unicode version
// the system's PCRE2 knows.
//
// `tokenizers` (Oniguruma) knows Unicode 16.0; Debian 12's PCRE2 10.42 knows
// 14.0, so every letter, digit, mark, punctuation or symbol added since (new
// emoji among them) falls outside its \p{L}, \p{N}, ... and splits text
// differently; its \s also counts U+180E, which White_Space has not since
// Unicode 6.3. ExpandUnicodeClasses rewrites those escapes into explicit
// code point ranges from tables generated from the Unicode database
// (make_unicode_tables.py, pinned to the version `tokenizers` has), which
// PCRE2 matches the same at any version.
//
//   MLAG_ASSIGN_OR_RETURN(std::string pattern, ExpandUnicodeClasses(R"(\p{L}+|\s+)"));
//   // "(?-i:[\x{41}-\x{5A}\x{61}-\x{7A}...])+|(?-i:[\x{9}-\x{D}\x{20}...])+"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlag {

struct CodePointRange {
  uint32_t first, last;  // inclusive
};

struct NamedRanges {
  const char* name;  // "L", "Lu", ..., "White_Space"
  const CodePointRange* ranges;
  size_t size;  // sorted, disjoint, not adjacent
};

namespace unicode_tables {
// unicode_tables.cc (generated).
extern const char kVersion[];  // "16.0.0"
extern const NamedRanges kCategories[];
extern const int kNumCategories;
extern const NamedRanges kWhiteSpaceRanges;
}  // namespace unicode_tables

// The ranges of general category `name` (one letter, "L", or two, "Lu"; "Cn"
// is the unassigned code points), or nullptr for another name.
const NamedRanges* UnicodeCategory(absl::string_view name);

// `pattern` (PCRE2 syntax) with \p{X}, \pX, \P{X}, \PX and \p{^X} (X a
// general category but Cs, with or without a "General_Category=" or "gc="
// prefix), \s and \S replaced by explicit ranges of the tables: a
// case-sensitive class of its own outside brackets, the ranges themselves
// inside them (a negation as its complement's ranges). Every other part of
// the pattern is kept as written: other properties and lower-case or
// spaced names (left to PCRE2's Unicode), \w, \d, \b, \h, \v, \R, POSIX
// classes, \Q...\E, \cX, comments (?#...) and verbs (*...).
// InvalidArgument naming the place for a \p{ that is not closed, a class
// range that starts or ends at an expanded escape ([\s-z], which PCRE2
// refuses too), and extended mode (?x).
// Under (?i), an expanded escape inside brackets gains the case partners of
// its ranges (PCRE2 ignores case for \p); the patterns tokenizers ship use
// (?i) only around literals.
absl::StatusOr<std::string> ExpandUnicodeClasses(absl::string_view pattern);

}  // namespace mlag
