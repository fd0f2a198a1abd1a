/* chat.h - chat prompt formatting from the model's tokenizer.chat_template.
 * The Jinja template is not executed; it is recognised by its markers
 * (ChatML "<|im_start|>", Llama-3 "<|start_header_id|>", Gemma
 * "<start_of_turn>") and the matching format is produced in C. Unknown or
 * absent templates fall back to ChatML. */
#ifndef RLAI_CHAT_H
#define RLAI_CHAT_H

#include <stddef.h>
#include <stdbool.h>
#include "rlai/engine.h"

typedef enum rlai_chat_style {
    RLAI_CHAT_CHATML = 0,
    RLAI_CHAT_LLAMA3 = 1,
    RLAI_CHAT_GEMMA = 2,
} rlai_chat_style;

/* Detects the style from template text (may be NULL/len 0 -> ChatML). */
rlai_chat_style rlai_chat_detect(const char *tmpl, size_t len);
const char *rlai_chat_style_name(rlai_chat_style s);

/* Extracts a default system prompt the template injects when the first
 * message is not a system message (SmolLM2's "You are a helpful AI
 * assistant named SmolLM, ..."), if the template has one in the
 * `'<|im_start|>system\n...<|im_end|>` shape. Returns a malloc'd string
 * (caller frees) or NULL. */
char *rlai_chat_default_system(const char *tmpl, size_t len);

/* Formats msgs into a malloc'd NUL-terminated string (*out, caller frees).
 * default_system may be NULL. Gemma has no system role: a system message is
 * prepended to the first user turn. Roles other than system/user/assistant
 * (and "tool" for ChatML) are RLAI_ERR_INVALID_ARG. */
int rlai_chat_format(rlai_chat_style style, const char *default_system,
                     const rlai_chat_message *msgs, int n, bool add_generation_prompt,
                     char **out);

/* A span of the rendered text: template text (its special-token markers
 * are parsed as special tokens) or message content (never parsed). The
 * spans of rlai_chat_render cover the text in order, without gaps. The
 * default system prompt and Gemma's folded system text count as content. */
typedef struct rlai_chat_seg {
    size_t off, len;
    bool content;
} rlai_chat_seg;

/* As rlai_chat_format, and *segs receives a malloc'd array (caller frees;
 * NULL with *n_segs 0 for empty text) of the spans of *out. */
int rlai_chat_render(rlai_chat_style style, const char *default_system,
                     const rlai_chat_message *msgs, int n, bool add_generation_prompt,
                     char **out, rlai_chat_seg **segs, int *n_segs);

#endif
