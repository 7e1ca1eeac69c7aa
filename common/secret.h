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

/*
 * The data plane's keys.  The coordinator draws a random data key when it starts and gives it
 * to the servers only; each member gets its token, a keyed hash of its id, so that a member
 * can prove its id to a server (which recomputes the token) and nothing else: knowing one's
 * own token, or the job secret, does not give another member's.
 */
#define ZS_TOKEN_BYTES 32
#define ZS_NONCE_BYTES 32

/* token = BLAKE2b-256 keyed with data_key, of "zshard/data/token" and the member id. */
void zs_token_of(const uint8_t data_key[ZS_TOKEN_BYTES], uint32_t member,
                 uint8_t token[ZS_TOKEN_BYTES]);

/* A handshake proof: BLAKE2b-256 keyed with the token, of the side ("server" or "client"), both
 * nonces and the member id.  Each side proves it knows the token for that member and this
 * exchange (the nonces), so a recorded exchange cannot be replayed. */
void zs_token_proof(const uint8_t token[ZS_TOKEN_BYTES], const char *side,
                    const uint8_t client_nonce[ZS_NONCE_BYTES],
                    const uint8_t server_nonce[ZS_NONCE_BYTES], uint32_t member,
                    uint8_t out[ZS_TOKEN_BYTES]);

/* Fills buf with n random bytes (libsodium's randombytes; zs_sodium_init first). */
void zs_random_bytes(void *buf, size_t n);

/* Overwrites n bytes at p with zeros in a way the compiler keeps (keys, before free). */
void zs_wipe(void *p, size_t n);

/* 1 if a and b (n bytes each) are equal, compared in constant time. */
int zs_bytes_equal(const void *a, const void *b, size_t n);

/* Overwrites the key (before freeing or leaving scope). */
void zs_secret_wipe(zs_secret *s);

/* Initialises libsodium once (thread-safe, cheap after the first call); ZS_ERR_INTERNAL if
 * it cannot (no entropy source). */
zs_err zs_sodium_init(void);

#endif
