/*
 * data: training text as token ids, and the deterministic choice of each chunk's sequences.
 *
 * Two formats are read: llm.c token shards (a 256 x int32 header with [0] = 20240520,
 * [1] = 1, [2] = ntokens, then ntokens uint16 tokens; the file size must match the header)
 * and anything else as raw text with byte-level tokens (vocab 256).  A directory is read
 * as all its non-hidden files in name order, concatenated; they must all be of one format.
 * The path must be a regular file or a directory whose non-hidden entries are all regular
 * files (symbolic links to them count): a FIFO, a device, a socket or a subdirectory is
 * refused with its name (ZS_ERR_INVALID), and nothing is opened in a way that could block.
 *
 * Invariant: the sequences of chunk c of step s are a pure function of (seed, s, c) and the
 * data, never of how many processes or threads run.
 */
#ifndef ZS_DATA_H
#define ZS_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define ZS_LLMC_MAGIC 20240520
#define ZS_LLMC_VERSION 1
#define ZS_LLMC_HEADER_INTS 256

typedef enum { ZS_DATA_TEXT = 0, ZS_DATA_LLMC = 1 } zs_data_kind;

typedef struct {
    zs_data_kind kind;
    uint16_t *tokens; /* ntokens ids */
    size_t ntokens;
    int max_token; /* the largest id present */
    int n_files;
    uint64_t fingerprint; /* FNV-1a over the kind and the tokens: equal data, equal value */
} zs_dataset;

/* Reads a file or a directory (see above). */
zs_err zs_data_open(const char *path, zs_dataset *ds);
void zs_data_close(zs_dataset *ds);

/* ZS_OK when every token id is below vocab_size and there are at least t + 1 tokens. */
zs_err zs_data_check(const zs_dataset *ds, int vocab_size, int t);

/*
 * The b sequences of chunk `chunk` of step `step`: inputs[j*t .. j*t+t) are t consecutive
 * tokens from a position drawn from (seed, step, chunk, j), targets the same shifted by one.
 */
void zs_data_chunk(const zs_dataset *ds, uint64_t seed, long step, int chunk, int b, int t,
                   int32_t *inputs, int32_t *targets);

/* Evaluation sequence i: tokens [i*t, i*t+t) and [i*t+1, i*t+t+1).  Returns the number of
 * whole sequences the data holds: (ntokens - 1) / t. */
size_t zs_data_eval_count(const zs_dataset *ds, int t);
void zs_data_eval_seq(const zs_dataset *ds, size_t i, int t, int32_t *inputs, int32_t *targets);

/* Writes tokens as an llm.c shard (for tools and tests). */
zs_err zs_data_write_llmc(const char *path, const uint16_t *tokens, size_t ntokens);

#endif
