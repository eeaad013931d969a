// Greedy steps on a llama.cpp context without a Python call per token: the argmax of logits rows,
// read in place from llama.cpp's buffer, and runs of one-token greedy decode steps. Loaded by
// moespec/backends/llama_steps.py, which compiles this file on first use and hands it the two
// llama.cpp functions it calls (`moespec_steps_init`), taken from the libllama llama-cpp-python
// loaded, so no second copy of the library is mapped; the declarations below are the part of
// llama-cpp-python 0.3.36's llama.h those functions use.
#include <math.h>
#include <stdint.h>
#include <time.h>

struct llama_context;
typedef struct llama_batch {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} llama_batch;

static int32_t (*llama_decode)(struct llama_context *ctx, llama_batch batch);
static float *(*llama_get_logits_ith)(struct llama_context *ctx, int32_t i);

void moespec_steps_init(void *decode, void *get_logits_ith) {
    llama_decode = (int32_t (*)(struct llama_context *, llama_batch))decode;
    llama_get_logits_ith = (float *(*)(struct llama_context *, int32_t))get_logits_ith;
}

enum { STEPS_OK = 0, STEPS_NO_ROW = -1, STEPS_NOT_FINITE = -2, STEPS_BAD_ROW = 1000000 };

// The first index of the largest of row[0..limit); -1 when that largest is not finite (NaN counts as largest).
static int32_t row_argmax(const float *row, int32_t limit) {
    int32_t best = 0;
    float top = row[0];
    if (isnan(top)) return -1;
    for (int32_t i = 1; i < limit; i++) {
        float v = row[i];
        if (isnan(v)) return -1;
        if (v > top) { top = v; best = i; }
    }
    return isfinite(top) ? best : -1;
}

// out[j] = argmax over the first `limit` ids of output row first + j, j < n. 0, or a STEPS_* code
// with *failed_row set to the row that failed.
int32_t moespec_rows_argmax(struct llama_context *ctx, int32_t first, int32_t n, int32_t limit, int32_t *out,
                            int32_t *failed_row) {
    for (int32_t j = 0; j < n; j++) {
        const float *row = llama_get_logits_ith(ctx, first + j);
        if (row == NULL) { *failed_row = first + j; return STEPS_NO_ROW; }
        out[j] = row_argmax(row, limit);
        if (out[j] < 0) { *failed_row = first + j; return STEPS_NOT_FINITE; }
    }
    return STEPS_OK;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A drafter's stop rule for a run of greedy steps (moespec.backends.protocol.StepStop): after each
// produced token, 1 when the drafter could propose from the context that token ends, else 0.
// seen[0..W): a token already marked stops; every produced token is marked. pool[0..pool_size)
// with tail[0..n-1): ngram-mod's uint64 fold res = res * 6364136223846793005 + t over tail and the
// token, modulo pool_size, indexes pool; an entry >= 0 stops; the tail then slides by the token.
static int stop_after(uint8_t *seen, const int32_t *pool, uint64_t pool_size, int32_t n, int32_t *tail,
                      int32_t token) {
    int stop = 0;
    if (seen != NULL) {
        stop = seen[token];
        seen[token] = 1;
    }
    if (pool != NULL) {
        uint64_t res = 0;
        for (int32_t i = 0; i + 1 < n; i++) res = res * 6364136223846793005ULL + (uint64_t)tail[i];
        res = res * 6364136223846793005ULL + (uint64_t)token;
        stop |= pool[res % pool_size] >= 0;
        for (int32_t i = 0; i + 2 < n; i++) tail[i] = tail[i + 1];
        if (n > 1) tail[n - 2] = token;
    }
    return stop;
}

// Greedy decode steps on sequence `seq` of a batch of room >= 1: feed `token` at position `pos`, take
// the argmax of its row as the next token, feed that, ... `steps` times, stopping after a token
// listed in eos[0..n_eos) or one the stop rule (seen, pool: `stop_after`; both NULL: none) marks.
// out[i]: the token step i produced; seconds[i]: its time. Returns the
// steps done (the last produced token is not fed), or -(1 + i) when llama_decode failed at step i
// (code in *status), or -(STEPS_BAD_ROW + i) when step i's row had no finite maximum (or none).
int32_t moespec_greedy_steps(struct llama_context *ctx, llama_batch batch, int32_t seq, int32_t token, int32_t pos,
                             int32_t steps, int32_t limit, const int32_t *eos, int32_t n_eos, uint8_t *seen,
                             const int32_t *pool, uint64_t pool_size, int32_t n, int32_t *tail, int32_t *out,
                             double *seconds, int32_t *status) {
    for (int32_t i = 0; i < steps; i++) {
        double t0 = now();
        batch.n_tokens = 1;
        batch.token[0] = token;
        batch.pos[0] = pos + i;
        batch.n_seq_id[0] = 1;
        batch.seq_id[0][0] = seq;
        batch.logits[0] = 1;
        *status = llama_decode(ctx, batch);
        if (*status != 0) return -(1 + i);
        const float *row = llama_get_logits_ith(ctx, -1);
        if (row == NULL) return -(STEPS_BAD_ROW + i);
        token = row_argmax(row, limit);
        if (token < 0) return -(STEPS_BAD_ROW + i);
        out[i] = token;
        int stop = stop_after(seen, pool, pool_size, n, tail, token);
        seconds[i] = now() - t0;
        for (int32_t e = 0; e < n_eos; e++) {
            if (eos[e] == token) return i + 1;
        }
        if (stop) return i + 1;
    }
    return steps;
}

// Greedy decode steps on n_seq sequences at once (a batch of room >= n_seq): step i feeds tokens[j] at
// position pos[j] + i of sequence seqs[j] for every j in one llama_decode, then takes the argmax of
// each sequence's row as its next token. out[i * n_seq + j]: the token step i produced for j;
// seconds[i]: step i's time. Stops after a step where some sequence produced a token listed in
// eos[0..n_eos). Returns the steps done (the last produced tokens are not fed), or -(1 + i) when
// llama_decode failed at step i (code in *status), or -(STEPS_BAD_ROW + i * n_seq + j) when step i's
// row of sequence j had no finite maximum (or none).
int32_t moespec_batch_greedy_steps(struct llama_context *ctx, llama_batch batch, int32_t n_seq, const int32_t *seqs,
                                   int32_t *tokens, const int32_t *pos, int32_t steps, int32_t limit,
                                   const int32_t *eos, int32_t n_eos, int32_t *out, double *seconds,
                                   int32_t *status) {
    for (int32_t i = 0; i < steps; i++) {
        double t0 = now();
        batch.n_tokens = n_seq;
        for (int32_t j = 0; j < n_seq; j++) {
            batch.token[j] = tokens[j];
            batch.pos[j] = pos[j] + i;
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = seqs[j];
            batch.logits[j] = 1;
        }
        *status = llama_decode(ctx, batch);
        if (*status != 0) return -(1 + i);
        int stop = 0;
        for (int32_t j = 0; j < n_seq; j++) {
            const float *row = llama_get_logits_ith(ctx, j);
            int32_t token = row == NULL ? -1 : row_argmax(row, limit);
            if (token < 0) return -(STEPS_BAD_ROW + i * n_seq + j);
            out[i * n_seq + j] = tokens[j] = token;
            for (int32_t e = 0; e < n_eos; e++) {
                if (eos[e] == token) stop = 1;
            }
        }
        seconds[i] = now() - t0;
        if (stop) return i + 1;
    }
    return steps;
}
