/*
 * err: the one result type of zshard and the message that goes with it.
 *
 * Every library function that can fail returns a zs_err (ZS_OK is 0, failures are negative)
 * and records a human-readable message with zs_error(); the caller either handles it, adds
 * context with zs_error_context(), or passes the code up.  Only main() decides to exit.
 * Messages name the thing and the value: "shard 12: push of 4096 bytes, expected 8192".
 * The message buffer is per thread, so concurrent threads do not clobber each other.
 */
#ifndef ZS_ERR_H
#define ZS_ERR_H

/* C linkage from C++ too (the CUDA kernels' .cu files report errors through zs_error). */
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ZS_OK = 0,
    ZS_ERR_INVALID = -1,     /* a bad argument or value (config, CLI, API misuse) */
    ZS_ERR_IO = -2,          /* the operating system refused: open, read, write, socket */
    ZS_ERR_NOMEM = -3,       /* an allocation failed */
    ZS_ERR_FORMAT = -4,      /* a file or message is malformed or corrupt */
    ZS_ERR_NOTFOUND = -5,    /* a named thing (file, tensor, key) does not exist */
    ZS_ERR_INTERNAL = -6,    /* a broken invariant: a bug in zshard */
    ZS_ERR_UNSUPPORTED = -7, /* this backend, device or driver cannot do what was asked */
} zs_err;

/* Records the message (printf format) for this thread and returns code. */
zs_err zs_error(zs_err code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to this thread's message and returns code. */
zs_err zs_error_context(zs_err code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded by this thread ("" if none). */
const char *zs_last_error(void);

/* A short constant name for the code ("invalid", "io", ...). */
const char *zs_err_name(zs_err code);

/* Return the failure of call to our caller. */
#define ZS_CHECK(call)                                                                             \
    do {                                                                                           \
        zs_err zs_check_res_ = (call);                                                             \
        if (zs_check_res_ != ZS_OK)                                                                \
            return zs_check_res_;                                                                  \
    } while (0)

/* Store the result of call in res and jump to label on failure. */
#define ZS_CHECK_GOTO(call, res, label)                                                            \
    do {                                                                                           \
        (res) = (call);                                                                            \
        if ((res) != ZS_OK)                                                                        \
            goto label;                                                                            \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
