/* bench_spec.c - speculative decoding (prompt-lookup / n-gram drafting) at
 * batch 1 against plain decoding, measured in the same run.
 *
 *   bench_spec [--model FILE] [--threads N] [--tokens N] [--reps R]
 *              [--max-draft N] [--spec-max-batch N] [--ignore-eos] [--show]
 *              [--draft-model FILE] [--lookup-min N] [--device auto|cpu|cuda]
 *
 * With --draft-model the speculative mode measured is DRAFT (the draft
 * model proposes; its forwards are part of the timed decode) instead of
 * NGRAM; the columns keep the name "ngram" in the code below but are
 * printed with the mode's name. In DRAFT, steps whose context repeats an
 * earlier passage of at least --lookup-min tokens (the engine's
 * spec_lookup_min: 0 = its default, -1 = never) draft by prompt lookup;
 * the "lookup" column counts those drafted tokens.
 *
 * Five cases of three chat prompts each, formatted with the model's chat
 * template (rlai_engine_tokenize_chat): (a) LoreMaster dialogue turns (lore
 * in the system prompt, the player asks about people and factions of it),
 * (b) quoting or summarising a passage given in the prompt, (c) code
 * editing (rename a C variable, add a Python docstring, change two values
 * of a JSON file; each returns the whole text), (d) free chat with nothing
 * to copy, (e) structured output: extraction into a JSON schema, the
 * answer held to it by the grammar (not one of issue 14's four cases; it
 * shows drafting under a grammar). One prompt per case made a case's figure hang on one greedy
 * trajectory of a small model: a last-bit change of an activation once
 * turned (a)'s reply from a repetitive one (2.3x) into one that copies
 * little (1.1x). Each prompt runs greedy (temperature 0) with speculation
 * OFF and NGRAM, interleaved (OFF, NGRAM, OFF, NGRAM, ...; R runs each) so
 * machine noise falls on both, after one unmeasured warm-up run. The first
 * table shows each prompt's median decode tok/s of each mode (the engine's
 * own decode_tps: tokens after the first / time after the first), the
 * speedup, and the draft figures of the NGRAM runs; the last one each
 * case's: its prompts' decode tokens over their decode time in each rep,
 * the median over reps, and the target.
 *
 * The bench drives rlai_engine_step() itself so it can count decode steps
 * (forward passes after the one that samples the first token): tok/step is
 * tokens emitted per decode step, draft/step is drafted tokens per decode
 * step -- steps that did not draft (no n-gram match, or paused by the
 * adaptive length) count too, so the mean draft length of the steps that
 * did draft is at least that. The engine's metrics do not say how many
 * steps drafted.
 *
 * --predict gives each speculative run a prediction of its output
 * (OpenAI's predicted outputs, what an editor sends with an edit request):
 * the text of the prompt's fenced code block, for the prompts that have
 * one (the (c) cases). The plain runs are unchanged. --predict-output
 * gives each prompt's speculative runs the text of its first plain run
 * instead: a prediction that is exactly right, the upper bound of what a
 * prediction (or any drafter) can give on this machine.
 *
 * --temp T samples instead, with the product's default filters (top-k 40,
 * top-p 0.95, min-p 0.05; docs/DEFAULTS.md) and a fixed seed: a seeded
 * request's output is the same with and without speculation (the coupled
 * verification rule, engine/sampler.h), so the check below holds too.
 *
 * Greedy output must be token-for-token the same with and without
 * speculation (batch-invariant kernels): every run of a case is compared
 * with the first OFF run; any difference is printed and the exit status
 * is 1. --show prints each case's greedy output after the tables. */
#include "rlai/engine.h"
#include "rlai/grammar.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define MAX_REPS 64

/* ------------------------------------------------------------ the cases */

/* (a) LoreMaster-style system prompt: world lore, then the persona. */
static const char LORE_SYSTEM[] =
    "This is the world of Harrowmere, a fishing town on the cold northern coast of the Grey Sea.\n\n"
    "Harrowmere was founded two hundred years ago by salt traders who followed the herring shoals "
    "south from the Iron Isles. The town climbs a steep hill above the harbour: the fish market and "
    "the boat sheds sit at the bottom, the Lantern Inn halfway up, and the old watchtower of Saint "
    "Orrin at the top, where a fire is still lit on stormy nights to guide the boats home.\n\n"
    "Factions:\n"
    "- The Net Guild: the fishing families who own the boats and set the price of herring. Their "
    "master is Tobias Wren, a broad, quiet man who lost two fingers to a winch.\n"
    "- The Tower Wardens: six volunteers who keep the watchtower fire. They answer to Elsbeth Marrow, "
    "the oldest woman in Harrowmere, who has kept the fire for forty-one winters.\n"
    "- The Saltworks Company: merchants from the capital who bought the salt pans east of town last "
    "spring and want the harbour deepened for their barges.\n\n"
    "Places:\n"
    "- The Lantern Inn: run by Mara Quill and her brother Jory. Fishermen drink there after the "
    "evening tide; the back room is where the Net Guild meets on the first night of every month.\n"
    "- The Drowned Chapel: a ruined chapel on the rocks below the tower, cut off at high tide. People "
    "say the bell still rings when a boat is lost.\n"
    "- The Saltworks: the salt pans and the new stone warehouse east of the harbour, guarded at night "
    "by men the Company brought from the capital.\n\n"
    "Recent events: three weeks ago the boat Silver Gull did not come back from the herring grounds. "
    "Its captain, Aldous Fenn, was Tobias Wren's cousin. Elsbeth Marrow swears the tower fire was lit "
    "that night, but two of the Wardens say they found it cold at midnight. Since then the Saltworks "
    "Company has offered to buy the boats of any family that wants to leave.\n\n"
    "You are Mara Quill, the keeper of the Lantern Inn.\n"
    "You are warm, sharp-eyed and you hear everything that is said in your inn. You trust Tobias Wren, "
    "you respect Elsbeth Marrow, and you do not trust the men from the Saltworks Company.\n\n"
    "How you speak: plainly, like a tavern keeper, in the first person, using the names of the people "
    "and places of Harrowmere.\n\n"
    "Rules:\n"
    "- Stay in character.\n"
    "- Only tell what a person of Harrowmere would know.";

static const char LORE_USER[] =
    "Mara, tell me everything you know about Elsbeth Marrow and the night the Silver Gull was lost.";
static const char LORE_USER2[] =
    "Who is Tobias Wren, and why does the Net Guild meet in the back room of your inn?";
static const char LORE_USER3[] =
    "What do the fishermen in the Lantern Inn say about the Saltworks Company and its offer to buy "
    "their boats?";

/* (b) quoting and summarising a passage given in the prompt. */
#define PASSAGE                                                                                          \
    "The lighthouse at Carrow Point was built in 1821 from granite quarried on the headland itself. "  \
    "For most of its life it was kept by a single family, the Pellows, who lived in the cottage at "    \
    "its foot and rowed to the village once a week for bread and oil.\n\n"                              \
    "In the winter of 1887 a storm tore the lantern glass from its frame and the light went dark for " \
    "three nights. Hannah Pellow, who was sixteen, climbed the tower every hour with a ship's lamp "   \
    "and held it in the empty frame until her hands froze, and no ship was lost on the point that "    \
    "winter.\n\n"                                                                                       \
    "The light was automated in 1954 and the last keeper left the cottage the following spring. "      \
    "Today the tower belongs to a trust that opens it to visitors on summer weekends.\n\n"

static const char QUOTE_USER[] = "Read this passage.\n\n" PASSAGE "Quote the second paragraph exactly, word for word.";
static const char QUOTE_USER2[] =
    "Read this passage.\n\n" PASSAGE "Summarise the passage in a few sentences, keeping its names and dates.";
static const char QUOTE_USER3[] =
    "Here is a notice from the harbour office.\n\n"
    "NOTICE TO ALL BOAT OWNERS\n"
    "1. Boats must be moored inside the breakwater from the first of November until the end of March.\n"
    "2. No boat may leave the harbour when the red flag is flying on the tower.\n"
    "3. Every boat must carry two lamps, a horn and a rope of at least twenty fathoms.\n"
    "4. Nets left on the quay overnight will be taken to the harbour office.\n"
    "5. Harbour dues are paid on the first day of each month at the harbour office.\n"
    "Signed, Peter Hale, Harbour Master.\n\n"
    "Copy the five rules of this notice exactly, then say who signed it.";

/* (c) code editing: about 40 lines of C using a variable x. */
static const char CODE_USER[] =
    "Here is a C function.\n\n"
    "```c\n"
    "int count_words(const char *text, int min_len, int *longest)\n"
    "{\n"
    "    int x = 0;\n"
    "    int len = 0;\n"
    "    int best = 0;\n"
    "\n"
    "    if (text == NULL) {\n"
    "        if (longest)\n"
    "            *longest = 0;\n"
    "        return 0;\n"
    "    }\n"
    "    for (const char *p = text;; p++) {\n"
    "        char c = *p;\n"
    "        int is_letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');\n"
    "        if (is_letter) {\n"
    "            len++;\n"
    "            continue;\n"
    "        }\n"
    "        if (len >= min_len && len > 0) {\n"
    "            x++;\n"
    "            if (len > best)\n"
    "                best = len;\n"
    "        }\n"
    "        len = 0;\n"
    "        if (c == '\\0')\n"
    "            break;\n"
    "    }\n"
    "    if (longest)\n"
    "        *longest = best;\n"
    "    if (x == 0)\n"
    "        return 0;\n"
    "    printf(\"found %d words, the longest has %d letters\\n\", x, best);\n"
    "    return x;\n"
    "}\n"
    "```\n\n"
    "Rename the variable x to count and return the full function.";

/* (c) more code editing: add a docstring to a Python function; change a
 * value in a JSON configuration. */
static const char CODE_USER2[] =
    "Add a docstring to this Python function and return the whole function.\n\n"
    "```python\n"
    "def merge_intervals(intervals):\n"
    "    if not intervals:\n"
    "        return []\n"
    "    intervals = sorted(intervals, key=lambda iv: iv[0])\n"
    "    merged = [list(intervals[0])]\n"
    "    for start, end in intervals[1:]:\n"
    "        last = merged[-1]\n"
    "        if start <= last[1]:\n"
    "            last[1] = max(last[1], end)\n"
    "        else:\n"
    "            merged.append([start, end])\n"
    "    return [tuple(iv) for iv in merged]\n"
    "```";
static const char CODE_USER3[] =
    "Change the port to 8080 and the log level to \"debug\" in this configuration, and return the "
    "whole file.\n\n"
    "```json\n"
    "{\n"
    "  \"server\": {\n"
    "    \"host\": \"127.0.0.1\",\n"
    "    \"port\": 5000,\n"
    "    \"workers\": 4,\n"
    "    \"timeout_seconds\": 30\n"
    "  },\n"
    "  \"logging\": {\n"
    "    \"level\": \"info\",\n"
    "    \"file\": \"/var/log/app/server.log\",\n"
    "    \"rotate_megabytes\": 50\n"
    "  },\n"
    "  \"database\": {\n"
    "    \"url\": \"postgres://app@localhost/app\",\n"
    "    \"pool_size\": 10\n"
    "  }\n"
    "}\n"
    "```";

/* (d) free chat: nothing in the prompt to copy. */
static const char FREE_USER[] = "Tell me about your favourite season.";
static const char FREE_USER2[] = "What should I cook for dinner tonight? Give me one idea.";
static const char FREE_USER3[] = "Why is the sky blue? Explain it simply.";

/* (e) structured output: extraction into a JSON schema, the answer held
 * to the schema by the grammar (docs/STRUCTURED.md) */
static const char JSON_SYSTEM[] = "You reply with JSON only.";
static const char JSON_USER[] =
    "Copy the title and the first sentence of this notice into JSON.\n\n"
    "Title: Harbour closing hours\n"
    "The harbour gates of Port Elsmere close at nine in the evening from the first of October until the end "
    "of March. Boats that arrive later must wait at the outer buoy.";
static const char JSON_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"first_sentence\":{\"type\":"
    "\"string\"}},\"required\":[\"title\",\"first_sentence\"],\"additionalProperties\":false}";
static const char JSON_USER2[] =
    "Fill in a character sheet in JSON for the person in this text. Copy the description word for word.\n\n"
    "Mira Calloway is the blacksmith of Oakvale. She forged the silver key that opens the north gate, and she "
    "never speaks of the night the old forge burned down.";
static const char JSON_SCHEMA2[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"home\":{\"type\":\"string\"},"
    "\"trade\":{\"type\":\"string\"},\"description\":{\"type\":\"string\"}},\"required\":[\"name\",\"home\","
    "\"trade\",\"description\"],\"additionalProperties\":false}";
static const char JSON_USER3[] =
    "Turn this inventory list into JSON, one object per line, copying each note exactly.\n\n"
    "- Iron sword, 1, chipped near the hilt\n"
    "- Healing potion, 3, brewed by the witch of Fen Hollow\n"
    "- Rope, 2, fifty feet each\n"
    "- Lantern, 1, needs oil before nightfall";
static const char JSON_SCHEMA3[] =
    "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\","
    "\"properties\":{\"name\":{\"type\":\"string\"},\"count\":{\"type\":\"integer\"},\"note\":{\"type\":"
    "\"string\"}},\"required\":[\"name\",\"count\",\"note\"],\"additionalProperties\":false}}},"
    "\"required\":[\"items\"],\"additionalProperties\":false}";

typedef struct bench_case {
    const char *name;
    const char *system;   /* NULL: the template's default */
    const char *user;
    const char *schema;   /* NULL: free text; else the answer's JSON schema */
} bench_case;

/* Three prompts per case; a name starts with its case's letter and the
 * prompt's number (the id written by --dump). */
static const bench_case CASES[] = {
    { "a1 lore Elsbeth", LORE_SYSTEM, LORE_USER, NULL },
    { "a2 lore Tobias", LORE_SYSTEM, LORE_USER2, NULL },
    { "a3 lore Company", LORE_SYSTEM, LORE_USER3, NULL },
    { "b1 quote para", NULL, QUOTE_USER, NULL },
    { "b2 summarise", NULL, QUOTE_USER2, NULL },
    { "b3 copy notice", NULL, QUOTE_USER3, NULL },
    { "c1 rename C var", NULL, CODE_USER, NULL },
    { "c2 py docstring", NULL, CODE_USER2, NULL },
    { "c3 json edit", NULL, CODE_USER3, NULL },
    { "d1 season", NULL, FREE_USER, NULL },
    { "d2 dinner", NULL, FREE_USER2, NULL },
    { "d3 sky blue", NULL, FREE_USER3, NULL },
    { "e1 json notice", JSON_SYSTEM, JSON_USER, JSON_SCHEMA },
    { "e2 json sheet", JSON_SYSTEM, JSON_USER2, JSON_SCHEMA2 },
    { "e3 json items", JSON_SYSTEM, JSON_USER3, JSON_SCHEMA3 },
};
#define PROMPTS_PER_CASE 3
#define N_CASES ((int)(sizeof(CASES) / sizeof(CASES[0])))

/* ------------------------------------------------------------ one run */

typedef struct run_result {
    rlai_token *toks;     /* generated ids (EOG not included) */
    int n, cap;
    bool done;
    int status;
    int decode_steps;     /* steps after the one that sampled the first token */
    rlai_gen_metrics m;
} run_result;

static int on_token(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)text;
    (void)len;
    run_result *r = user;
    if (tok >= 0 && r->n < r->cap)
        r->toks[r->n++] = tok;
    return 0;
}

static void on_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    run_result *r = user;
    r->done = true;
    r->status = status;
    r->m = *m;
}

static float g_temp;   /* --temp: 0 = greedy */
static int g_predict;  /* 1: --predict (fenced block), 2: --predict-output */

/* The text inside the first ``` fenced block of s (after the opening
 * line), malloc'd; NULL when there is none. */
static char *fenced_block(const char *s)
{
    const char *a = strstr(s, "```");
    const char *nl = a ? strchr(a, '\n') : NULL;
    const char *b = nl ? strstr(nl + 1, "```") : NULL;
    if (!b)
        return NULL;
    size_t n = (size_t)(b - (nl + 1));
    char *t = malloc(n + 1);
    if (t) {
        memcpy(t, nl + 1, n);
        t[n] = 0;
    }
    return t;
}

/* Generates from `prompt` with the given spec mode, stepping the engine
 * here so decode steps can be counted. r->toks must hold r->cap ids. */
static int run_once(rlai_engine *e, const rlai_token *prompt, int n_prompt, const rlai_grammar *g,
                    rlai_spec_mode spec, const char *prediction, int max_tokens, bool ignore_eos, run_result *r)
{
    r->n = 0;
    r->done = false;
    r->status = 0;
    r->decode_steps = 0;
    memset(&r->m, 0, sizeof(r->m));
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rlai_gen_params_init(&rp.gen);
    rp.gen.sampling.temperature = g_temp;   /* 0: greedy */
    if (g_temp > 0) {
        rp.gen.sampling.top_k = 40;
        rp.gen.sampling.top_p = 0.95f;
        rp.gen.sampling.min_p = 0.05f;
        rp.gen.sampling.seed = 1234;
    }
    rp.gen.max_tokens = max_tokens;
    rp.gen.ignore_eos = ignore_eos;
    rp.gen.spec = spec;
    rp.gen.prediction = prediction;
    rp.gen.grammar = g;
    rp.on_token = on_token;
    rp.on_done = on_done;
    rp.user = r;
    int rc = rlai_engine_submit(e, &rp, NULL);
    if (rc < 0)
        return rc;
    bool first_seen = false;
    while (!r->done) {
        bool decode = first_seen;
        rc = rlai_engine_step(e);
        if (rc < 0 && !r->done)
            return rc;
        if (decode)
            r->decode_steps++;
        if (r->n > 0)
            first_seen = true;
    }
    return r->status;
}

/* ------------------------------------------------------------ helpers */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[MAX_REPS];
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void min_max(const double *v, int n, double *lo, double *hi)
{
    *lo = *hi = v[0];
    for (int i = 1; i < n; i++) {
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
}

/* Index of the first token where a and b differ, or -1 when identical. */
static int first_difference(const run_result *a, const run_result *b)
{
    int n = a->n < b->n ? a->n : b->n;
    for (int i = 0; i < n; i++)
        if (a->toks[i] != b->toks[i])
            return i;
    return a->n == b->n ? -1 : n;
}

static void cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *c = strchr(line, ':');
        if (!c)
            break;
        c++;
        while (*c == ' ' || *c == '\t')
            c++;
        snprintf(buf, cap, "%s", c);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

static void load_average(char *buf, size_t cap)
{
    snprintf(buf, cap, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f)
        return;
    double l1, l5, l15;
    if (fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) == 3)
        snprintf(buf, cap, "%.2f %.2f %.2f", l1, l5, l15);
    fclose(f);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_spec [--model FILE] [--threads N] [--tokens N] [--reps R]\n"
            "                  [--max-draft N] [--spec-max-batch N] [--ignore-eos] [--show]\n"
            "                  [--draft-model FILE]  (measure DRAFT, that model proposing, not NGRAM)\n"
            "                  [--lookup-min N]  (with --draft-model: prompt lookup from N-token matches;\n"
            "                                     0 = engine default, -1 = draft model only)\n"
            "                  [--device D]  (auto|cpu|cuda|cuda:N; default auto: CUDA when a GPU and\n"
            "                                 the CUDA module are found, else the CPU)\n"
            "                  [--temp T]  (sample at T with top-k 40, top-p 0.95, min-p 0.05, seed\n"
            "                               1234; default 0 = greedy)\n"
            "                  [--predict]  (speculative runs get the prompt's fenced code block as\n"
            "                                a prediction of the output, OpenAI's predicted outputs)\n"
            "                  [--predict-output]  (speculative runs get the plain run's own output\n"
            "                                       as the prediction: an exactly right one)\n"
            "                  [--dump FILE]   (each prompt's ids and greedy output ids, for\n"
            "                                   bench/spec_replay.py)\n"
            "defaults: models/SmolLM2-135M-Instruct.Q4_1.gguf (or $RLAI_MODEL), 2 threads, 128 tokens,\n"
            "3 reps, the engine's max draft (8) and spec max batch (2)\n");
}

/* ------------------------------------------------------------ main */

typedef struct case_stats {
    int n_prompt;
    int gen_tokens;                   /* of the first OFF run */
    double off_tps[MAX_REPS], ng_tps[MAX_REPS];
    double off_ms_step[MAX_REPS], ng_ms_step[MAX_REPS];
    int off_steps, ng_steps;          /* decode steps of the first run of each mode */
    int drafted, accepted, ng_tokens; /* of the first NGRAM run */
    int lookup;                       /* of drafted, by prompt lookup (DRAFT mode) */
    bool draft_varied;                /* later NGRAM runs drafted differently */
    int diff;                         /* first differing token (-1 = identical) */
    bool off_nondet;                  /* the OFF runs disagreed among themselves */
    char *text;                       /* output of the first OFF run (--show) */
} case_stats;

static double ms_per_step(const run_result *r)
{
    return r->decode_steps > 0 ? r->m.decode_ms / r->decode_steps : 0;
}

int main(int argc, char **argv)
{
    const char *model = getenv("RLAI_MODEL");
    if (!model)
        model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int threads = 2, tokens = 128, reps = 3, max_draft = 0, spec_max_batch = 0, lookup_min = 0;
    bool ignore_eos = false, show = false;
    const char *dump = NULL, *draft = NULL, *device = NULL;
    static const struct option opts[] = {
        { "draft-model", required_argument, 0, 'M' }, { "lookup-min", required_argument, 0, 'L' },
        { "model", required_argument, 0, 'm' },     { "threads", required_argument, 0, 't' },
        { "tokens", required_argument, 0, 'n' },    { "reps", required_argument, 0, 'r' },
        { "max-draft", required_argument, 0, 'd' }, { "spec-max-batch", required_argument, 0, 'b' },
        { "ignore-eos", no_argument, 0, 'e' },      { "show", no_argument, 0, 's' },
        { "dump", required_argument, 0, 'D' },      { "help", no_argument, 0, 'h' },
        { "temp", required_argument, 0, 'T' },      { "device", required_argument, 0, 'V' },
        { "predict", no_argument, 0, 'P' },         { "predict-output", no_argument, 0, 'O' },
        { 0, 0, 0, 0 },
    };
    int o;
    while ((o = getopt_long(argc, argv, "m:t:n:r:d:b:eshD:M:L:T:V:PO", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'n': tokens = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'd': max_draft = atoi(optarg); break;
        case 'b': spec_max_batch = atoi(optarg); break;
        case 'e': ignore_eos = true; break;
        case 's': show = true; break;
        case 'D': dump = optarg; break;
        case 'M': draft = optarg; break;
        case 'L': lookup_min = atoi(optarg); break;
        case 'T': g_temp = (float)atof(optarg); break;
        case 'V': device = optarg; break;
        case 'P': g_predict = 1; break;
        case 'O': g_predict = 2; break;
        default: usage(); return o == 'h' ? 0 : 2;
        }
    }
    if (optind < argc || threads < 1 || tokens < 2 || reps < 1 || reps > MAX_REPS || max_draft < 0 ||
        max_draft > 16 || !(g_temp >= 0 && g_temp <= 2)) {
        usage();
        return 2;
    }
    struct stat st;
    if (stat(model, &st) != 0) {
        fprintf(stderr, "bench_spec: model %s not found (run scripts/setup.sh or use --model)\n", model);
        return 1;
    }

    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = threads;
    ep.n_ctx = 2048;
    ep.device = device;                   /* NULL = auto: CUDA when a GPU and the module are there */
    ep.spec = RLAI_SPEC_OFF;              /* each request says OFF or NGRAM / DRAFT */
    ep.draft_model = draft;
    const rlai_spec_mode spec_on = draft ? RLAI_SPEC_DRAFT : RLAI_SPEC_NGRAM;
    const char *mname = draft ? "draft" : "ngram", *MNAME = draft ? "DRAFT" : "NGRAM";
    ep.spec_max_draft = max_draft;
    ep.spec_max_batch = spec_max_batch;
    ep.spec_lookup_min = lookup_min;
    rlai_engine *e;
    char err[512];
    int rc = rlai_engine_open(model, &ep, &e, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "bench_spec: %s\n", err);
        return 1;
    }
    rlai_model_info mi;
    rlai_engine_info(e, &mi);

    char cpu[256], load[64], date[64];
    cpu_model(cpu, sizeof(cpu));
    load_average(load, sizeof(load));
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", &tm);
    struct utsname un;
    if (uname(&un) != 0)
        snprintf(un.machine, sizeof(un.machine), "?");
    if (draft)
        printf("bench_spec: speculative decoding (draft model %s) vs plain decoding, batch 1\n", draft);
    else
        printf("bench_spec: speculative decoding (n-gram prompt lookup) vs plain decoding, batch 1\n");
    printf("date: %s\n", date);
    printf("machine: %s, %ld online CPUs (%s), load average at start %s\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), un.machine, load);
    printf("model: %s (%.1f MiB), kernels %s, device %s, %d threads\n", model, st.st_size / 1048576.0, mi.isa,
           mi.device, mi.n_threads);
    if (g_temp > 0)
        printf("sampled at temperature %.2f (top-k 40, top-p 0.95, min-p 0.05, seed 1234), ", g_temp);
    printf("%smax_tokens %d%s, %d reps per mode interleaved (OFF, %s, ...), medians;\n"
           "max draft %d, spec max batch %d (0 = engine default: 8 and 2)\n\n",
           g_temp > 0 ? "" : "greedy, ", tokens, ignore_eos ? ", EOS ignored" : ", stops at EOS", reps, MNAME,
           max_draft, spec_max_batch);
    fflush(stdout);

    case_stats cs[N_CASES];
    memset(cs, 0, sizeof(cs));
    int cap = tokens + 16;
    run_result ref = { malloc(sizeof(rlai_token) * (size_t)cap), 0, cap, false, 0, 0, { 0 } };
    run_result cur = { malloc(sizeof(rlai_token) * (size_t)cap), 0, cap, false, 0, 0, { 0 } };
    if (!ref.toks || !cur.toks) {
        fprintf(stderr, "bench_spec: out of memory\n");
        return 1;
    }
    int status = 0;
    FILE *df = NULL;
    if (dump && !(df = fopen(dump, "w"))) {
        fprintf(stderr, "bench_spec: %s: %s\n", dump, strerror(errno));
        return 1;
    }
    for (int c = 0; c < N_CASES && status == 0; c++) {
        rlai_chat_message msgs[2];
        int nm = 0;
        if (CASES[c].system)
            msgs[nm++] = (rlai_chat_message){ "system", CASES[c].system };
        msgs[nm++] = (rlai_chat_message){ "user", CASES[c].user };
        rlai_token *prompt = NULL;
        int n_prompt = 0;
        if ((rc = rlai_engine_tokenize_chat(e, msgs, nm, true, &prompt, &n_prompt)) < 0) {
            fprintf(stderr, "bench_spec: case %s: tokenize_chat: %s\n", CASES[c].name, rlai_strerror(rc));
            status = 1;
            break;
        }
        rlai_grammar *g = NULL;
        if (CASES[c].schema &&
            (rc = rlai_grammar_from_json_schema(CASES[c].schema, strlen(CASES[c].schema), &g, err, sizeof(err))) < 0) {
            fprintf(stderr, "bench_spec: case %s: schema: %s\n", CASES[c].name, err);
            free(prompt);
            status = 1;
            break;
        }
        char *pred = g_predict == 1 ? fenced_block(CASES[c].user) : NULL;
        case_stats *s = &cs[c];
        s->n_prompt = n_prompt;
        s->diff = -1;
        /* warm-up: faults in the weights, puts the prompt in the prefix cache
         * for every measured run alike */
        if ((rc = run_once(e, prompt, n_prompt, g, RLAI_SPEC_OFF, NULL, 8, ignore_eos, &cur)) < 0) {
            fprintf(stderr, "bench_spec: case %s: %s\n", CASES[c].name, rlai_strerror(rc));
            status = 1;
        }
        for (int rep = 0; rep < reps && status == 0; rep++) {
            for (int mode = 0; mode < 2 && status == 0; mode++) {
                bool ng = mode == 1;
                run_result *r = !ng && rep == 0 ? &ref : &cur;
                rc = run_once(e, prompt, n_prompt, g, ng ? spec_on : RLAI_SPEC_OFF, ng ? pred : NULL, tokens,
                              ignore_eos, r);
                if (rc < 0) {
                    fprintf(stderr, "bench_spec: case %s: %s\n", CASES[c].name, rlai_strerror(rc));
                    status = 1;
                    break;
                }
                if (!ng) {
                    s->off_tps[rep] = r->m.decode_tps;
                    s->off_ms_step[rep] = ms_per_step(r);
                    if (rep == 0) {
                        s->gen_tokens = r->m.gen_tokens;
                        s->off_steps = r->decode_steps;
                        if (g_predict == 2 && !pred) {   /* the prediction: this output's text */
                            int len = rlai_engine_detokenize(e, r->toks, r->n, false, NULL, 0);
                            if (len > 0 && (pred = malloc((size_t)len + 1)))
                                rlai_engine_detokenize(e, r->toks, r->n, false, pred, (size_t)len + 1);
                        }
                    } else if (first_difference(&ref, r) >= 0) {
                        s->off_nondet = true;
                    }
                } else {
                    s->ng_tps[rep] = r->m.decode_tps;
                    s->ng_ms_step[rep] = ms_per_step(r);
                    if (rep == 0) {
                        s->ng_steps = r->decode_steps;
                        s->drafted = r->m.drafted_tokens;
                        s->accepted = r->m.accepted_tokens;
                        s->lookup = r->m.lookup_tokens;
                        s->ng_tokens = r->m.gen_tokens;
                    } else if (r->m.drafted_tokens != s->drafted || r->m.accepted_tokens != s->accepted) {
                        s->draft_varied = true;
                    }
                    int d = first_difference(&ref, r);
                    if (d >= 0 && (s->diff < 0 || d < s->diff))
                        s->diff = d;
                }
            }
        }
        if (df && status == 0) {
            /* one line per prompt: its id (a1, ...), the prompt ids, '|', the output ids */
            fprintf(df, "%.*s", (int)strcspn(CASES[c].name, " "), CASES[c].name);
            for (int i = 0; i < n_prompt; i++)
                fprintf(df, " %d", (int)prompt[i]);
            fprintf(df, " |");
            for (int i = 0; i < ref.n; i++)
                fprintf(df, " %d", (int)ref.toks[i]);
            fprintf(df, "\n");
        }
        free(prompt);
        free(pred);
        rlai_grammar_unref(g);
        if (show && status == 0) {
            int len = rlai_engine_detokenize(e, ref.toks, ref.n, false, NULL, 0);
            if (len >= 0 && (s->text = malloc((size_t)len + 1)))
                rlai_engine_detokenize(e, ref.toks, ref.n, false, s->text, (size_t)len + 1);
        }
        fprintf(stderr, "bench_spec: case %s done\n", CASES[c].name);
    }
    free(ref.toks);
    free(cur.toks);
    rlai_engine_close(e);
    if (df && fclose(df) != 0 && status == 0) {
        fprintf(stderr, "bench_spec: %s: write failed\n", dump);
        status = 1;
    }
    if (status) {
        for (int c = 0; c < N_CASES; c++)
            free(cs[c].text);
        return status;
    }

    char h_tps[32], h_steps[32], h_ms[32], h_rng[32];
    snprintf(h_tps, sizeof(h_tps), "%s tok/s", mname);
    snprintf(h_steps, sizeof(h_steps), "%s steps", mname);
    snprintf(h_ms, sizeof(h_ms), "%s ms/step", mname);
    snprintf(h_rng, sizeof(h_rng), "%s tok/s min-max", mname);
    printf("%-16s %6s %6s %10s %11s %8s %8s %8s %7s %9s %10s  %s\n", "case", "prompt", "tokens", "off tok/s",
           h_tps, "speedup", "drafted", "accepted", "accept", "tok/step", "draft/step", "greedy output");
    bool any_diff = false;
    for (int c = 0; c < N_CASES; c++) {
        const case_stats *s = &cs[c];
        double off = median(s->off_tps, reps), ng = median(s->ng_tps, reps);
        char check[64];
        if (s->diff < 0)
            snprintf(check, sizeof(check), "IDENTICAL");
        else
            snprintf(check, sizeof(check), "DIFFERENT at token %d", s->diff);
        any_diff |= s->diff >= 0;
        printf("%-16s %6d %6d %10.1f %11.1f %7.2fx %8d %8d %6.1f%% %9.2f %10.2f  %s%s%s\n", CASES[c].name,
               s->n_prompt, s->gen_tokens, off, ng, off > 0 ? ng / off : 0, s->drafted, s->accepted,
               s->drafted ? 100.0 * s->accepted / s->drafted : 0.0,
               s->ng_steps ? (double)(s->ng_tokens - 1) / s->ng_steps : 0.0,
               s->ng_steps ? (double)s->drafted / s->ng_steps : 0.0, check,
               s->off_nondet ? " (OFF runs disagree among themselves)" : "",
               s->draft_varied ? " (draft counts varied between runs)" : "");
    }
    printf("\nper decode step (median over reps) and the spread of the reps:\n");
    printf("%-16s %9s %11s %12s %14s %10s %17s %19s%s\n", "case", "off steps", h_steps, "off ms/step",
           h_ms, "step cost", "off tok/s min-max", h_rng, draft ? "   lookup" : "");
    for (int c = 0; c < N_CASES; c++) {
        const case_stats *s = &cs[c];
        double off = median(s->off_ms_step, reps), ng = median(s->ng_ms_step, reps);
        double olo, ohi, nlo, nhi;
        min_max(s->off_tps, reps, &olo, &ohi);
        min_max(s->ng_tps, reps, &nlo, &nhi);
        char ro[40], rn[40];
        snprintf(ro, sizeof(ro), "%.1f-%.1f", olo, ohi);
        snprintf(rn, sizeof(rn), "%.1f-%.1f", nlo, nhi);
        char lk[24] = "";
        if (draft)
            snprintf(lk, sizeof(lk), " %8d", s->lookup);
        printf("%-16s %9d %11d %12.3f %14.3f %9.2fx %17s %19s%s\n", CASES[c].name, s->off_steps, s->ng_steps, off,
               ng, off > 0 ? ng / off : 0, ro, rn, lk);
    }
    /* Per case: its prompts' decode tokens over their decode time, rep by
     * rep (each rep runs every prompt in both modes), then the median. */
    printf("\nper case (its %d prompts together: their decode tokens over their decode time, each rep):\n",
           PROMPTS_PER_CASE);
    printf("%-6s %7s %10s %11s %8s %7s %9s  %s\n", "case", "tokens", "off tok/s", h_tps, "speedup", "accept",
           "tok/step", "issue target");
    for (char g = 'a'; g <= 'e'; g++) {
        double off_r[MAX_REPS], ng_r[MAX_REPS];
        long tok = 0, ng_tok = 0, steps = 0, drafted = 0, accepted = 0;
        for (int rep = 0; rep < reps; rep++) {
            double t_off = 0, t_ng = 0;
            long n = 0;
            for (int c = 0; c < N_CASES; c++) {
                const case_stats *s = &cs[c];
                if (CASES[c].name[0] != g || s->gen_tokens < 2 || !(s->off_tps[rep] > 0) ||
                    !(s->ng_tps[rep] > 0))
                    continue;
                t_off += (s->gen_tokens - 1) / s->off_tps[rep];
                t_ng += (s->ng_tokens - 1) / s->ng_tps[rep];
                n += s->gen_tokens - 1;
            }
            off_r[rep] = t_off > 0 ? n / t_off : 0;
            ng_r[rep] = t_ng > 0 ? n / t_ng : 0;
            tok = n;
        }
        for (int c = 0; c < N_CASES; c++) {
            if (CASES[c].name[0] != g)
                continue;
            ng_tok += cs[c].ng_tokens - 1;
            steps += cs[c].ng_steps;
            drafted += cs[c].drafted;
            accepted += cs[c].accepted;
        }
        double off = median(off_r, reps), ng = median(ng_r, reps), sp = off > 0 ? ng / off : 0;
        double want = g == 'd' ? 0.95 : 1.60;
        char target[40];
        if (g == 'e')   /* structured output: measured, not one of the cases */
            snprintf(target, sizeof(target), "none (under a JSON schema)");
        else
            snprintf(target, sizeof(target), ">= %.2fx: %s", want, sp >= want ? "met" : "NOT met");
        printf("%-6c %7ld %10.1f %11.1f %7.2fx %6.1f%% %9.2f  %s\n", g, tok, off, ng, sp,
               drafted ? 100.0 * accepted / drafted : 0.0, steps ? (double)ng_tok / steps : 0.0, target);
    }
    printf("\nspeedup = median %s tok/s / median off tok/s (decode only: tokens after the first).\n"
           "accept = accepted / drafted. tok/step = tokens emitted per decode step (1.00 without drafts);\n"
           "draft/step = drafted tokens per decode step, steps without a draft included (the mean draft\n"
           "length of the steps that drafted is at least this). step cost = %s ms/step / off ms/step%s.\n",
           mname, mname, draft ? " (draft forwards included)" : "");
    if (draft)
        printf("lookup = drafted tokens proposed by prompt lookup (spec_lookup_min %d), not the draft model.\n",
               lookup_min);
    for (int c = 0; c < N_CASES; c++) {
        if (cs[c].text)
            printf("\n--- %s: greedy output (%d tokens) ---\n%s\n", CASES[c].name, cs[c].gen_tokens, cs[c].text);
        free(cs[c].text);
    }
    if (any_diff) {
        fprintf(stderr, "bench_spec: output with speculation differs from plain decoding\n");
        return 1;
    }
    return 0;
}
