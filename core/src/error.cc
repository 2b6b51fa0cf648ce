#include "qattn/error.h"

#include <cstdio>

namespace qattn {

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (2-4), or 0 if there is none. Overlong forms, surrogates and
// code points above U+10FFFF are not valid.
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  std::size_t n = 0;
  char32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  if (n == 2 && cp < 0xA0) return 0;  // U+0080..U+009F: the C1 controls
  return n;
}

}  // namespace

std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && out.size() < max_bytes;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (const std::size_t n = c >= 0x80 ? utf8_sequence(text, i) : 0) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    char esc[5];
    std::snprintf(esc, sizeof esc, "\\x%02x", c);
    out += esc;
    ++i;
  }
  if (i < text.size()) out += "...[" + std::to_string(text.size() - i) + " more bytes]";
  return out;
}

}  // namespace qattn
