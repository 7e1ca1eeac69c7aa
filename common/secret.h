/*
 * secret: the job secret that every member of a job proves it holds, and the keys derived
 * from it (docs/security.md has the threat model).
 *
 * A secret file holds 32 random bytes as 64 lowercase hex digits and a newline, mode 0600
 * (`zshard keygen FILE` writes one).  A reader refuses a file that is not a regular file, that
 * others than its owner may read or write, or whose contents are not exactly that; the message
 * names the file and the reason, never the bytes.
 *
 * Nothing uses the secret itself on a wire: each purpose gets its own 32-byte key, a keyed
 * BLAKE2b of the purpose's name (zs_secret_derive), so that knowing one derived key (the
 * control plane's CURVE keys) tells nothing about another.
 *
 * A zs_secret with insecure set holds no key: every plane then runs without authentication,
 * which a role does only when told so explicitly (--insecure) and says in its log.
 */
#ifndef ZS_SECRET_H
#define ZS_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define ZS_SECRET_BYTES 32
#define ZS_SECRET_ENV "ZSHARD_SECRET_FILE" /* where a role looks when --secret is not given */

typedef struct {
    int insecure;                 /* 1: no secret, no authentication anywhere */
    uint8_t key[ZS_SECRET_BYTES]; /* the job secret (all zero when insecure) */
    char path[512];               /* the file it came from, for messages ("" when insecure) */
} zs_secret;

/* Writes a new secret to path (created: an existing file is never overwritten), mode 0600,
 * durably (fsync of the file and its directory). */
zs_err zs_secret_generate(const char *path);

/* Reads and checks the secret file at path into *out. */
zs_err zs_secret_load(const char *path, zs_secret *out);

/* The secret a role runs with: none when insecure is set (which overrides ZS_SECRET_ENV), else
 * the file `path` (NULL: the one ZS_SECRET_ENV names).  Giving both a path and insecure, or
 * nothing at all, is ZS_ERR_INVALID with a message saying what to give. */
zs_err zs_secret_resolve(const char *path, int insecure, zs_secret *out);

/* out = BLAKE2b-256 keyed with the secret, of the purpose's name ("zshard/ctrl/curve-server").
 * Different purposes give independent keys.  The secret must not be insecure. */
void zs_secret_derive(const zs_secret *s, const char *purpose, uint8_t out[32]);

/* Overwrites the key (before freeing or leaving scope). */
void zs_secret_wipe(zs_secret *s);

/* Initialises libsodium once (thread-safe, cheap after the first call); ZS_ERR_INTERNAL if
 * it cannot (no entropy source). */
zs_err zs_sodium_init(void);

#endif
