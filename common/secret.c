/*
 * secret: job secret files and the keys derived from them (common/secret.h).  libsodium does
 * the randomness, the hex coding and the hashing; this file adds the file's rules.
 */
#include "common/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"

#define SECRET_HEX (2 * ZS_SECRET_BYTES)
#define SECRET_FILE_MAX 256 /* bytes read at most: a longer file is refused, not truncated */

zs_err zs_sodium_init(void)
{
    if (sodium_init() < 0)
        return zs_error(ZS_ERR_INTERNAL, "libsodium cannot start (no source of randomness?)");
    return ZS_OK;
}

static void set_path(zs_secret *s, const char *path)
{
    snprintf(s->path, sizeof s->path, "%s", path);
}

zs_err zs_secret_generate(const char *path)
{
    if (!path || !*path)
        return zs_error(ZS_ERR_INVALID, "secret: no file name given");
    ZS_CHECK(zs_sodium_init());
    uint8_t key[ZS_SECRET_BYTES];
    char text[SECRET_HEX + 2];
    randombytes_buf(key, sizeof key);
    sodium_bin2hex(text, SECRET_HEX + 1, key, sizeof key);
    sodium_memzero(key, sizeof key);
    text[SECRET_HEX] = '\n';
    text[SECRET_HEX + 1] = '\0';

    /* O_EXCL: a secret in use is never replaced by accident; O_NOFOLLOW: nor written through a
     * link someone left at that name. */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        zs_err e = errno == EEXIST
                       ? zs_error(ZS_ERR_INVALID,
                                  "%s: exists; a secret file is never overwritten "
                                  "(remove it first if it should go)",
                                  path)
                       : zs_error(ZS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        sodium_memzero(text, sizeof text);
        return e;
    }
    zs_err res = ZS_OK;
    if (fchmod(fd, 0600) != 0)
        res = zs_error(ZS_ERR_IO, "%s: chmod 600: %s", path, strerror(errno));
    if (res == ZS_OK)
        res = zs_file_write_all(fd, path, text, SECRET_HEX + 1);
    if (res == ZS_OK && fsync(fd) != 0)
        res = zs_error(ZS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && res == ZS_OK)
        res = zs_error(ZS_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    sodium_memzero(text, sizeof text);
    if (res == ZS_OK)
        res = zs_file_sync_parent(path);
    if (res != ZS_OK)
        unlink(path);
    return res;
}

zs_err zs_secret_load(const char *path, zs_secret *out)
{
    memset(out, 0, sizeof *out);
    if (!path || !*path)
        return zs_error(ZS_ERR_INVALID, "secret: no file name given");
    ZS_CHECK(zs_sodium_init());
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO,
                        "secret file %s: cannot open: %s", path, strerror(errno));
    zs_err res = ZS_OK;
    char text[SECRET_FILE_MAX + 1];
    ssize_t n = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        res = zs_error(ZS_ERR_IO, "secret file %s: stat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        res = zs_error(ZS_ERR_INVALID, "secret file %s: not a regular file", path);
        goto out;
    }
    if (st.st_mode & 077) {
        res = zs_error(ZS_ERR_INVALID,
                       "secret file %s: mode %03o lets others than its owner read or change it; "
                       "run chmod 600 %s",
                       path, (unsigned)(st.st_mode & 0777), path);
        goto out;
    }
    for (ssize_t r; n < SECRET_FILE_MAX + 1; n += r) {
        r = read(fd, text + n, (size_t)(SECRET_FILE_MAX + 1 - n));
        if (r < 0 && errno == EINTR) {
            r = 0;
            continue;
        }
        if (r < 0) {
            res = zs_error(ZS_ERR_IO, "secret file %s: read: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
    }
    /* 64 hex digits, then at most white space (the newline keygen writes, or an editor's). */
    size_t len = (size_t)n;
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ' ||
                       text[len - 1] == '\t'))
        len--;
    size_t bin_len = 0;
    if (n > SECRET_FILE_MAX || len != SECRET_HEX ||
        sodium_hex2bin(out->key, sizeof out->key, text, len, NULL, &bin_len, NULL) != 0 ||
        bin_len != ZS_SECRET_BYTES) {
        res = zs_error(ZS_ERR_FORMAT,
                       "secret file %s: not a zshard secret (expected %d hex digits and a "
                       "newline; zshard keygen FILE writes one)",
                       path, SECRET_HEX);
        goto out;
    }
    set_path(out, path);
out:
    sodium_memzero(text, sizeof text);
    if (res != ZS_OK)
        zs_secret_wipe(out);
    close(fd);
    return res;
}

zs_err zs_secret_resolve(const char *path, int insecure, zs_secret *out)
{
    memset(out, 0, sizeof *out);
    if (path && insecure)
        return zs_error(ZS_ERR_INVALID, "both a secret file (%s) and --insecure given: choose one",
                        path);
    if (insecure) { /* explicit: it overrides ZS_SECRET_ENV */
        out->insecure = 1;
        return ZS_OK;
    }
    const char *env = getenv(ZS_SECRET_ENV);
    if (!path && env && *env)
        path = env;
    if (!path)
        return zs_error(ZS_ERR_INVALID,
                        "no job secret: give --secret FILE (or set %s; `zshard keygen FILE` "
                        "writes one), or --insecure to run without authentication",
                        ZS_SECRET_ENV);
    return zs_secret_load(path, out);
}

void zs_secret_derive(const zs_secret *s, const char *purpose, uint8_t out[32])
{
    crypto_generichash(out, 32, (const unsigned char *)purpose, strlen(purpose), s->key,
                       sizeof s->key);
}

void zs_token_of(const uint8_t data_key[ZS_TOKEN_BYTES], uint32_t member,
                 uint8_t token[ZS_TOKEN_BYTES])
{
    static const char label[] = "zshard/data/token";
    uint8_t msg[sizeof label + 4];
    memcpy(msg, label, sizeof label);
    for (int i = 0; i < 4; i++)
        msg[sizeof label + (size_t)i] = (uint8_t)(member >> (8 * i));
    crypto_generichash(token, ZS_TOKEN_BYTES, msg, sizeof msg, data_key, ZS_TOKEN_BYTES);
}

void zs_token_proof(const uint8_t token[ZS_TOKEN_BYTES], const char *side,
                    const uint8_t client_nonce[ZS_NONCE_BYTES],
                    const uint8_t server_nonce[ZS_NONCE_BYTES], uint32_t member,
                    uint8_t out[ZS_TOKEN_BYTES])
{
    crypto_generichash_state st;
    uint8_t id[4];
    for (int i = 0; i < 4; i++)
        id[i] = (uint8_t)(member >> (8 * i));
    crypto_generichash_init(&st, token, ZS_TOKEN_BYTES, ZS_TOKEN_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)"zshard/data/proof/", 18);
    crypto_generichash_update(&st, (const unsigned char *)side, strlen(side) + 1);
    crypto_generichash_update(&st, client_nonce, ZS_NONCE_BYTES);
    crypto_generichash_update(&st, server_nonce, ZS_NONCE_BYTES);
    crypto_generichash_update(&st, id, sizeof id);
    crypto_generichash_final(&st, out, ZS_TOKEN_BYTES);
}

void zs_random_bytes(void *buf, size_t n)
{
    randombytes_buf(buf, n);
}

void zs_wipe(void *p, size_t n)
{
    sodium_memzero(p, n);
}

int zs_bytes_equal(const void *a, const void *b, size_t n)
{
    return sodium_memcmp(a, b, n) == 0;
}

void zs_secret_wipe(zs_secret *s)
{
    sodium_memzero(s->key, sizeof s->key);
}
