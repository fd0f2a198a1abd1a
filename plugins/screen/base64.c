/* base64.c - base64 encode/decode (see base64.h). */
#include "base64.h"

#include <stdlib.h>
#include <string.h>

#include <rlai/error.h>

static const char ALPHA[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int rlai_screen_b64_encode(const uint8_t *data, size_t len, char **out)
{
    *out = NULL;
    if (len > (SIZE_MAX - 1) / 4 * 3 - 3)
        return RLAI_ERR_TOO_LARGE;
    size_t n = (len + 2) / 3 * 4;
    char *s = malloc(n + 1);
    if (!s)
        return RLAI_ERR_NOMEM;
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8 | data[i + 2];
        s[o++] = ALPHA[v >> 18];
        s[o++] = ALPHA[(v >> 12) & 63];
        s[o++] = ALPHA[(v >> 6) & 63];
        s[o++] = ALPHA[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)data[i] << 16 | (i + 1 < len ? (uint32_t)data[i + 1] << 8 : 0);
        s[o++] = ALPHA[v >> 18];
        s[o++] = ALPHA[(v >> 12) & 63];
        s[o++] = i + 1 < len ? ALPHA[(v >> 6) & 63] : '=';
        s[o++] = '=';
    }
    s[o] = '\0';
    *out = s;
    return 0;
}

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int rlai_screen_b64_decode(const char *text, size_t text_len, size_t max_out, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (text_len >= 5 && strncmp(text, "data:", 5) == 0) {
        const char *comma = memchr(text, ',', text_len);
        const char *tag = comma && comma - text >= 7 ? comma - 7 : NULL;
        if (!tag || memcmp(tag, ";base64", 7) != 0)
            return RLAI_ERR_FORMAT;
        text_len -= (size_t)(comma + 1 - text);
        text = comma + 1;
    }
    size_t cap = text_len / 4 * 3 + 3;
    if (max_out && cap > max_out + 3) {
        /* whitespace could make it fit: count the alphabet characters */
        size_t sig = 0;
        for (size_t i = 0; i < text_len; i++)
            sig += b64_val((unsigned char)text[i]) >= 0;
        if (sig / 4 * 3 > max_out)
            return RLAI_ERR_TOO_LARGE;
    }
    uint8_t *b = malloc(cap ? cap : 1);
    if (!b)
        return RLAI_ERR_NOMEM;
    size_t o = 0;
    uint32_t acc = 0;
    int nacc = 0, pad = 0;
    for (size_t i = 0; i < text_len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
            continue;
        if (c == '=') {
            pad++;
            continue;
        }
        int v = b64_val(c);
        if (v < 0 || pad) {     /* a foreign character, or data after padding */
            free(b);
            return RLAI_ERR_FORMAT;
        }
        acc = acc << 6 | (uint32_t)v;
        if (++nacc == 4) {
            b[o++] = (uint8_t)(acc >> 16);
            b[o++] = (uint8_t)(acc >> 8);
            b[o++] = (uint8_t)acc;
            acc = 0;
            nacc = 0;
        }
    }
    if (nacc == 1 || pad > 2 || (pad && nacc + pad != 4)) {
        free(b);
        return RLAI_ERR_FORMAT;
    }
    if (nacc == 2)
        b[o++] = (uint8_t)(acc >> 4);
    else if (nacc == 3) {
        b[o++] = (uint8_t)(acc >> 10);
        b[o++] = (uint8_t)(acc >> 2);
    }
    if (max_out && o > max_out) {
        free(b);
        return RLAI_ERR_TOO_LARGE;
    }
    *out = b;
    *len = o;
    return 0;
}
