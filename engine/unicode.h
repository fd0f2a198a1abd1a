/* unicode.h - UTF-8 decoding and the Unicode general-category classes the
 * pre-tokenizer regexes need (\p{L}, \p{N}, \p{P}, \p{S}, \p{M}, white
 * space), from tables generated from the Unicode database. */
#ifndef RLAI_UNICODE_H
#define RLAI_UNICODE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum rlai_ucat {
    RLAI_UCAT_OTHER = 0, RLAI_UCAT_LETTER = 1, RLAI_UCAT_NUMBER = 2,
    RLAI_UCAT_PUNCT = 3, RLAI_UCAT_SYMBOL = 4, RLAI_UCAT_MARK = 5,
    RLAI_UCAT_SEPARATOR = 6,
};

/* Decodes one code point at s[0..len). Returns bytes consumed (1..4); an
 * invalid or truncated sequence consumes 1 byte and yields U+FFFD-like
 * behaviour: *cp = 0xFFFD. len must be >= 1. */
int rlai_utf8_decode(const char *s, size_t len, uint32_t *cp);
/* Encodes cp into out (>= 4 bytes); returns bytes written. */
int rlai_utf8_encode(uint32_t cp, char *out);
/* Length of the longest prefix of s[0..len) made of complete, valid UTF-8
 * characters is not needed here; see textstream.h. */

enum rlai_ucat rlai_unicode_category(uint32_t cp);
bool rlai_unicode_is_whitespace(uint32_t cp);   /* \s as in the regexes */

#endif
