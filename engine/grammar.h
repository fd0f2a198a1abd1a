/* grammar.h - engine side of grammar-constrained sampling (rlai/grammar.h).
 *
 * rlai_gvocab: every token's bytes, computed once per engine, arranged as
 * two pre-order byte tries (all tokens; tokens that are not plain string
 * text) plus a bitset of "plain" tokens (printable ASCII without '"' and
 * '\'), which inside an unbounded JSON string are accepted without a walk.
 *
 * The token mask of a matcher state is computed by walking the trie with
 * the pushdown automaton, sharing the work of common prefixes and pruning
 * a subtree at its first rejected byte.
 */
#ifndef RLAI_ENGINE_GRAMMAR_H
#define RLAI_ENGINE_GRAMMAR_H

#include <stdint.h>
#include "rlai/grammar.h"
#include "tokenizer.h"

typedef struct rlai_gvocab rlai_gvocab;

/* Builds the vocabulary index from a tokenizer (pieces rendered without
 * special text: control tokens have no bytes and are never allowed, except
 * end-of-generation tokens once the grammar is complete). *out owned by the
 * caller; free with rlai_gvocab_free (accepts NULL). */
int rlai_gvocab_new(const rlai_tokenizer *t, rlai_gvocab **out);
void rlai_gvocab_free(rlai_gvocab *v);
int rlai_gvocab_n_vocab(const rlai_gvocab *v);

/* Words of a token bitset for the vocabulary: (n_vocab + 31) / 32. */
int rlai_gvocab_mask_words(const rlai_gvocab *v);

/* Writes the allowed-token bitset of m's state into mask (caller-owned,
 * rlai_gvocab_mask_words words; bit t of word t/32). Returns the number of
 * allowed tokens (0: nothing can follow, which a complete grammar never
 * reaches) or RLAI_ERR_NOMEM. The matcher's scratch memory is reused, so
 * one matcher is used by one thread at a time. */
int rlai_grammar_matcher_mask(rlai_grammar_matcher *m, const rlai_gvocab *v, uint32_t *mask);
/* Same result by feeding every token on its own (reference for tests). */
int rlai_grammar_matcher_mask_slow(rlai_grammar_matcher *m, const rlai_gvocab *v, uint32_t *mask);
/* Advances over token tok (its bytes; an end-of-generation token is
 * accepted only when the state can end and leaves it unchanged). Returns 0
 * or RLAI_ERR_INVALID_ARG (not allowed; state unchanged) / RLAI_ERR_NOMEM. */
int rlai_grammar_matcher_accept_token(rlai_grammar_matcher *m, const rlai_gvocab *v, int32_t tok);

#endif
